-- Installations of the GitHub App become known from GitHub (a signed `installation` or
-- `installation_repositories` webhook, or the App's own API) before any org has them: an
-- installation is unclaimed (org_id NULL) until a person of an org proves, through GitHub's
-- install flow or an OAuth token of theirs, that their GitHub identity can access it.
-- Installations claimed before this release keep their org (claimed_by 'legacy').
ALTER TABLE github_installations ALTER COLUMN org_id DROP NOT NULL;
ALTER TABLE github_installations
    ADD COLUMN account_type          text,
    ADD COLUMN repository_selection  text,
    ADD COLUMN claimed_at            timestamptz,
    ADD COLUMN claimed_by            text;
UPDATE github_installations SET claimed_at = created_at, claimed_by = 'legacy' WHERE org_id IS NOT NULL;

CREATE INDEX github_installations_by_org ON github_installations (org_id, installation_id) WHERE org_id IS NOT NULL;

-- The repositories an installation can reach, as GitHub last said (`owner/name`, lowercased).
-- A repository is connected to a project only if it is here.
CREATE TABLE github_installation_repositories (
    installation_id  bigint NOT NULL REFERENCES github_installations ON DELETE CASCADE,
    full_name        text NOT NULL,
    PRIMARY KEY (installation_id, full_name)
);

-- Repositories connected before this release were connected through an installation named by
-- the caller; GitHub's list arrives with the next webhook or API refresh. Until then they are
-- taken as reachable, so no running project loses its routes at upgrade.
INSERT INTO github_installation_repositories (installation_id, full_name)
SELECT DISTINCT installation_id, full_name FROM repositories WHERE installation_id IS NOT NULL
ON CONFLICT DO NOTHING;
