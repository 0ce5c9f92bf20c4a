-- How many times advancing a run failed on its own (store::engine_errors): its wakes come back
-- with a backoff, and at the limit it fails `engine_error`.
ALTER TABLE runs ADD COLUMN engine_errors integer NOT NULL DEFAULT 0;
