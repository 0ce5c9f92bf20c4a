-- Intervene: a person's message to a live crew session (`POST …/steps/{step}/messages`). The
-- host that holds the step receives the undelivered ones in the answers to its heartbeats and
-- session reports, writes each to the harness's standard input (Claude Code with
-- `--input-format stream-json`), and acknowledges it: `delivered_at` is set only then.
CREATE TABLE step_messages (
    org_id        uuid NOT NULL REFERENCES orgs,
    run_id        uuid NOT NULL REFERENCES runs ON DELETE CASCADE,
    step_id       uuid NOT NULL REFERENCES steps ON DELETE CASCADE,
    message_id    uuid PRIMARY KEY,
    text          text NOT NULL CHECK (length(text) BETWEEN 1 AND 20000),
    -- `user:<id>` or `token:<jti>`: who sent it.
    sent_by       text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    delivered_at  timestamptz
);
-- What a host's heartbeat reads: a step's undelivered messages, oldest first.
CREATE INDEX step_messages_pending ON step_messages (step_id, created_at) WHERE delivered_at IS NULL;
CREATE INDEX step_messages_by_run ON step_messages (run_id);

-- The tenancy wall of 0016 for this table too (its default privileges granted the role).
ALTER TABLE step_messages ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant ON step_messages USING (org_id = shopfloor_org()) WITH CHECK (org_id = shopfloor_org());
