-- Run events are the hottest insert of every change; a B-tree on (project_id, at) for the
-- 30-day sweep cost every insert an index entry. Events are appended in time order, so a BRIN
-- summary of `at` finds the old ones at a fraction of the cost. The sweep filters the
-- project itself, and finds the next event to come of age through `run_events_by_project`.
DROP INDEX run_events_by_age;
CREATE INDEX run_events_by_age ON run_events USING brin (at);
