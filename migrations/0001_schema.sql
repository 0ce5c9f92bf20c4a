-- shopfloor's schema: the whole data model of DESIGN.md.
--
-- Every tenant table carries org_id, and every key that names a row of a tenant also names its
-- org, so a query that forgets the org cannot find another tenant's row by id alone.
-- Writes to runs, steps, step_logs, run_events, audit_log, wakes and approvals go through
-- the engine's store module only (the one write path).

CREATE TABLE orgs (
    org_id       uuid PRIMARY KEY,
    slug         text NOT NULL UNIQUE CHECK (slug ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    name         text NOT NULL,
    -- Runs with status running beyond this are queued (admission).
    running_cap  integer NOT NULL DEFAULT 50 CHECK (running_cap > 0),
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE users (
    org_id        uuid NOT NULL REFERENCES orgs,
    user_id       uuid PRIMARY KEY,
    email         text NOT NULL,
    github_login  text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (org_id, email)
);

CREATE TABLE memberships (
    org_id      uuid NOT NULL REFERENCES orgs,
    user_id     uuid NOT NULL REFERENCES users,
    role        text NOT NULL CHECK (role IN ('owner', 'admin', 'member', 'viewer')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, user_id)
);

-- Service-wide JWT signing keys. Not tenant data: a key signs tokens of every org. A retired
-- key is kept until the last token it signed has expired, so rotation never logs anyone out.
CREATE TABLE signing_keys (
    kid          text PRIMARY KEY,
    secret       bytea NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    retired_at   timestamptz
);

CREATE TABLE projects (
    org_id      uuid NOT NULL REFERENCES orgs,
    project_id  uuid PRIMARY KEY,
    slug        text NOT NULL CHECK (slug ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    name        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (org_id, slug)
);

CREATE TABLE hosts (
    org_id          uuid NOT NULL REFERENCES orgs,
    project_id      uuid NOT NULL REFERENCES projects,
    host_id         uuid PRIMARY KEY,
    name            text NOT NULL,
    capabilities    text[] NOT NULL DEFAULT '{}',
    max_concurrent  integer NOT NULL DEFAULT 1 CHECK (max_concurrent > 0),
    last_seen_at    timestamptz,
    deregistered_at timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX hosts_by_project ON hosts (org_id, project_id) WHERE deregistered_at IS NULL;

CREATE TABLE api_tokens (
    org_id      uuid NOT NULL REFERENCES orgs,
    jti         uuid PRIMARY KEY,
    -- user: a person's token; host: a host credential; registration: registers one host.
    kind        text NOT NULL CHECK (kind IN ('user', 'host', 'registration')),
    user_id     uuid REFERENCES users,
    host_id     uuid REFERENCES hosts,
    project_id  uuid REFERENCES projects,
    role        text NOT NULL CHECK (role IN ('owner', 'admin', 'member', 'viewer', 'host')),
    name        text NOT NULL,
    kid         text NOT NULL REFERENCES signing_keys,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    revoked_at  timestamptz,
    last_used_at timestamptz
);
CREATE INDEX api_tokens_by_org ON api_tokens (org_id, created_at DESC, jti);

CREATE TABLE github_installations (
    org_id           uuid NOT NULL REFERENCES orgs,
    installation_id  bigint PRIMARY KEY,
    account_login    text NOT NULL,
    suspended_at     timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE repositories (
    org_id           uuid NOT NULL REFERENCES orgs,
    project_id       uuid NOT NULL REFERENCES projects,
    repository_id    uuid PRIMARY KEY,
    -- owner/name, lowercased.
    full_name        text NOT NULL CHECK (full_name = lower(full_name)),
    github_id        bigint,
    installation_id  bigint REFERENCES github_installations,
    default_branch   text NOT NULL DEFAULT 'main',
    created_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (project_id, full_name)
);
CREATE INDEX repositories_by_name ON repositories (full_name);

CREATE TABLE github_deliveries (
    org_id       uuid NOT NULL REFERENCES orgs,
    delivery_id  text PRIMARY KEY,
    event        text NOT NULL,
    action       text,
    outcome      text NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX github_deliveries_by_time ON github_deliveries (received_at);

CREATE TABLE workflows (
    org_id          uuid NOT NULL REFERENCES orgs,
    project_id      uuid NOT NULL REFERENCES projects,
    workflow_id     uuid PRIMARY KEY,
    name            text NOT NULL,
    latest_version  integer NOT NULL DEFAULT 0,
    paused          boolean NOT NULL DEFAULT false,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (project_id, name)
);

-- Versions are immutable: rows are inserted, never updated. A run pins one.
CREATE TABLE workflow_versions (
    org_id       uuid NOT NULL REFERENCES orgs,
    workflow_id  uuid NOT NULL REFERENCES workflows,
    version      integer NOT NULL CHECK (version > 0),
    source       text NOT NULL,
    sha256       text NOT NULL,
    created_by   text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_id, version)
);

CREATE TABLE items (
    org_id      uuid NOT NULL REFERENCES orgs,
    project_id  uuid NOT NULL REFERENCES projects,
    item_id     uuid PRIMARY KEY,
    -- ["github","owner/name",number] or ["github","owner/name"], as canonical JSON text.
    key         text NOT NULL,
    title       text,
    state       text,
    data        jsonb NOT NULL DEFAULT '{}',
    -- Incremented by a cycle-budget reset; part of dedup keys once above zero.
    generation  integer NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (project_id, key)
);

CREATE TABLE trigger_events (
    org_id       uuid NOT NULL REFERENCES orgs,
    project_id   uuid NOT NULL REFERENCES projects,
    event_id     uuid PRIMARY KEY,
    workflow_id  uuid NOT NULL REFERENCES workflows,
    item_id      uuid REFERENCES items,
    -- Kept forever: the same workflow never acts twice on the same item content.
    dedup_key    text NOT NULL,
    source       text NOT NULL CHECK (source IN ('github', 'schedule', 'manual')),
    payload      jsonb NOT NULL DEFAULT '{}',
    status       text NOT NULL DEFAULT 'accepted'
                 CHECK (status IN ('accepted', 'queued', 'started', 'superseded', 'revoked', 'blocked')),
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (org_id, dedup_key)
);

CREATE TABLE runs (
    org_id            uuid NOT NULL REFERENCES orgs,
    project_id        uuid NOT NULL REFERENCES projects,
    run_id            uuid PRIMARY KEY,
    workflow_id       uuid NOT NULL REFERENCES workflows,
    workflow_version  integer NOT NULL,
    item_id           uuid REFERENCES items,
    trigger_event_id  uuid REFERENCES trigger_events,
    parent_run_id     uuid REFERENCES runs,
    parent_step_id    uuid,
    -- The run this one reruns or retries, with the node it starts from (rerun from a node).
    source_run_id     uuid REFERENCES runs,
    source_from_node  text,
    status            text NOT NULL DEFAULT 'running'
                      CHECK (status IN ('running', 'completed', 'failed', 'cancelled')),
    reason            text CHECK (length(reason) <= 500),
    -- A workflow with `approval: required` parks the run until a person approves it.
    needs_approval    boolean NOT NULL DEFAULT false,
    input             jsonb NOT NULL DEFAULT '{}',
    dry_run           boolean NOT NULL DEFAULT false,
    trace_id          text,
    created_by        text NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    ended_at          timestamptz,
    FOREIGN KEY (workflow_id, workflow_version) REFERENCES workflow_versions (workflow_id, version)
);
CREATE INDEX runs_by_project_status ON runs (org_id, project_id, status, created_at DESC, run_id);
CREATE INDEX runs_by_project ON runs (org_id, project_id, created_at DESC, run_id);
CREATE INDEX runs_by_item ON runs (item_id, workflow_id) WHERE status = 'running';
CREATE INDEX runs_by_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;
CREATE INDEX runs_dry_ended ON runs (ended_at) WHERE dry_run;
ALTER TABLE runs SET (autovacuum_vacuum_scale_factor = 0.05);

CREATE TABLE steps (
    org_id            uuid NOT NULL REFERENCES orgs,
    run_id            uuid NOT NULL REFERENCES runs ON DELETE CASCADE,
    step_id           uuid PRIMARY KEY,
    node              text NOT NULL,
    kind              text NOT NULL,
    -- A loop back to the node makes a new visit; a retry a new attempt of the same visit.
    visit             integer NOT NULL CHECK (visit > 0),
    attempt           integer NOT NULL CHECK (attempt > 0),
    state             text NOT NULL DEFAULT 'pending'
                      CHECK (state IN ('pending', 'leased', 'running', 'waiting', 'succeeded', 'failed', 'cancelled')),
    reason            text CHECK (length(reason) <= 500),
    -- ordinary | infrastructure | final: whether a failure may be retried.
    failure_class     text CHECK (failure_class IN ('ordinary', 'infrastructure', 'final')),
    exit_code         integer,
    -- Capabilities a host needs; empty for steps the engine runs itself.
    requires          text[] NOT NULL DEFAULT '{}',
    -- Who holds the lease: 'engine:<id>' or 'host:<id>'.
    holder            text,
    lease_expires_at  timestamptz,
    not_before        timestamptz,
    output            jsonb,
    timed_out         boolean NOT NULL DEFAULT false,
    -- Reused from an earlier run by rerun-from; never executed in this run.
    reused_from       uuid,
    started_seq       bigint NOT NULL,
    finished_seq      bigint,
    created_at        timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    ended_at          timestamptz,
    UNIQUE (run_id, node, visit, attempt)
);
CREATE INDEX steps_by_run ON steps (run_id, started_seq);
CREATE INDEX steps_open ON steps (org_id, state) WHERE state IN ('pending', 'leased', 'running', 'waiting');
ALTER TABLE steps SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);

CREATE TABLE step_logs (
    org_id   uuid NOT NULL REFERENCES orgs,
    run_id   uuid NOT NULL REFERENCES runs ON DELETE CASCADE,
    step_id  uuid NOT NULL REFERENCES steps ON DELETE CASCADE,
    seq      bigint NOT NULL,
    at       timestamptz NOT NULL DEFAULT now(),
    stream   text NOT NULL,
    line     text NOT NULL,
    PRIMARY KEY (step_id, seq)
);

CREATE TABLE run_events (
    org_id      uuid NOT NULL REFERENCES orgs,
    project_id  uuid NOT NULL REFERENCES projects,
    run_id      uuid NOT NULL REFERENCES runs ON DELETE CASCADE,
    -- Gapless per run: taken as max(seq) + 1 under the run's row lock.
    seq         bigint NOT NULL,
    -- Unique across runs. Readers of a project's stream order by (xid, event_id) and read only
    -- below the oldest running transaction (pg_snapshot_xmin), so no event can appear later
    -- behind a reader's position (Last-Event-ID).
    event_id    bigint GENERATED ALWAYS AS IDENTITY,
    xid         xid8 NOT NULL DEFAULT pg_current_xact_id(),
    at          timestamptz NOT NULL DEFAULT now(),
    kind        text NOT NULL,
    step_id     uuid,
    node        text,
    attrs       jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (run_id, seq)
);
CREATE INDEX run_events_by_project ON run_events (org_id, project_id, xid, event_id);
CREATE INDEX run_events_by_xid ON run_events (xid, event_id);

CREATE TABLE audit_log (
    org_id       uuid NOT NULL REFERENCES orgs,
    audit_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project_id   uuid,
    at           timestamptz NOT NULL DEFAULT now(),
    actor_kind   text NOT NULL CHECK (actor_kind IN ('user', 'token', 'host', 'engine', 'github', 'system')),
    actor_id     text NOT NULL,
    action       text NOT NULL,
    target_kind  text NOT NULL,
    target_id    text NOT NULL,
    detail       jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_by_org ON audit_log (org_id, at DESC, audit_id);
CREATE INDEX audit_by_target ON audit_log (org_id, target_kind, target_id);

-- "Look at this run (or step) at or after due_at". Deleted when claimed.
CREATE TABLE wakes (
    org_id   uuid NOT NULL REFERENCES orgs,
    wake_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id   uuid NOT NULL REFERENCES runs ON DELETE CASCADE,
    step_id  uuid REFERENCES steps ON DELETE CASCADE,
    due_at   timestamptz NOT NULL,
    -- advance | execute | lease_expiry | timeout
    reason   text NOT NULL
);
CREATE INDEX wakes_due ON wakes (due_at);
CREATE INDEX wakes_by_step ON wakes (step_id) WHERE step_id IS NOT NULL;
CREATE INDEX wakes_by_run ON wakes (run_id);
ALTER TABLE wakes SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);

CREATE TABLE approvals (
    org_id      uuid NOT NULL REFERENCES orgs,
    step_id     uuid PRIMARY KEY REFERENCES steps ON DELETE CASCADE,
    run_id      uuid NOT NULL REFERENCES runs ON DELETE CASCADE,
    node        text NOT NULL,
    prompt      text NOT NULL,
    fields      jsonb NOT NULL DEFAULT '{}',
    deadline    timestamptz,
    decision    text CHECK (decision IN ('approved', 'rejected', 'timed_out')),
    answer      jsonb,
    decided_by  text,
    decided_at  timestamptz
);
CREATE INDEX approvals_open ON approvals (org_id) WHERE decision IS NULL;

CREATE TABLE concurrency_leases (
    org_id      uuid NOT NULL REFERENCES orgs,
    project_id  uuid NOT NULL REFERENCES projects,
    group_key   text NOT NULL,
    run_id      uuid NOT NULL REFERENCES runs ON DELETE CASCADE,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, group_key)
);
CREATE INDEX concurrency_by_group ON concurrency_leases (org_id, project_id, group_key);

CREATE TABLE budgets (
    org_id      uuid NOT NULL REFERENCES orgs,
    budget_id   uuid PRIMARY KEY,
    -- NULL: the org's budget.
    project_id  uuid REFERENCES projects,
    period      text NOT NULL CHECK (period IN ('day', 'month')),
    usd_limit   numeric(12, 4) NOT NULL CHECK (usd_limit >= 0),
    hard        boolean NOT NULL DEFAULT true,
    UNIQUE NULLS NOT DISTINCT (org_id, project_id, period)
);

CREATE TABLE spend (
    org_id      uuid NOT NULL REFERENCES orgs,
    project_id  uuid NOT NULL REFERENCES projects,
    day         date NOT NULL,
    usd         numeric(14, 6) NOT NULL DEFAULT 0,
    tokens      bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (org_id, project_id, day)
);

CREATE TABLE item_cycle_budgets (
    org_id       uuid NOT NULL REFERENCES orgs,
    item_id      uuid NOT NULL REFERENCES items,
    workflow_id  uuid NOT NULL REFERENCES workflows,
    generation   integer NOT NULL DEFAULT 0,
    cycles_used  integer NOT NULL DEFAULT 0,
    asked_at     timestamptz,
    PRIMARY KEY (item_id, workflow_id)
);
