-- Admission, budgets, outgoing webhooks and retention: what keeps a factory safe to leave
-- running. Written only through the engine's store (`store::admission`, `store::budgets`,
-- `store::webhooks_out`, `store::retention`).

-- A run is admitted once, before its first step: at submit, or by the engine in the change that
-- starts its first step (a throttled workflow, a run released from a queue). Runs of an older
-- release that are already running were admitted by it. `spent_*` sum the cost its sessions
-- reported, against `budget.usd_per_run`.
ALTER TABLE runs
    ADD COLUMN admitted_at   timestamptz,
    ADD COLUMN spent_usd     numeric(14, 6) NOT NULL DEFAULT 0,
    ADD COLUMN spent_tokens  bigint NOT NULL DEFAULT 0;
UPDATE runs SET admitted_at = coalesce(started_at, created_at) WHERE status = 'running';

-- One row per admission queue of an org: `org` (the org's cap on running runs),
-- `group:<project>:<workflow>:<group>` (a concurrency group), `throttle:<workflow>`,
-- `budget`, `paused:<workflow>` and `paused:project:<project>` (gates). A change that admits
-- a run, or puts one in line, locks the row FOR UPDATE; a change that frees room (a run
-- ending) locks it FOR SHARE and reads `waiting` from the row it locked, so the two are
-- ordered and no release is lost, while finishing runs do not wait on each other.
CREATE TABLE admission_queues (
    org_id     uuid NOT NULL REFERENCES orgs,
    queue      text NOT NULL,
    -- Leases at once (a group's limit, the org's cap) or starts per window (a throttle);
    -- NULL for a gate, which lets everyone through once open.
    cap        integer CHECK (cap > 0),
    -- A throttle's window.
    window_ms  bigint CHECK (window_ms > 0),
    -- Runs in line (rows of admission_waits), kept under the row's lock.
    waiting    integer NOT NULL DEFAULT 0 CHECK (waiting >= 0),
    PRIMARY KEY (org_id, queue)
);

-- A run held back, in line in one queue. Its place is `seq`; only the head of a capacity
-- queue may take room that frees, so runs are released in the order they arrived.
CREATE TABLE admission_waits (
    org_id      uuid NOT NULL,
    project_id  uuid NOT NULL REFERENCES projects,
    run_id      uuid PRIMARY KEY REFERENCES runs ON DELETE CASCADE,
    queue       text NOT NULL,
    hold        text NOT NULL CHECK (hold IN ('paused', 'budget', 'lease', 'throttle', 'org_cap')),
    -- What the console names: the group, the budget's scope, the paused workflow.
    detail      text NOT NULL DEFAULT '',
    seq         bigint GENERATED ALWAYS AS IDENTITY,
    since       timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (org_id, queue) REFERENCES admission_queues
);
CREATE INDEX admission_waits_line ON admission_waits (org_id, queue, seq);
-- Every org has the queue of its cap from the start: a run that ends locks it to hand its room
-- to the runs in line, and a row created later could not be locked by an end already running.
INSERT INTO admission_queues (org_id, queue, cap) SELECT org_id, 'org', running_cap FROM orgs;

-- The org's cap is a lease (`group_key = 'org'`) counted across the org's projects.
CREATE INDEX concurrency_by_org_group ON concurrency_leases (org_id, group_key);
INSERT INTO concurrency_leases (org_id, project_id, group_key, run_id)
    SELECT org_id, project_id, 'org', run_id FROM runs
    WHERE status = 'running' AND parent_run_id IS NULL AND NOT dry_run
    ON CONFLICT DO NOTHING;

-- A throttle counts the runs admitted in its window. Old starts are pruned by the admissions
-- that read them; a start outlives its run (the window still counts it).
CREATE TABLE admission_starts (
    org_id  uuid NOT NULL REFERENCES orgs,
    queue   text NOT NULL,
    at      timestamptz NOT NULL DEFAULT now(),
    run_id  uuid NOT NULL,
    PRIMARY KEY (org_id, queue, at, run_id)
);

-- A paused project holds new runs of all its workflows; finished runs are kept
-- `retention_days` after they end.
ALTER TABLE projects
    ADD COLUMN paused          boolean NOT NULL DEFAULT false,
    ADD COLUMN retention_days  integer NOT NULL DEFAULT 90 CHECK (retention_days BETWEEN 1 AND 3650);

-- Spend is summed per org (all projects) and per project over a UTC day or month: both read
-- `spend` by org and day.
CREATE INDEX spend_by_org_day ON spend (org_id, day);

-- Work of the engines that belongs to no run: an outgoing webhook delivery (`subject` is the
-- delivery), a project's retention sweep (`subject` is the project). Like a wake, a job is
-- due at `due_at`; an engine claims it by moving `due_at` a lease ahead (so a job whose engine
-- died comes due again), does the work outside any transaction, then reschedules or deletes
-- it. One job per subject.
CREATE TABLE jobs (
    org_id   uuid NOT NULL REFERENCES orgs,
    job_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind     text NOT NULL CHECK (kind IN ('webhook', 'retention')),
    subject  uuid NOT NULL,
    due_at   timestamptz NOT NULL,
    UNIQUE (kind, subject)
);
CREATE INDEX jobs_due ON jobs (due_at);

-- Every project has its retention sweep; the first is due one retention period from now
-- (nothing can be older before then), and each sweep sets the next.
INSERT INTO jobs (org_id, kind, subject, due_at)
    SELECT org_id, 'retention', project_id, now() + make_interval(days => retention_days) FROM projects;

-- Outgoing webhooks: per project, a URL, a secret (HMAC-SHA256 of the body signs each
-- delivery) and event filters (`run.*`, `run.completed`, `step.failed`, `*`).
CREATE TABLE webhook_subscriptions (
    org_id           uuid NOT NULL REFERENCES orgs,
    project_id       uuid NOT NULL REFERENCES projects,
    subscription_id  uuid PRIMARY KEY,
    url              text NOT NULL CHECK (url ~ '^https?://'),
    secret           text NOT NULL,
    events           text[] NOT NULL CHECK (cardinality(events) > 0),
    created_by       text NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_subscriptions_by_project ON webhook_subscriptions (project_id);

-- One delivery per event and subscription, written in the change that writes the event. Its
-- body is rendered from the event at the first attempt and kept (a replay sends the same body
-- again, as a new delivery). Kept 7 days.
CREATE TABLE webhook_deliveries (
    org_id           uuid NOT NULL REFERENCES orgs,
    project_id       uuid NOT NULL REFERENCES projects,
    delivery_id      uuid PRIMARY KEY,
    subscription_id  uuid NOT NULL REFERENCES webhook_subscriptions ON DELETE CASCADE,
    event            text NOT NULL,
    run_id           uuid,
    event_id         bigint,
    body             jsonb,
    -- pending (due, or waiting for its retry) | delivered | failed (attempts exhausted)
    state            text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts         integer NOT NULL DEFAULT 0,
    last_status      integer,
    last_error       text,
    next_at          timestamptz,
    replay_of        uuid,
    created_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz
);
CREATE INDEX webhook_deliveries_by_subscription ON webhook_deliveries (subscription_id, created_at DESC, delivery_id);
CREATE INDEX webhook_deliveries_by_age ON webhook_deliveries (project_id, created_at);

-- The delivery log: each attempt with the receiver's answer (status, the first 1000
-- characters of its body) or the error that kept it from answering.
CREATE TABLE webhook_attempts (
    org_id       uuid NOT NULL REFERENCES orgs,
    delivery_id  uuid NOT NULL REFERENCES webhook_deliveries ON DELETE CASCADE,
    attempt      integer NOT NULL,
    at           timestamptz NOT NULL DEFAULT now(),
    status       integer,
    response     text,
    error        text,
    duration_ms  integer NOT NULL,
    PRIMARY KEY (delivery_id, attempt)
);

-- Retention deletes finished runs by age, oldest first, a batch at a time.
CREATE INDEX runs_finished_by_project ON runs (project_id, ended_at) WHERE status <> 'running';

-- Trigger events refused by a concurrency group's `skip` policy, or by a full org queue.
ALTER TABLE trigger_events DROP CONSTRAINT trigger_events_status_check,
    ADD CONSTRAINT trigger_events_status_check
        CHECK (status IN ('accepted', 'queued', 'started', 'superseded', 'revoked', 'blocked', 'skipped'));
