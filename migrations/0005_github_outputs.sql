-- GitHub effects: what gate and wait steps watch on GitHub, what output steps did there, and
-- workflow schedules. Written only through the engine's store (`store::github`).

-- A gate with `checks:` or a `wait: { event: … }` step waits (state `waiting`) on GitHub. The
-- webhook that can decide it (a check run or status on the watched commit, an event on the
-- watched pull request) writes a wake for the step in its own transaction: nothing polls.
-- One row per waiting step; removed with the step's resolution.
CREATE TABLE github_watches (
    org_id      uuid NOT NULL REFERENCES orgs,
    project_id  uuid NOT NULL REFERENCES projects,
    step_id     uuid PRIMARY KEY REFERENCES steps ON DELETE CASCADE,
    run_id      uuid NOT NULL REFERENCES runs ON DELETE CASCADE,
    -- owner/name, lowercased.
    repository  text NOT NULL CHECK (repository = lower(repository)),
    -- The pull request (or issue) watched; a gate follows its head commit.
    number      bigint,
    -- The commit whose checks a gate reads (moved by a push to the pull request's branch).
    head_sha    text,
    -- `checks` (a gate) or the event a wait waits for, such as `pull_request.closed`.
    watch       text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX github_watches_by_item ON github_watches (project_id, repository, number);
CREATE INDEX github_watches_by_sha ON github_watches (project_id, repository, head_sha) WHERE head_sha IS NOT NULL;

-- A workflow with `on.schedule` owns one row: its next tick is the durable wake of the
-- schedule (engines set their timer to the earliest `next_at` with the wakes' and claim due
-- rows with SKIP LOCKED). After downtime only the latest missed tick fires.
CREATE TABLE schedules (
    org_id        uuid NOT NULL REFERENCES orgs,
    project_id    uuid NOT NULL REFERENCES projects,
    workflow_id   uuid PRIMARY KEY REFERENCES workflows,
    cron          text NOT NULL,
    tz            text NOT NULL DEFAULT 'UTC',
    next_at       timestamptz NOT NULL,
    last_tick_at  timestamptz,
    updated_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX schedules_due ON schedules (next_at);
