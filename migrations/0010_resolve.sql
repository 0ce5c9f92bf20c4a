-- An operator resolves a failed run: it is marked handled (it leaves "failures to resolve")
-- without changing its status. Written only through the engine's store (`store::runs::resolve`).
ALTER TABLE runs
    ADD COLUMN resolved_at  timestamptz,
    ADD COLUMN resolved_by  text;
