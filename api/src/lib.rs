//! shopfloor's HTTP surface and the `shopfloor` command line.
//!
//! `http` holds the axum router (health, readiness and the REST API with its OpenAPI document;
//! webhooks and the host protocol join it), `console` the web console served beside it, `auth`
//! the service's tokens, `cli` the subcommands of the one binary, `telemetry` the logs, traces
//! and event log of a process (OTLP when configured).
//!
//! # Its modules
//!
//! - `cli/` — the subcommands; every setting is a flag and a `SHOPFLOOR_*` variable. The
//!   operator's commands are the `cli` crate's (below), flattened in and handed to `cli::run`.
//!   `cli/mod.rs` holds the command line and its dispatch only; the flag groups every process
//!   shares are `cli/args.rs` (`serve` is `api`'s `ServerArgs` and the engine's `PoolArgs`), a command's failure `cli/error.rs`, so the subcommands' files
//!   import those, never their parent.
//!   `cli/secret_key.rs`: where the secret key comes from (`SHOPFLOOR_SECRET_KEY`; required by
//!   `serve`, `api`, `engine` and the `admin` commands that issue tokens or change keys on a
//!   `DATABASE_URL`; with the embedded cluster, `SHOPFLOOR_DATA_DIR/secret-key`, made 0600 on
//!   first need) and what `serve`, `api`, `engine` and `migrate` do with it at start: refuse a
//!   key that does not open the sealed signing keys and the newest sealed webhook secret, then
//!   seal the plaintext ones of both. `cli/admin.rs` holds
//!   `rotate-signing-key` and `retire-signing-key KID [--grace 24h]` (one line out; wrong input
//!   exits 2). `cli/check.rs` is `shopfloor check`: on a server, the database reachable and at this
//!   binary's schema, whether `DATABASE_URL` is a transaction pooler (then
//!   `SHOPFLOOR_LISTEN_DATABASE_URL` must be set and direct), the secret key set and opening every sealed signing key and the webhook secrets, a current JWT signing key, the GitHub App's key parsing and minting an
//!   installation token for a connected repository at `SHOPFLOOR_GITHUB_API_URL` (`GET /app` when
//!   none is connected yet; `skip` when no App is configured), the webhook secret set; with
//!   `--host`, the harnesses the host's capabilities name (both when none is) and `git` on `PATH`,
//!   the price table (`SHOPFLOOR_HOST_PRICES` parsing, or the shipped one), and
//!   `SHOPFLOOR_SERVER` answering `/healthz`. It prints no secret.
//! - `http/` — the REST API under `/api/v1/orgs/{org}[/projects/{project}]`, built by one list
//!   of utoipa-axum `routes!` (`mod.rs`), so the OpenAPI 3.1 document (`openapi()`, served at
//!   `/api/v1/openapi.json` by `mod.rs` too, committed as `openapi/openapi.json` and checked for
//!   drift by a test; `make openapi` rewrites it) cannot miss a route. `mod.rs` holds only that
//!   list, the document and the layered router; what handlers share is `state.rs` (`AppState`,
//!   built over the signing keys' cache `keys.rs`, the event hub `event_hub.rs` and the limits),
//!   so that no handler imports the file that routes to it. `metrics.rs`: `GET /metrics`, unauthenticated like
//!   `/healthz` but outside the OpenAPI document (it is for scrapers; the authz table lists it
//!   apart), and the middleware, layered around every route of the server (REST, webhooks,
//!   console), that counts requests by the matched route's template and status. On `serve` it
//!   shows the engine's figures too (one registry per process). `error.rs`: one `ApiError`, one
//!   match to status and problem `type` (RFC 9457); a 5xx's cause goes to the log once
//!   (`log_failures`), never to the client. `auth.rs`: the bearer extractor — HS256 only, key by
//!   `kid` among all keys ever issued (the `KeyCache` holds opened keys for 10 s, each with the
//!   moment its retirement's grace ends: a key retired anywhere is refused on every replica at
//!   its `verify_until`, or within 10 s of the retirement when the grace is shorter), then the `api_tokens` row (not revoked or expired, in the
//!   org the claims name) and the holder's current membership (effective role = the lower of
//!   token and membership); a verified caller's org becomes the request's tenancy scope
//!   (`engine::tenancy::act_for`); the opened signing keys are cached in `keys.rs`. `tenant.rs`: `OrgScope`/`ProjectScope` hand each handler the org and
//!   project it may touch (and name its `{org}`/`{project}` path parameters in the document, as
//!   each route's `…Path` struct names the rest); another org's anything is 404; `scope`, the middleware around the REST
//!   and console routers, opens each request's tenancy scope. `AppState::db` is the tenant pool
//!   (handlers); `AppState::system` the owner's, for cross-tenant work only: token verification,
//!   the event hub, webhook ingest, sign-in's lookup of a person's orgs, installation claims,
//!   `/metrics`, `/healthz`/`/readyz`. The event streams and the console's transcript tails are
//!   polled outside the request that opened them, so each read is `scoped` to its org itself.
//!   `stream_access.rs`: what each of those streams holds for its caller, a place among its
//!   token's open streams (`limits`) and the token, checked again every 5 s as it sends: a
//!   stream ends once its token is revoked or expires or its person leaves the org. `extract.rs`: JSON, optional JSON,
//!   YAML-or-JSON workflow sources, path, query and `Idempotency-Key` extractors whose
//!   rejection is an `ApiError` (bodies over 1 MiB: 413); the key's extractor also takes the
//!   method and path a retry must repeat, and states the header in the document. `PathId`
//!   parses what a path names (`{run}`, `{step}`, `{user}`, a budget's `{period}`): text that is no such thing is a 404,
//!   as another org's id is; the routes document their path with a struct of their own
//!   (`RunPath`, …). `limits.rs`: the abuse limits, layered
//!   around every REST route — governor token buckets per credential (a hash of the
//!   `Authorization` value, taken before verification; the host protocol has buckets of its own)
//!   and per address (the peer, or the last `X-Forwarded-For` entry when trusted; IPv6 by /64)
//!   for requests without a credential and refused ones, an address whose bucket ran dry being
//!   refused everything until it refills (429 `rate-limited` with `Retry-After`); the request
//!   timeout (503 `timeout`; the host claim gets its 30 s wait plus a margin, an event stream is
//!   not cut: it answers at once); a declared body over 1 MiB refused before it is read; and the
//!   cap on a token's open event streams (a `StreamSlot` the stream's body holds, given back when
//!   it is dropped). Buckets full again are forgotten every 4,096 checks. `page.rs`: keyset cursors (base64url
//!   of the last row's key), and the `?limit=&cursor=` every list reads (`PageQuery`, `start`), the keyset ends of the
//!   lists' queries (`by_name`, `newest_first`), and `list!`, which declares a list's answer
//!   (`items`, `next_cursor`) and builds it from the rows fetched one past the page (`XList::page`). `idempotency.rs`: the key is claimed as the first write of the
//!   create's own `Change` and its answer recorded in it. `event_hub.rs`: the replica's event hub
//!   (one `LISTEN` connection, `engine::listen`, one read per notification for all clients,
//!   fanned out through a `broadcast`; after a loss it subscribes again, wakes the hosts' claims
//!   and reads once); `events.rs`: the project SSE stream, ordered by `(xid, event_id)` below
//!   `pg_snapshot_xmin` and resumable by `Last-Event-ID` (`0`: from the start of the 30 days it
//!   keeps). An event's id is its position sealed for the project (`Position::to_id`, AES-SIV
//!   under a key derived from `SHOPFLOOR_SECRET_KEY`): the same on every connection and replica,
//!   refused on another project's stream, and showing nothing of the service-wide xids and event
//!   ids, which would tell a tenant how busy the others are. Dry runs' and child runs' events are
//!   left out of it (as out of outgoing webhooks): they do not announce themselves, and their
//!   journals (`GET …/runs/{run}/events`) keep every event. `members.rs`, `tokens.rs`,
//!   `projects.rs`, `installations.rs` (the org's App installations: list; claim, accepted only
//!   when GitHub's `GET /user/installations` with the person's user access token lists the
//!   installation and GitHub announced it, by webhook or, when the App is configured here,
//!   `GET /app/installations/{id}`; another org's is a 409 with the reason; release),
//!   `repositories.rs` (connect a repository to a project through an installation the org
//!   claimed and that reaches it, its list refreshed from the App's API on a miss; list them), `workflows.rs`, `runs/` (the run and the lookups its handlers
//!   share in `mod.rs`, among them `ProjectRun`, the extractor of every route under
//!   `…/runs/{run}`: the run proven to be of the path's project before the handler runs, the
//!   store's writes checking only the org; `read.rs` list, get and `why` from `engine::substate`; `act.rs` submit,
//!   cancel, retry, rerun; `answers.rs` approve, reject; `history.rs` events and step logs), `hosts.rs` (list, registration tokens, deregistration, drain and undrain), `audit.rs`, `admission.rs`
//!   (the org's cap with its running and waiting counts; a project's pause, unpause,
//!   retention and board columns' WIP limits), `budgets.rs` (org and project limits per day or month with their spend, and
//!   spend per project and day), `webhooks_out.rs` (outgoing webhooks, their delivery log and
//!   replay; a URL whose target `engine::net_guard` refuses is a 422 and nothing is stored; the
//!   policy is `AppState::use_webhook_policy`, from `SHOPFLOOR_WEBHOOKS_ALLOW_PRIVATE`), `operator.rs` (resolve a failed run; cycle-budget asks and their reset), `messages.rs`
//!   (intervene: `POST …/runs/{run}/steps/{step}/messages` `{text}`, member; 409 with the reason
//!   when the step is not a live crew session or its harness cannot take messages): the
//!   resources. `runs/act.rs`'s retry takes an optional body `{node, prompt, model, harness}`:
//!   edit-and-retry. A submit refused by admission is a 409 (`skip`) or a 429 (the org's
//!   line is full).
//!   `host_protocol/`: what `shopfloor host` calls under `/api/v1/host/` with its credential
//!   (`HostCaller` extractor, and `HostStep` for the routes of one step: the host with the
//!   step its path names, whose holding the store checks as it acts; person tokens get 403; the bodies the host shares are `protocol`'s,
//!   the others beside their handlers): `register` (a registration token, revoked by
//!   it, answers a host credential), `claim` (`claim.rs`, answering `engine::hosts::Assignment`s;
//!   a long poll of up to 30 s (`limits::MAX_WAIT_SECS`, beside the request timeout it sets) that waits on the event
//!   hub: its `ready` signal, bumped by each `w0` notification, and its event feed for the held
//!   steps' `step.cancelled`/`failed`/`succeeded`), `steps/{step}/start`, `heartbeat` (which fails a step whose run a spent hard budget stops,
//!   `budget_hard_stop`, or a crew step whose session reported nothing for `SHOPFLOOR_STALL_SECS`
//!   (600), `stalled`, an infrastructure failure that is retried, and answers stop: hosts send a
//!   report only when the harness printed something, so a silent harness is seen on the
//!   heartbeats it keeps sending, with no timer of its own), `session` (spend recorded, and the same stop)
//!   and `complete` (these, `messages/delivered` and `token` in `held.rs`); the answers to `heartbeat` and `session` carry the step's undelivered
//!   `messages` (intervene), which the host acknowledges with `steps/{step}/messages/delivered`
//!   once written to the harness (until then they are offered again); `steps/{step}/token` mints
//!   a fresh installation token (`Scope::Push`, that one repository) for a step the host holds
//!   (leased or running; another host's or a finished one is 409, another org's 404), its
//!   repository the run's as the claim's assignment finds it, connected to the host's project,
//!   never one the caller names; no App configured: `token: null`. Roles: viewer reads;
//!   member uploads workflows and submits, cancels, retries, reruns, approves, rejects and makes
//!   its own tokens; admin manages members, projects, hosts, others' tokens and reads the audit log;
//!   only an owner gives or takes the owner role. **Architecture Invariant:** handlers read with
//!   SQL filtered by `org_id` and write only through `engine::store` (their own writes are in
//!   `store/api_writes.rs`: members, token revocation, host deregistration, idempotency keys).
//!   Host credentials and registration tokens reach no person's route (403).
//! - `main.rs` — the one `shopfloor` binary: its allocator (mimalloc, which costs the servers
//!   about 7% less CPU a webhook delivery than glibc's malloc), the subscriber, the runtime, and
//!   one line on standard error for an error.
//! - `telemetry.rs` — the process's subscriber, set up in `main.rs` before the runtime and shut
//!   down (flushed) after it on every way out: JSON lines on standard error filtered by `--log`,
//!   with `trace_id` and `span_id` first inside a span that has a trace; and, for `serve`, `api`,
//!   `engine` and `host` when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `_TRACES_ENDPOINT` /
//!   `_LOGS_ENDPOINT`) is set, OTLP over HTTP/protobuf (opentelemetry-otlp, batch processors that
//!   read `OTEL_BSP_*`/`OTEL_BLRP_*`; resource from `OTEL_SERVICE_NAME` and
//!   `OTEL_RESOURCE_ATTRIBUTES`, `shopfloor` by default, with `shopfloor.process`): spans of
//!   `info` and above whatever `--log` says, and the event log (`engine::event_log`) as log
//!   records named `shopfloor.<kind>`, their attributes the keys with a value, their body the whole
//!   record as JSON with its nulls, in the run's trace. No endpoint: no exporter is built and no
//!   OpenTelemetry layer installed. The webhook handler (`webhooks/`) and the run submit, retry
//!   and rerun handlers (`http/runs/act.rs`) make the root span of the runs they create; a run's
//!   `trace_id` is in its REST view.
//! - `auth.rs` — API tokens: HS256 JWTs with a `kid` header and a `jti` row in `api_tokens`,
//!   signed with `store::signing_keys::current` (so issuing takes the secret key);
//!   issues person tokens, host registration tokens (kind `registration`, role `host`) and host
//!   credentials (kind `host`, naming the host; revoked when it is deregistered).
//! - `webhooks/` — `POST /webhooks/github` with its own 25 MB body limit (413 above, before
//!   reading when `Content-Length` says so): the
//!   `X-Hub-Signature-256` HMAC is checked in constant time before anything parses the body
//!   (401, nothing stored), then `engine::triggers::ingest` does the rest. Signed deliveries are
//!   never rate limited (GitHub does not send a refused one again); a bad signature is charged to
//!   the sender's address as a REST 401 is (`http/limits.rs`). Merged into the app in
//!   `cli/processes.rs`, which holds the secret (`SHOPFLOOR_GITHUB_WEBHOOK_SECRET`; unset: 503).
//! - `console/` — the web console at `/`: server-rendered HTML (minijinja templates from
//!   `api/templates/`, compiled into the binary and checked by its tests), a small script that
//!   keeps pages live through the project SSE stream, and pages that work with scripts off.
//!   Today per org, runs (filters, keyset pages), the run page (headline from `engine::substate`,
//!   forecast from earlier runs, journal, waterfall and graph SVG, live transcript of a crew
//!   step), hosts (online, offline or drained; drain, undrain, deregister) and "Add a host" (a
//!   registration token in the command to paste, `cli::host_command`, the CLI's own,
//!   shown once), workflows (validation at the problem's line, pause; the whole project's pause for admins;
//!   a run started from a workflow's page, with its input), budgets per project and
//!   per org (the limits that apply, today's and the month's spend, the runs a budget holds in
//!   `admission_waits`), members, outgoing webhooks (the secret shown once, recent deliveries,
//!   replay), audit log, tokens, and GitHub (`pages/github.rs`: the org's installations, and "Connect GitHub": the App's install
//!   page (`SHOPFLOOR_GITHUB_APP_SLUG`) with a `state` kept in a cookie bound to the session, the
//!   App's setup URL `/github/setup`, OAuth back at `/github/setup/callback`, and the person's
//!   token handed to the REST claim).
//!   Today's Needs-you cards carry their actions: an approval card names the workflow and the
//!   run's item or input, a failure has Resolve (`…/runs/{run}/resolve`), a used-up cycle budget
//!   has Reset (`…/cycle-asks/{item}/reset`). The run page's headline and sentence are in words
//!   (`engine::reasons`; a stopped line names the node and the failure that looped back to it),
//!   it lists who decided each approval and what they entered, and a failed run has an
//!   edit-and-retry form for its crew nodes. `people.rs` names actors (`user:…` as the person's
//!   GitHub login or email, `host:…` as the host's name) in one read per page; `transcript.rs`
//!   shows agents' lines (Claude Code's `stream-json`, Codex's `exec --json`) as their words,
//!   tool calls and results, never raw JSON. Relative times move on in the page; a page closes
//!   its streams when it is left (a back-forward cache would keep them and stall the browser's
//!   few connections to the server).
//!   A form's handler takes `pages::Posted` (its last extractor): the session of the org in the
//!   path once the form's origin and CSRF field are checked, and the form's fields.
//!   `console/mod.rs` declares the modules and routes the pages; what they share is `state.rs`
//!   (`Console`) with `config.rs` (`ConsoleConfig`), and `escape.rs` makes text safe for HTML and
//!   URLs (below `error.rs` and `view.rs`, which both need it).
//!   The run page is `pages/run/`: what its requests name and what a refused form leaves on it
//!   (`Feedback`) in `mod.rs`, the page itself in `page.rs` (`render`, which the forms' handlers
//!   call again), the run in words (`headline.rs`), the forecast (`forecast.rs`), steps (each
//!   reason in words beside the machine reason, and a failed step's own words, its output's
//!   `error`, escaped under them), waterfall and journal (`timeline.rs`), the transcript and its live tail (`tail.rs`), the
//!   approvals and decisions as shown (`approvals.rs`), the approval forms' handlers
//!   (`decide.rs`) and the other forms (`act.rs`, each posted through one `post`). The graph SVG
//!   (`console/svg/graph/`) is laid out by `dagre-dgl-rs`, a port of dagre-js's layered layout,
//!   whose edge bend points keep edges off other boxes (`route.rs`); loops back (`edges.rs` says
//!   which) are routed round it, dashed.
//!   Sign-in with GitHub OAuth (`SHOPFLOOR_GITHUB_OAUTH_URL`, `SHOPFLOOR_GITHUB_OAUTH_API_URL`,
//!   `SHOPFLOOR_GITHUB_CLIENT_ID`/`_SECRET`) or a pasted token, each attempt (and GitHub's
//!   callback) charged to the client's address (`SHOPFLOOR_SIGNIN_PER_MINUTE`; a 429 page); a session is one API token per org
//!   (`console session`) in an `HttpOnly`, `SameSite=Lax` cookie (`Secure` over TLS), revoked at
//!   sign-out; one made from a pasted token ends with that token, at its expiry or revocation; every form carries a CSRF field derived from it. Merged into the app in
//!   `cli/processes.rs`. **Architecture Invariant:** the console writes nothing itself: a form
//!   becomes a request to the REST route of the same action, dispatched in-process through the
//!   same router with the signed-in caller, so it runs the REST handler's checks and its
//!   `engine::store` writes. Live transcripts follow `l<run>` notifications that session reports
//!   send; the replica's one `LISTEN` (`http/events.rs`) fans them out.

pub mod auth;
pub mod cli;
pub mod console;
pub mod http;
pub mod telemetry;
pub mod webhooks;
