-- Board WIP limits, edit-and-retry overrides, draining hosts, and the retention of lifecycle
-- events. Written only through the engine's store (`store::admission`, `store::operator`,
-- `store::retention`).

-- A project's limit on what occupies one board column (Projects v2 `Status`): the items whose
-- stored card is in it plus the admitted, unfinished runs that will move a card into it (a
-- `board_move` output to it). A run of such a workflow waits in the column's line
-- (`board:<project>:<column_key>`) while the column is full. `column_key` is the name
-- lowercased and trimmed, as `board_move` matches columns without regard to case.
CREATE TABLE board_limits (
    org_id       uuid NOT NULL REFERENCES orgs,
    project_id   uuid NOT NULL REFERENCES projects,
    column_key   text NOT NULL,
    column_name  text NOT NULL,
    wip_limit    integer NOT NULL CHECK (wip_limit BETWEEN 1 AND 100000),
    PRIMARY KEY (project_id, column_key)
);

-- The items of a project on a board column, as admission counts them.
CREATE INDEX items_by_board_column ON items (project_id, lower(data #>> '{board,column}'))
    WHERE data #>> '{board,column}' IS NOT NULL;

ALTER TABLE admission_waits DROP CONSTRAINT admission_waits_hold_check,
    ADD CONSTRAINT admission_waits_hold_check CHECK (hold IN ('paused', 'budget', 'lease', 'throttle', 'org_cap', 'board'));

-- Edit-and-retry: a crew node's prompt, model or harness replaced for every attempt of that
-- node in one run (a retry of that run inherits them).
CREATE TABLE run_node_overrides (
    org_id   uuid NOT NULL REFERENCES orgs,
    run_id   uuid NOT NULL REFERENCES runs ON DELETE CASCADE,
    node     text NOT NULL,
    prompt   text,
    model    text,
    harness  text CHECK (harness IN ('claude-code', 'codex', 'command')),
    set_by   text NOT NULL,
    set_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, node)
);

-- A drained host claims nothing new; the steps it holds run to their end.
ALTER TABLE hosts
    ADD COLUMN drained_at  timestamptz,
    ADD COLUMN drained_by  text;

-- Lifecycle events are kept 30 days (those of running runs until the run ends): the project's
-- retention sweep deletes them oldest first, a batch at a time.
CREATE INDEX run_events_by_age ON run_events (project_id, at);
