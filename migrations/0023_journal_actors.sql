-- Each run event names who made it (`kind:id`, as `Actor::label` prints it), and the engine's
-- own moves of steps and runs are no longer copied into `audit_log`: the audit log keeps every
-- action of people, tokens, hosts, GitHub and the system, and the audit view reads the
-- engine's moves from the journal through this index (`http::audit`). Events written before
-- this migration have no actor; their audit entries are where they were.
ALTER TABLE run_events ADD COLUMN actor text;
CREATE INDEX run_events_engine_moves ON run_events (org_id, at DESC, event_id DESC) WHERE actor LIKE 'engine:%';
