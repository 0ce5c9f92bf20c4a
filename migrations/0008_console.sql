-- The web console's reads. Its sessions are API tokens (`api_tokens`, name `console session`),
-- so it adds no table; only the indexes its org-wide pages use, each checked with EXPLAIN by
-- the console's tests on 10,000 seeded runs.

-- Today: the org's running runs, newest first, across its projects.
CREATE INDEX runs_running_by_org ON runs (org_id, created_at DESC, run_id DESC) WHERE status = 'running';
-- Today: the org's recent completions and failures, latest first.
CREATE INDEX runs_ended_by_org ON runs (org_id, ended_at DESC, run_id DESC) WHERE status <> 'running';
-- Today: failures not yet resolved by a retry or rerun (those name them as `source_run_id`).
CREATE INDEX runs_failed_by_org ON runs (org_id, ended_at DESC, run_id DESC) WHERE status = 'failed';
-- The run page's forecast: earlier completed runs of the same workflow, latest first.
CREATE INDEX runs_completed_by_workflow ON runs (workflow_id, ended_at DESC) WHERE status = 'completed';
-- Sign-in with GitHub finds the people a GitHub account is, in every org, by login or by a
-- verified email address.
CREATE INDEX users_by_github_login ON users (lower(github_login)) WHERE github_login IS NOT NULL;
CREATE INDEX users_by_email ON users (lower(email));
