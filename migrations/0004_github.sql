-- GitHub ingest: deliveries, the item projection's lookups, trigger events with their claim,
-- cycle-budget asks, and the check results gates will read. Written only through the engine's
-- store (`store::triggers`).

-- A delivery is stored even when it names no connected repository (GitHub sends the App every
-- event of every installation, and one not yet connected still has to be recorded as received
-- and answered 202). Such a delivery belongs to no tenant, so its org is NULL; it holds no
-- payload, only the event name, action, installation and repository it named. Every query of a
-- tenant's deliveries filters on org_id = $org, which never matches NULL, so the exception
-- cannot leak one tenant's deliveries to another.
ALTER TABLE github_deliveries ALTER COLUMN org_id DROP NOT NULL;
ALTER TABLE github_deliveries
    ADD COLUMN installation_id bigint,
    ADD COLUMN repository      text,
    -- What each project and workflow made of it: the per-workflow claim outcomes.
    ADD COLUMN detail          jsonb NOT NULL DEFAULT '{}';
CREATE INDEX github_deliveries_by_org ON github_deliveries (org_id, received_at DESC) WHERE org_id IS NOT NULL;

-- An uninstalled App keeps its installation row (the audit log names it); its repositories
-- are detached.
ALTER TABLE github_installations ADD COLUMN deleted_at timestamptz;
CREATE INDEX repositories_by_installation ON repositories (installation_id) WHERE installation_id IS NOT NULL;

-- The item projection's lookups: a board card names its issue or pull request by GraphQL node
-- id only, and check runs and statuses name a commit, which gates map to pull requests by
-- their head SHA. The content hash is kept to tell whether a delivery changed the item.
ALTER TABLE items
    ADD COLUMN node_id       text,
    ADD COLUMN head_sha      text,
    ADD COLUMN content_hash  text;
CREATE INDEX items_by_node ON items (org_id, node_id) WHERE node_id IS NOT NULL;
CREATE INDEX items_by_head ON items (project_id, head_sha) WHERE head_sha IS NOT NULL;

-- Dedup keys name a workflow by its name, which is unique per project, not per org: two
-- projects of one org watching the same repository with workflows of the same name must not
-- swallow each other's events. The key is still kept forever.
ALTER TABLE trigger_events DROP CONSTRAINT trigger_events_org_id_dedup_key_key;
ALTER TABLE trigger_events ADD CONSTRAINT trigger_events_dedup UNIQUE (org_id, project_id, dedup_key);
ALTER TABLE trigger_events
    -- The item's cycle generation the event belongs to (part of the key once above zero).
    ADD COLUMN generation   integer NOT NULL DEFAULT 0,
    ADD COLUMN delivery_id  text,
    -- The run it opened (status started), for the console and the claim's bookkeeping.
    ADD COLUMN run_id       uuid,
    -- Why it ended as it did: `superseded by <event>`, `revoked`, `cycle budget 3/3`.
    ADD COLUMN reason       text CHECK (length(reason) <= 500),
    ADD COLUMN decided_at   timestamptz;
-- The claim rule's and the re-judge's lookups: events still waiting behind a run, and the
-- blocked ones a reset looks at again.
CREATE INDEX trigger_events_waiting ON trigger_events (item_id, workflow_id, created_at)
    WHERE status IN ('queued', 'blocked');
-- The claim's look for the open runs of one workflow on one item uses `runs_by_item` (0001).

-- The ask under "Needs you": set when a workflow reached max_cycles on an item, cleared by a
-- reset. `ask` holds the blocked event and the counts shown to the person deciding.
ALTER TABLE item_cycle_budgets
    ADD COLUMN project_id  uuid REFERENCES projects,
    ADD COLUMN ask         jsonb;
CREATE INDEX item_cycle_budgets_asks ON item_cycle_budgets (org_id, project_id, asked_at) WHERE asked_at IS NOT NULL;

-- Check runs and commit statuses by head SHA, for gates on checks (woken by these webhooks,
-- never polled). One row per check name and commit; the latest report wins, except that a
-- completed check run is not taken back by an older in-progress report of the same run.
CREATE TABLE github_checks (
    org_id        uuid NOT NULL REFERENCES orgs,
    project_id    uuid NOT NULL REFERENCES projects,
    repository    text NOT NULL CHECK (repository = lower(repository)),
    head_sha      text NOT NULL,
    name          text NOT NULL,
    source        text NOT NULL CHECK (source IN ('check_run', 'check_suite', 'status')),
    -- The check run's id (0 for statuses), so a re-run is told from a late report.
    external_id   bigint NOT NULL DEFAULT 0,
    -- queued | in_progress | completed (statuses: pending → in_progress, others completed).
    status        text NOT NULL,
    -- success | failure | neutral | cancelled | skipped | timed_out | action_required | stale | error
    conclusion    text,
    details_url   text,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, repository, head_sha, name)
);
