-- Row-level security: a second wall behind the handlers' `WHERE org_id = …`.
--
-- The API's handlers run on a pool whose connections `SET ROLE shopfloor_tenant` and carry the
-- org their request acts for in the setting `shopfloor.org` (engine/src/tenancy.rs). Under
-- that role every table with an `org_id` column shows and accepts only that org's rows, and
-- with no org set, none. The table owner (the engine, migrations, and the API's cross-tenant
-- work: token verification, webhook ingest, the event streams) is not subject to the policies:
-- row security is enabled, not forced.
--
-- A migrating user that may not create roles (a managed database whose owner is not
-- CREATEROLE) gets a NOTICE and no row security at all rather than a failed migration: the
-- first wall (the handlers' filters) still holds, and the API finds no role to switch to and
-- says so in its log. Roles are cluster-wide, so the role is made only when missing.

-- Which org the session acts for; NULL when none (an empty or unset setting).
CREATE FUNCTION shopfloor_org() RETURNS uuid
LANGUAGE sql STABLE AS $$
    SELECT nullif(current_setting('shopfloor.org', true), '')::uuid
$$;

DO $rls$
DECLARE
    t record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'shopfloor_tenant') THEN
        BEGIN
            CREATE ROLE shopfloor_tenant NOLOGIN NOBYPASSRLS;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE NOTICE 'cannot create the role shopfloor_tenant (%): row-level security is not set up', SQLERRM;
            RETURN;
        END;
    END IF;
    BEGIN
        EXECUTE format('GRANT shopfloor_tenant TO %I', current_user);
    EXCEPTION WHEN insufficient_privilege THEN
        RAISE NOTICE 'cannot grant the role shopfloor_tenant to % (%): row-level security is not set up', current_user, SQLERRM;
        RETURN;
    END;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO shopfloor_tenant', current_schema());
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %I TO shopfloor_tenant', current_schema());
    EXECUTE format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA %I TO shopfloor_tenant', current_schema());
    -- Tables made by later migrations are granted too (they must still enable row security:
    -- a test checks that every table with an org_id column has it).
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %I GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO shopfloor_tenant', current_schema());
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %I GRANT USAGE, SELECT ON SEQUENCES TO shopfloor_tenant', current_schema());

    FOR t IN
        SELECT c.relname
          FROM pg_class c
          JOIN pg_namespace n ON n.oid = c.relnamespace
          JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'org_id' AND NOT a.attisdropped
         WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
         ORDER BY c.relname
    LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t.relname);
        IF t.relname = 'github_installations' THEN
            -- An installation is unclaimed (org_id NULL) until an org claims it, and released
            -- back to NULL: the claim and the release run as the org that makes them.
            EXECUTE format('CREATE POLICY tenant ON %I USING (org_id = shopfloor_org() OR org_id IS NULL) '
                           'WITH CHECK (org_id = shopfloor_org() OR org_id IS NULL)', t.relname);
        ELSE
            -- github_deliveries.org_id is NULL for a delivery no org's repository matched: only
            -- webhook ingest (the owner) writes or reads those, so no tenant sees them.
            EXECUTE format('CREATE POLICY tenant ON %I USING (org_id = shopfloor_org()) '
                           'WITH CHECK (org_id = shopfloor_org())', t.relname);
        END IF;
    END LOOP;

    -- No org_id of its own: a row is the tenant's when its installation is visible (the
    -- org's, or unclaimed).
    ALTER TABLE github_installation_repositories ENABLE ROW LEVEL SECURITY;
    CREATE POLICY tenant ON github_installation_repositories
        USING (EXISTS (SELECT 1 FROM github_installations i
                        WHERE i.installation_id = github_installation_repositories.installation_id))
        WITH CHECK (EXISTS (SELECT 1 FROM github_installations i
                             WHERE i.installation_id = github_installation_repositories.installation_id));
END
$rls$;
