-- The REST API's own state: idempotency keys for create-POSTs, and the indexes its lists and
-- filters use. Written only through the engine's store (`store::api_writes`).

-- A create-POST with an `Idempotency-Key` records its answer here in the transaction that
-- made the change, so the same key with the same request gets the same answer, and the same
-- key with another request is refused. Keys are scoped to an org and kept for a day.
CREATE TABLE idempotency_keys (
    org_id        uuid NOT NULL REFERENCES orgs,
    key           text NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    -- SHA-256 of the method, the path and the canonical request body.
    request_hash  text NOT NULL,
    -- Filled in the same transaction, once the change is made.
    status        integer,
    response      jsonb,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, key)
);
CREATE INDEX idempotency_keys_by_time ON idempotency_keys (created_at);

-- Run lists filtered by workflow, newest first (keyset on created_at, run_id).
CREATE INDEX runs_by_project_workflow ON runs (org_id, project_id, workflow_id, created_at DESC, run_id);
-- Audit log filtered by action or actor, newest first (keyset on at, audit_id).
CREATE INDEX audit_by_action ON audit_log (org_id, action, at DESC, audit_id);
CREATE INDEX audit_by_actor ON audit_log (org_id, actor_id, at DESC, audit_id);
-- Members listed per org, tokens per user.
CREATE INDEX api_tokens_by_user ON api_tokens (org_id, user_id, created_at DESC, jti);
