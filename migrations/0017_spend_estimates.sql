-- Spend known while it is spent (issue 16). Claude Code prints its cost only on its result
-- line and Codex never does, so hosts estimate each session's cost from its messages' token
-- counts and a price table, and the server counts the larger of that estimate and the
-- reported cost against budgets until the reported cost replaces it.
--
-- `estimated_cost_usd`: the host's latest estimate; `estimate_basis`: `price_table`, or
-- `unknown_model` when a model was priced at the table's dearest row; `output_tokens_lower_bound`:
-- no result line counted the output tokens (the session runs, or was killed); `spent_usd`:
-- what the spend tables (`spend`, `runs.spent_usd`) hold for this session, from which the next
-- report's difference is taken. NULL in rows written before this migration, whose spend was
-- their reported cost: readers take `coalesce(spent_usd, cost_usd, 0)` (so no rewrite of the
-- table).
ALTER TABLE step_sessions
    ADD COLUMN estimated_cost_usd        numeric(14, 6),
    ADD COLUMN estimate_basis            text,
    ADD COLUMN output_tokens_lower_bound boolean NOT NULL DEFAULT false,
    ADD COLUMN spent_usd                 numeric(14, 6);
