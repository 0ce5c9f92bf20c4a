-- The host protocol: what hosts claim and what their sessions report. Written only through the
-- engine's store (`store::hosts`).

-- A host claims ready crew steps of its project whose `requires` its capabilities satisfy,
-- oldest first. Without this index the claim would read every open step of the org.
CREATE INDEX steps_claimable ON steps (org_id, created_at, step_id) WHERE state = 'pending' AND kind = 'crew';

-- A host's held steps, counted against its `max_concurrent` slots at each claim and checked
-- when it asks which of them it should stop.
CREATE INDEX steps_by_holder ON steps (holder) WHERE state IN ('leased', 'running');

-- One row per crew step a host ran: the session's running totals, as its reports give them
-- (cumulative, so a report sent twice changes nothing), and the final figures at completion.
-- `cost_usd` is NULL while unknown: a harness killed before its result line has tokens but no
-- cost.
CREATE TABLE step_sessions (
    org_id          uuid NOT NULL REFERENCES orgs,
    run_id          uuid NOT NULL REFERENCES runs ON DELETE CASCADE,
    step_id         uuid PRIMARY KEY REFERENCES steps ON DELETE CASCADE,
    host_id         uuid NOT NULL REFERENCES hosts,
    harness         text,
    model           text,
    input_tokens    bigint NOT NULL DEFAULT 0,
    output_tokens   bigint NOT NULL DEFAULT 0,
    cost_usd        numeric(14, 6),
    turns           integer NOT NULL DEFAULT 0,
    tool_calls      integer NOT NULL DEFAULT 0,
    lines           bigint NOT NULL DEFAULT 0,
    started_at      timestamptz NOT NULL DEFAULT now(),
    last_report_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX step_sessions_by_run ON step_sessions (run_id);

-- Transcript bytes stored per run, against the per-run cap. `capped_at` is set when the cap
-- was reached (and a note written to the step's log); later lines are counted, not stored.
CREATE TABLE run_log_sizes (
    org_id     uuid NOT NULL REFERENCES orgs,
    run_id     uuid PRIMARY KEY REFERENCES runs ON DELETE CASCADE,
    bytes      bigint NOT NULL DEFAULT 0,
    dropped    bigint NOT NULL DEFAULT 0,
    capped_at  timestamptz
);

-- A registration token registers one host and is revoked by that registration; the host
-- remembers which token made it (audit trail; a token can never make two hosts).
ALTER TABLE hosts ADD COLUMN registered_with uuid UNIQUE;
