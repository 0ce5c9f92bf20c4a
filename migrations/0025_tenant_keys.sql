-- A row that names a project names that project's org. Until now each such table checked
-- `org_id` against orgs and `project_id` against projects apart, which let a row pair one
-- org with another org's project. One key on both columns, to projects, proves the pair (and
-- the org through projects' own key): a stronger rule, and one check fewer on every insert,
-- which the webhook path pays six times a delivery that opens a run (make bench).
-- Tables whose project is optional (api_tokens, budgets) keep their org key: a pair with a
-- null project would not be checked at all. An item's cycle budget was optional only because
-- 0004 added the column to existing rows: it is its item's project.
UPDATE item_cycle_budgets b SET project_id = i.project_id FROM items i WHERE i.item_id = b.item_id AND b.project_id IS NULL;
ALTER TABLE item_cycle_budgets ALTER COLUMN project_id SET NOT NULL;

ALTER TABLE projects ADD CONSTRAINT projects_project_id_org_id_key UNIQUE (project_id, org_id);

DO $$
DECLARE
    t text;
    c record;
BEGIN
    FOREACH t IN ARRAY ARRAY['hosts', 'repositories', 'workflows', 'items', 'trigger_events', 'runs',
                             'concurrency_leases', 'spend', 'github_checks', 'github_watches', 'schedules',
                             'webhook_subscriptions', 'webhook_deliveries', 'board_limits', 'run_events', 'admission_waits',
                             'item_cycle_budgets'] LOOP
        FOR c IN
            SELECT conname, confdeltype FROM pg_constraint
            WHERE conrelid = t::regclass AND contype = 'f' AND conparentid = 0
              AND ((confrelid = 'orgs'::regclass AND conkey = ARRAY[(SELECT attnum FROM pg_attribute WHERE attrelid = t::regclass AND attname = 'org_id')])
                OR (confrelid = 'projects'::regclass AND conkey = ARRAY[(SELECT attnum FROM pg_attribute WHERE attrelid = t::regclass AND attname = 'project_id')]))
        LOOP
            -- Every key replaced here refuses a delete; a cascading one would need its own thought.
            IF c.confdeltype <> 'a' THEN
                RAISE EXCEPTION '%.%: expected a plain foreign key', t, c.conname;
            END IF;
            EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', t, c.conname);
        END LOOP;
        EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I FOREIGN KEY (project_id, org_id) REFERENCES projects (project_id, org_id)',
                       t, t || '_project_org_fkey');
    END LOOP;
END
$$;

-- A run's workflow version names its workflow (workflow_versions' own key), so the run's key
-- to workflows proved nothing more.
ALTER TABLE runs DROP CONSTRAINT runs_workflow_id_fkey;
