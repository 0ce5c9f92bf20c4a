-- A queue's leases are counted on its row: admitting a run counted them (`count(*)` over
-- concurrency_leases), and at the org's queue that is every running run of the org, 1 ms an
-- admission at 10,000 running (make bench, BENCH_PROFILE=1). `held` is written only by
-- whoever holds the row FOR UPDATE (an admission); a run that ends, which holds the row only
-- FOR SHARE so that ending runs do not wait on each other, leaves a row in `lease_releases`
-- instead, and the next admission takes those rows and lowers `held` by as many. In every
-- snapshot, `held` less the queue's `lease_releases` rows is its leases.
ALTER TABLE admission_queues ADD COLUMN held integer NOT NULL DEFAULT 0 CHECK (held >= 0);

CREATE TABLE lease_releases (
    org_id  uuid NOT NULL REFERENCES orgs,
    queue   text NOT NULL
);
CREATE INDEX lease_releases_queue ON lease_releases (org_id, queue);

UPDATE admission_queues q SET held = (SELECT count(*) FROM concurrency_leases l WHERE l.org_id = q.org_id AND l.group_key = q.queue);

ALTER TABLE lease_releases ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant ON lease_releases USING (org_id = shopfloor_org()) WITH CHECK (org_id = shopfloor_org());
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'shopfloor_tenant') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON lease_releases TO shopfloor_tenant;
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'cannot grant lease_releases to shopfloor_tenant (%)', SQLERRM;
END
$$;
