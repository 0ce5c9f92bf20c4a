//! The org a piece of work acts for, and the tenant pool that shows the database only that
//! org's rows: the second wall behind the handlers' `WHERE org_id = …` (migration 0016).
//!
//! A request runs inside [`scoped`], which holds a slot for its org in a task-local; the API
//! fills it with [`act_for`] once the caller's token is verified. Every transaction on a pool
//! made by [`tenant`] begins by taking the role `shopfloor_tenant` and setting `shopfloor.org`
//! to the org of the task that begins it (empty when there is none), both `LOCAL`: the
//! row-level security policies then show and accept only that org's rows, and with no org, no
//! row at all; and a single statement on the pool is a transaction of its own. Nothing is set
//! on the session, so nothing outlives the transaction: behind a transaction pooler, where the
//! next transaction on that server connection may be another client's, no org or role leaks
//! to it, and the same code holds on a direct connection. Work that is nobody's or everybody's
//! (the engine, token verification, webhook ingest, event streams polled outside any request)
//! uses the owner's pool, which the policies do not apply to.
//!
//! The org is read when a transaction begins, so it must be set before: a transaction begun
//! before [`act_for`] keeps the org (or none) it began with. A task spawned from a scoped one
//! does not inherit the scope (task-locals do not cross `tokio::spawn`): it sees nothing.
//!
//! # The walls between tenants
//!
//! shopfloor is one service for many orgs: one GitHub App, one database, shared engines and API
//! replicas. These are the walls between tenants, from the outside in, and what each one stops.
//!
//! 1. **Abuse limits** (`api/src/http/limits.rs`). Each replica keeps token buckets in memory, and
//!    none of them holds tenant data: per credential (a hash of the bearer, taken before it is
//!    verified; host credentials on the host protocol have their own), and per client address for
//!    requests with no credential or a refused one, so a spray of made-up tokens empties its
//!    address's bucket and everything from that address waits (429 with `Retry-After`). The
//!    console's sign-in and OAuth callback have their own per-address limit. One token may hold
//!    a few open event streams. A request timeout (503), and bodies refused from their declared
//!    `Content-Length` before they are read, keep one caller from holding a replica's connections
//!    or memory. Signed GitHub deliveries are never limited (GitHub does not send a refused one
//!    again); badly signed ones count against their address. *Stops:* one org, or anyone,
//!    starving the others' requests through the shared HTTP surface.
//! 2. **Who is calling, for which org** (`http/auth.rs`, `http/tenant.rs`). A token is an HS256
//!    JWT whose `api_tokens` row must be live in the org its claims name, and whose holder must
//!    still be a member. `OrgScope`/`ProjectScope` hand each handler the one org and project it
//!    may touch; another org's anything is 404, never 403. Every query filters by `org_id`.
//!    Host credentials reach only the host protocol, and a host claims only its own project's
//!    steps. *Stops:* reading or changing another org's rows through the API.
//! 3. **Row-level security** (`migrations/0016_row_security.sql`, `engine/src/tenancy/`). Every
//!    table with an `org_id` column (and `github_installation_repositories`, through its
//!    installation) has a policy `org_id = shopfloor_org()`, the setting `shopfloor.org`.
//!    Handlers' pool (`AppState::db`) is the tenant pool: each of its transactions (a single
//!    statement is one of its own) begins with `set_config('role', 'shopfloor_tenant', true)` (no
//!    `BYPASSRLS`) and `set_config('shopfloor.org', <the beginning task's org>, true)`: local to
//!    the transaction, so behind a transaction pooler no role or org is left on a server session
//!    for the next client's transaction (`tests/e2e/pgbouncer.rs` runs two orgs and the owner
//!    concurrently on two shared server connections). Every request runs in a scope that `auth::verify` fills with the
//!    verified caller's org; a statement outside any scope (a spawned task included) sees no row
//!    and may write none, and `WITH CHECK` refuses another org's row. Event streams and transcript
//!    tails, polled after their request ended, scope each read to their org themselves.
//!    Cross-tenant work runs on `AppState::system`, the owner's pool, which the policies do not
//!    bind (enabled, not forced), with explicit org filters: token verification, webhook ingest,
//!    the event hub, sign-in's lookup of a person's orgs, installation claims (a claim must see
//!    that another org holds one to answer 409), metrics and health; the engine also runs there.
//!    An unclaimed installation is visible to every org so that one can claim it. If the
//!    migrating user cannot create the role, the migration skips row security with a NOTICE and
//!    the tenant pool warns once; the other walls still hold. *Stops:* a handler that forgets its
//!    `org_id` filter from reading or writing past its caller's org.
//!    Below the policies, the schema itself pairs each project's rows with the project's org
//!    (migration 0025: `(project_id, org_id)` keys to `projects`), so even the owner's pool
//!    cannot store a row of one org that points into another's project.
//! 4. **GitHub is proven, never named** (`store/installations.rs`, `http/installations.rs`,
//!    `console/pages/github.rs`). An installation of the App becomes known only from GitHub (a
//!    signed `installation`/`installation_repositories` webhook, or the App's own API) and belongs
//!    to no org until an admin of one claims it with GitHub's word that their GitHub identity can
//!    access it (`GET /user/installations` with their user access token, obtained by the console's
//!    install flow with a `state` bound to the session, or passed by automation). An installation
//!    another org holds is a 409; a repository is connected only if the installation's list holds
//!    it, and removing it from the installation on GitHub detaches it. *Stops:* an org taking
//!    another's installation or repository, routing its webhooks to itself, or getting tokens
//!    for it.
//! 5. **Least privilege towards GitHub** (`github/client.rs` `Scope`). Every installation token is
//!    minted for the one repository a step needs and only the permissions of its use: a host's
//!    crew step `contents: write` to push; a pull request `pull_requests: write`; comments and
//!    labels `issues`/`pull_requests: write`; a board move `organization_projects: write`. Tokens
//!    are short-lived (GitHub's hour) and never written to a host's journal. *Stops:* a
//!    compromised host or a leaked token doing more than its step could.
//! 6. **Outgoing webhooks stay outside** (`engine/src/net_guard.rs`, `jobs.rs`). A tenant's admin
//!    chooses where webhooks go, but our engines send them, so a webhook URL may only reach the
//!    public internet: loopback, private, link-local, CGNAT, metadata, reserved and multicast
//!    targets, in every numeric or IPv6-embedded spelling, are refused when the subscription is
//!    made (422) and again at each send, where the delivery client's resolver refuses a name any
//!    of whose addresses is internal, so what is checked is what is connected to. A refused send
//!    is a failed attempt saying why, never retried, and no more than 4 KiB of any answer is read.
//!    `SHOPFLOOR_WEBHOOKS_ALLOW_PRIVATE` opens loopback and private targets for on-premises
//!    installs; metadata and link-local stay closed. *Stops:* a tenant using our engines to look
//!    inside our network or to fill an engine's memory.
//! 7. **Secrets sealed at rest** (`engine/src/sealing.rs`, `store/signing_keys.rs`,
//!    `store/webhooks_out.rs`). Signing keys are service-wide, not tenant data: one key signs
//!    every org's tokens, and which org a token acts for comes from its claims and its row.
//!    Their secrets are sealed with `SHOPFLOOR_SECRET_KEY` (XChaCha20-Poly1305, bound to the
//!    `kid`), which `serve`, `api`, `engine` and the operator's `admin` commands hold, never
//!    hosts. Rotation keeps every live token valid; retirement cuts a key's tokens off for all
//!    orgs after a grace, on every replica within 10 s. A tenant's outgoing webhook secrets are
//!    sealed with the same key, each bound to its subscription, and opened by an engine only to
//!    sign a delivery. Engines hold the key for that (a peer's engine holds its encryption keys
//!    the same way): they are the service's own pods, which already write every org's rows;
//!    hosts, which run tenants' agents, never see it. *Stops:* a copy of the database (a dump, a backup) minting a token for any
//!    org, or signing deliveries a tenant's receiver would trust.

pub(crate) mod scope;

use crate::db::Db;

pub use scope::{TENANT_ROLE, act_for, current, scoped};

/// A pool to the same database as `db` (same route, size and limits) whose transactions act as
/// `shopfloor_tenant` for the current scope's org. When the role does not exist or may not be
/// taken (the migration could not create it), they keep the owner's role and a warning says so
/// once: only the handlers' filters hold then.
pub fn tenant(db: &Db) -> Db {
    db.tenant_beside()
}
