-- The run lifecycle's needs: approvals a finished run withdraws, the indexes that reading a
-- run's approvals and deleting a finished run use (checked with EXPLAIN), and references
-- between runs that let a finished run be deleted while other runs still name it.

-- A run that ends withdraws the approvals it still waited for, so no one is asked to answer
-- them any more (they leave the partial index `approvals_open`).
ALTER TABLE approvals DROP CONSTRAINT approvals_decision_check,
    ADD CONSTRAINT approvals_decision_check
        CHECK (decision IN ('approved', 'rejected', 'timed_out', 'withdrawn'));

-- Approving finds a run's open approval by (run_id, node); deleting a run cascades to its
-- approvals by run_id. Without this index both read the whole table.
CREATE INDEX approvals_by_run ON approvals (run_id, node);

-- Deleting a run cascades to its step logs by run_id; their key starts with step_id.
CREATE INDEX step_logs_by_run ON step_logs (run_id);

-- A rerun names its source run. Deleting the source (a dry run a day after it ends, or
-- retention) must find its reruns without reading every run, and must not fail because they
-- exist: the rerun keeps its own history and forgets where it came from. The same holds for
-- a child run whose parent is deleted first (a dry run and its dry children can be deleted
-- in one batch, parent first).
CREATE INDEX runs_by_source ON runs (source_run_id) WHERE source_run_id IS NOT NULL;
ALTER TABLE runs DROP CONSTRAINT runs_source_run_id_fkey,
    ADD CONSTRAINT runs_source_run_id_fkey
        FOREIGN KEY (source_run_id) REFERENCES runs ON DELETE SET NULL;
ALTER TABLE runs DROP CONSTRAINT runs_parent_run_id_fkey,
    ADD CONSTRAINT runs_parent_run_id_fkey
        FOREIGN KEY (parent_run_id) REFERENCES runs ON DELETE SET NULL;
