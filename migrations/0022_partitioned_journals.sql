-- Partitioned journals: `run_events` and `step_logs` are partitioned by month of their run's
-- creation (`run_created_at`), so a run's whole journal lives in one partition and lives as
-- long as the run: a partition is dropped whole once no run created in its month is left
-- (`shopfloor_journal_maintain`, called by every retention sweep), never row by row. The
-- 30-day rule is what the project's event stream replays, not a kept run's history.
--
-- Neither table references `runs` any more: deleting a run leaves its journal to its
-- partition's drop. The per-run sequence stays unique: the key is (run_id, seq,
-- run_created_at), and run_created_at is a function of run_id.

CREATE INDEX runs_by_created ON runs (created_at);

-- A partition is read through its table, whose policy applies; one named directly shows a
-- tenant only its org's rows too (0016's wall, on every table with an org_id).
CREATE FUNCTION shopfloor_journal_guard(name text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', name);
    EXECUTE format('CREATE POLICY tenant ON %I USING (org_id = shopfloor_org()) WITH CHECK (org_id = shopfloor_org())', name);
END
$$;

-- The partition of both journals for the month that starts at `month` (a first of the month).
-- Rows of that month already in the default partition (written while it was missing) move in.
CREATE FUNCTION shopfloor_journal_partition(month date) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t text;
    name text;
    lo timestamptz := month::timestamptz;
    hi timestamptz := (month + interval '1 month')::timestamptz;
    strays boolean;
BEGIN
    FOREACH t IN ARRAY ARRAY['run_events', 'step_logs'] LOOP
        name := format('%s_%s', t, to_char(month, 'YYYYMM'));
        CONTINUE WHEN to_regclass(name) IS NOT NULL;
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE run_created_at >= %L AND run_created_at < %L)', t || '_default', lo, hi) INTO strays;
        IF strays THEN
            EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS)', name, t);
            EXECUTE format('WITH moved AS (DELETE FROM %I WHERE run_created_at >= %L AND run_created_at < %L RETURNING *) INSERT INTO %I SELECT * FROM moved',
                           t || '_default', lo, hi, name);
            EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', t, name, lo, hi);
        ELSE
            EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)', name, t, lo, hi);
        END IF;
        PERFORM shopfloor_journal_guard(name);
    END LOOP;
END
$$;

-- Makes the partitions of this month and the next two, and drops those whose month ended
-- before the oldest run left was created (none of their runs is left). Returns the number
-- of partitions dropped.
CREATE FUNCTION shopfloor_journal_maintain() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    first date := date_trunc('month', now())::date;
    keep_from timestamptz;
    p record;
    dropped integer := 0;
BEGIN
    FOR i IN 0..2 LOOP
        PERFORM shopfloor_journal_partition((first + make_interval(months => i))::date);
    END LOOP;
    -- A run created this month could still be committed into this month's partition.
    keep_from := least(coalesce((SELECT min(created_at) FROM runs), now()), first::timestamptz);
    FOR p IN
        SELECT c.relname
          FROM pg_inherits i
          JOIN pg_class c ON c.oid = i.inhrelid
          JOIN pg_class parent ON parent.oid = i.inhparent
         WHERE parent.relname IN ('run_events', 'step_logs')
           AND c.relname ~ '_[0-9]{6}$'
           AND (to_date(right(c.relname, 6), 'YYYYMM') + interval '1 month') <= keep_from
    LOOP
        EXECUTE format('DROP TABLE %I', p.relname);
        dropped := dropped + 1;
    END LOOP;
    RETURN dropped;
END
$$;

ALTER TABLE run_events RENAME TO run_events_unpartitioned;
ALTER INDEX run_events_by_project RENAME TO run_events_unpartitioned_by_project;
ALTER INDEX run_events_by_xid RENAME TO run_events_unpartitioned_by_xid;
ALTER INDEX run_events_by_age RENAME TO run_events_unpartitioned_by_age;
ALTER TABLE step_logs RENAME TO step_logs_unpartitioned;
ALTER INDEX step_logs_by_run RENAME TO step_logs_unpartitioned_by_run;

CREATE SEQUENCE run_events_event_id;
SELECT setval('run_events_event_id', coalesce((SELECT max(event_id) FROM run_events_unpartitioned), 0) + 1, false);

CREATE TABLE run_events (
    org_id          uuid NOT NULL REFERENCES orgs,
    project_id      uuid NOT NULL REFERENCES projects,
    run_id          uuid NOT NULL,
    -- The run's created_at: the partition key.
    run_created_at  timestamptz NOT NULL,
    -- Gapless per run: taken as the last seq + 1 under the run's row lock.
    seq             bigint NOT NULL,
    -- Unique across runs. Readers of a project's stream order by (xid, event_id) and read only
    -- below the oldest running transaction, so no event can appear later behind a reader's
    -- position (Last-Event-ID).
    event_id        bigint NOT NULL DEFAULT nextval('run_events_event_id'),
    xid             xid8 NOT NULL DEFAULT pg_current_xact_id(),
    at              timestamptz NOT NULL DEFAULT now(),
    kind            text NOT NULL,
    step_id         uuid,
    node            text,
    attrs           jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (run_id, seq, run_created_at)
) PARTITION BY RANGE (run_created_at);
ALTER SEQUENCE run_events_event_id OWNED BY run_events.event_id;
CREATE INDEX run_events_by_project ON run_events (org_id, project_id, xid, event_id);
CREATE INDEX run_events_by_xid ON run_events (xid, event_id);

CREATE TABLE step_logs (
    org_id          uuid NOT NULL REFERENCES orgs,
    run_id          uuid NOT NULL,
    run_created_at  timestamptz NOT NULL,
    step_id         uuid NOT NULL,
    seq             bigint NOT NULL,
    at              timestamptz NOT NULL DEFAULT now(),
    stream          text NOT NULL,
    line            text NOT NULL,
    PRIMARY KEY (step_id, seq, run_created_at)
) PARTITION BY RANGE (run_created_at);
CREATE INDEX step_logs_by_run ON step_logs (run_id);

-- A run created in a month without a partition (the engines were away for months) still
-- writes its journal; the maintenance makes the months ahead, so this stays empty.
CREATE TABLE run_events_default PARTITION OF run_events DEFAULT;
CREATE TABLE step_logs_default PARTITION OF step_logs DEFAULT;
SELECT shopfloor_journal_guard('run_events_default');
SELECT shopfloor_journal_guard('step_logs_default');

-- Partitions for every month that has a run or an event, and the months ahead.
DO $$
DECLARE
    m date;
BEGIN
    FOR m IN
        SELECT DISTINCT date_trunc('month', t)::date FROM (
            SELECT created_at AS t FROM runs
            UNION ALL SELECT at FROM run_events_unpartitioned
            UNION ALL SELECT at FROM step_logs_unpartitioned) AS x
    LOOP
        PERFORM shopfloor_journal_partition(m);
    END LOOP;
END
$$;
SELECT shopfloor_journal_maintain();

-- Existing rows move; an event or line whose run is gone keeps its own time as the key.
INSERT INTO run_events (org_id, project_id, run_id, run_created_at, seq, event_id, xid, at, kind, step_id, node, attrs)
SELECT e.org_id, e.project_id, e.run_id, coalesce(r.created_at, e.at), e.seq, e.event_id, e.xid, e.at, e.kind, e.step_id, e.node, e.attrs
  FROM run_events_unpartitioned e LEFT JOIN runs r ON r.run_id = e.run_id;
INSERT INTO step_logs (org_id, run_id, run_created_at, step_id, seq, at, stream, line)
SELECT l.org_id, l.run_id, coalesce(r.created_at, l.at), l.step_id, l.seq, l.at, l.stream, l.line
  FROM step_logs_unpartitioned l LEFT JOIN runs r ON r.run_id = l.run_id;
DROP TABLE run_events_unpartitioned;
DROP TABLE step_logs_unpartitioned;

-- Row-level security as every table with an org_id has it (0016).
ALTER TABLE run_events ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant ON run_events USING (org_id = shopfloor_org()) WITH CHECK (org_id = shopfloor_org());
ALTER TABLE step_logs ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant ON step_logs USING (org_id = shopfloor_org()) WITH CHECK (org_id = shopfloor_org());
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'shopfloor_tenant') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON run_events, step_logs TO shopfloor_tenant;
        GRANT USAGE, SELECT ON SEQUENCE run_events_event_id TO shopfloor_tenant;
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'cannot grant the journals to shopfloor_tenant (%)', SQLERRM;
END
$$;
