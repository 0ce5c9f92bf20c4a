-- The position below which every run event is committed or will never be: the streams read
-- only events whose transaction id is below it (api/src/http/events.rs).
--
-- pg_snapshot_xmin(pg_current_snapshot()) would do, but transaction ids are cluster-wide:
-- one long transaction in another database on the same server (a report, a pg_dump, another
-- service) would hold every stream back for as long as it runs. So the transactions still in
-- progress are counted unless a backend of another database is seen holding them. When in
-- doubt (a backend that just ended, a prepared transaction, a role that cannot see other
-- databases' sessions) a transaction is counted, which can only delay an event, never lose it.
CREATE FUNCTION shopfloor_event_horizon() RETURNS xid8
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT min(x) FROM pg_snapshot_xip(pg_current_snapshot()) AS x
          WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a
                             WHERE a.backend_xid = xid(x) AND a.datname IS DISTINCT FROM current_database())),
        pg_snapshot_xmax(pg_current_snapshot()))
$$;
