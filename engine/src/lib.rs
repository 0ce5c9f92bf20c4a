//! shopfloor's core: the domain model, workflow definitions, the graph walker, the store (the
//! one write path) and the engine pool.
//!
//! # Its modules
//!
//! The core. Nothing here knows about HTTP.
//!
//! - `ids.rs` — newtypes for ids and slugs, made only by parsing or minting. Runs and steps
//!   print as `run-<base32>` / `step-<base32>` of a UUIDv7.
//! - `state.rs` — step and run states; the legal moves are written once (the `states!` macro),
//!   which yields the data tables (`STEP_MOVES`, `RUN_MOVES`) and a `MoveTo<To>` impl for each
//!   legal pair. **Architecture Invariant:** an illegal move does not compile (a `compile_fail`
//!   doctest shows one), and the same source states guard the SQL `UPDATE`.
//! - `definition/` — the workflow model (`model.rs`), parsing with every problem reported at
//!   once with its line and column (`parse.rs`; under `parse/`, `read.rs` the typed readers
//!   and `Problem`, `node.rs` a node's common keys, `kinds.rs` each kind's own, `graph.rs` the
//!   graph checks), the kinds of edges and the rule for which nodes start a run, which the graph
//!   checks and the walker share (`edges.rs`), CEL expressions (`expr.rs`),
//!   minijinja templates (`template.rs`), a node's timeouts and their defaults (`timeouts.rs`),
//!   and `report.rs` behind `shopfloor validate`. **Architecture Invariant:** no workflow text
//!   can overflow a stack or run without bound: an expression holds at most 1,000 bytes, nests
//!   at most 40 levels and no list macro inside another's (each evaluation runs inside an
//!   engine's transaction); a template's tag holds at most 500 bytes and its rendering has fuel.
//! - `walk.rs` — the walker: a pure function from (definition, step history) to the nodes to
//!   start and whether the run is finished (the definition as an indexed graph of typed edges
//!   in `walk/graph.rs`). It stores nothing; property tests drive it.
//! - `store/` — **the one write path**. `Change` (`change/`; its commit in `change/commit.rs`) is one transaction: it locks the
//!   runs it touches, appends run events with gapless per-run sequence numbers, writes audit
//!   entries and wakes, and sends one `NOTIFY` at commit. `steps.rs`, `runs.rs` (submit,
//!   finish, cancel, rerun; the rows in `run_rows.rs`; what a run's end sets off in
//!   `run_ended.rs`, see `engine/src/store/run_ended.rs`, "The order of dependencies"), `approvals.rs`, `workflows.rs`,
//!   `tenants.rs` hold the typed operations; `installations.rs` the App's installations (known only from GitHub: a signed
//!   `installation`/`installation_repositories` webhook or the App's API, unclaimed until an org
//!   claims one with GitHub's proof that its person can access it; the repositories each reaches;
//!   connecting a repository only through an installation the org has and that reaches it);
//!   `github.rs` the
//!   watches of waiting gate and wait steps and the wakes webhooks write for them, and an event
//!   wait's lifecycle events (`run.awaiting` with the event and its deadline, 24 h without a
//!   `timeout:` unless the engine's `SHOPFLOOR_EVENT_WAIT_TIMEOUT_SECS` says otherwise; `run.wait_expired`; `run.wait_withdrawn` when its run ends first); `schedules.rs`
//!   the schedule rows (written with each workflow version) and their firing; `hosts.rs` the host
//!   protocol's writes (registration, claims, starts, session reports, completions: see "A host
//!   runs a crew step"); `admission.rs` admission at the engine and the operator's settings,
//!   `admission/plan.rs` the decision for one run and the writes that apply it,
//!   `admission/gates.rs` its first stage's read (a paused workflow or project, the budgets that
//!   apply, the org's line at submit), which the insert of a new item's trigger event carries
//!   for the run it opens next (`Change::gates_ahead`), a round trip fewer for a webhook
//!   delivery, `admission/lines.rs` the lines, leases and what lets runs through (see "A run is
//!   admitted"); `budgets.rs` spend per org and project per UTC day (`record_spend`,
//!   `record_run_spend`: what hosts' session reports and completions call with the spend added
//!   since the session's previous report, negative for a reported cost that corrects a higher
//!   estimate, never taking a figure below zero; see `engine/src/hosts.rs`, "How spend is known") and the limits that hold runs and stop crew
//!   steps (`hard_stop`); `webhooks_out.rs` outgoing webhook subscriptions (the API answers its
//!   rows as they are, `Subscription`, `Delivery`, `Attempt`; a URL is refused,
//!   422, unless `net_guard` allows its target; its secret stored sealed for it, opened only to
//!   sign a delivery), deliveries (written by `Change::commit` in the statement that inserts the
//!   events) and their attempts;
//!   `engine_errors.rs` a run the engine cannot advance (backed-off wakes, then `engine_error`),
//!   and which errors are a run's own rather than the database's (`run_local`, `is_logic_error`);
//!   `retention.rs` the sweep of finished runs past their project's retention and webhook
//!   deliveries after 7 days, in batches, and the journals' partitions: `run_events` and
//!   `step_logs` are partitioned by month of their run's creation (migration 0022), so a run's
//!   journal lives as long as the run; each sweep makes the months ahead and drops whole the
//!   partitions of months no run is left of (`shopfloor_journal_maintain`). The project's event
//!   stream replays 30 days; `jobs.rs` the
//!   durable timers of work that belongs to no run; `operator.rs` resolving a failed run (marked
//!   handled, `run.resolved`, its status unchanged), edit-and-retry's overrides of a crew node's
//!   prompt, model or harness in one run (`run_node_overrides`; a retry inherits them; host
//!   assignments and the test executor run with them) and draining a host (its claims take
//!   nothing new); `signing_keys.rs` the service-wide JWT signing keys, sealed with the
//!   secret key (`sealing.rs`): the current one (made on first use), rotation (the previous
//!   keys stop signing and go on verifying), retirement (`verify_until` = now + the grace, only
//!   ever brought closer; retiring the current key makes its successor in the same change),
//!   sealing keys an earlier release stored in plaintext, and the read verification makes. No
//!   audit entry for them: audit entries are an org's, a signing key is no org's, and its row
//!   keeps when it was made, stopped signing and stops verifying. An approval ends
//!   `approved`, `rejected`, `timed_out`, or `withdrawn` when its run ends without an answer
//!   (with a `run.wait_withdrawn` event). `messages.rs` intervene: a person's message to a
//!   running crew step held by a host whose harness takes one (`claude-code`; `codex` and
//!   `command` read their prompt to the end of input: a conflict with the reason), stored in
//!   `step_messages` with a `step.message` event (who, the message's id and length, never its
//!   text) and an audit entry; `pending` (a held running step's undelivered messages) and
//!   `delivered` (marked by the holder once written to the harness).
//!   **Architecture Invariant:** nothing outside `store/` writes runs, steps, step_logs,
//!   run_events, audit_log, wakes, approvals or step_messages, and a run's rows are written only while its row
//!   is locked in the same transaction.
//! - `advance.rs` — what the engine does with a locked run: handle due step wakes (lease
//!   expiry, timeouts, waits, backoffs), settle child runs, ask the walker, start nodes; nodes
//!   the engine resolves itself (trigger, decision, end) are resolved at once and the walk is
//!   asked again. Expressions (decisions) and templates (crew and approval prompts, child
//!   inputs) see one context (`run_context::context`, which the host protocol's prompts are
//!   rendered over too): `run`, `input`, `item`, `trigger` (what
//!   started the run, as `if:` saw it; `{source: manual}` otherwise), `project` and
//!   `nodes.<id>.output`. A rerun from a node starts that node itself (the walker would see its
//!   predecessors' reused steps as long finished). A draining engine leaves ready steps pending
//!   with an `execute` wake for another engine instead of leasing them. A step a host holds
//!   is failed for its timeout only 60 s after it (`store::hosts::HOST_STOP_GRACE`): the host
//!   stops its harness at the timeout itself and needs its interrupt grace to report.
//! - `substate.rs` — a running run's substate (queued, executing, waiting_for_agent,
//!   unroutable, sleeping, awaiting_signal, awaiting_child, awaiting_lease, held) derived from
//!   its steps and its place in an admission line by a pure function, with the console's words,
//!   and `why`: what holds a run (with the runs ahead of it in line), in a sentence
//!   (`substate/why.rs`), in at most three indexed queries for any number of runs
//!   (`substate/load.rs`).
//! - `reasons.rs` — machine reasons in words for people (every documented failure reason and
//!   the ones hosts and the engine write, `exit code 3`, `gate:no_commit`), and concurrency
//!   groups by what they lock (`acme/web#7`). The API keeps reasons as they are; the console
//!   shows these words with the machine string beside them.
//! - `admission.rs` — admission's rules: the order of the stages (gates: a paused project or
//!   workflow, a spent budget; the concurrency group; board columns with a WIP limit that the
//!   workflow's `board_move` outputs move cards into; the throttle; the org's cap), group names
//!   (per workflow: `item`, `repository`, `workflow` or a literal), board lines
//!   (`board:<project>:<column, lowercased>`), and the webhook backoff.
//! - `jobs.rs` — what an engine does for no run, outside any transaction: sending a webhook
//!   delivery (`X-Shopfloor-Signature-256: sha256=<HMAC-SHA256 of the body>`, 10 s to answer,
//!   at most 4 KiB of the answer read as it streams before the connection is dropped, retried
//!   1 s, 4 s, 16 s … up to an hour, ten attempts) and a project's retention sweep. Deliveries go
//!   through the engine's `WebhookClient` (in `PoolConfig`, holding the secret key that opens the
//!   subscriptions' secrets): no redirects, no proxy, names
//!   resolved by `net_guard::VettedResolver`. The URL is checked again before each send; a send
//!   refused by the guard is a failed attempt (`refused: NAME resolves to an internal address`)
//!   and the delivery fails at once, without retries.
//! - `net_guard.rs` — which targets outgoing webhooks may reach. `Policy::target` parses a URL
//!   with the `url` crate (WHATWG, as reqwest does: numeric hosts such as `2130706433`,
//!   `0x7f000001`, `0177.0.0.1`, `127.1` are normalized first) and refuses another scheme than
//!   `http`/`https`, userinfo, and internal hosts: loopback, private (RFC 1918, `fc00::/7`),
//!   carrier-grade NAT, link-local, cloud metadata (`169.254.169.254`, `fd00:ec2::254`,
//!   `metadata.google.internal`, …), unspecified, multicast, broadcast, documentation and
//!   reserved ranges, anything outside `2000::/3`, IPv6 addresses by the IPv4 address they carry
//!   (mapped, compatible, NAT64, 6to4, Teredo), and local names (`localhost`, `*.localhost`,
//!   `.internal`, `.local`, a single label). `VettedResolver` wraps a `reqwest::dns::Resolve`
//!   (the system's, or a test's) and refuses a name when any of its addresses is internal, so
//!   the addresses checked are the ones connected to. `SHOPFLOOR_WEBHOOKS_ALLOW_PRIVATE` lets
//!   loopback, private and carrier-grade NAT targets through (on premises, tests), never the
//!   rest. **Architecture Invariant:** no outgoing webhook connects to an address `Policy`
//!   refuses, whatever the DNS answers.
//! - `pool.rs` — the engine loop: `LISTEN`, timer, claim due wakes with `SKIP LOCKED` in
//!   batches, lock runs in id order, advance, commit once; execute leased steps outside any
//!   transaction with heartbeats; record completions fenced by holder, in batches; drain on the
//!   first SIGTERM. Due schedule rows and due jobs (`store::jobs`) are claimed beside the wakes
//!   (`SKIP LOCKED`), and the timer is set to the earliest of the next wake, tick and job. Output steps go to the
//!   output executor when the GitHub App is configured (`SHOPFLOOR_GITHUB_APP_ID` and its key),
//!   other leased steps to the test executor; a deferred output is given back (`running →
//!   pending`) with an `execute` wake. **Architecture Invariant:** no periodic scan; after the
//!   `LISTEN` connection (`listen.rs`) is lost it subscribes again, then rescans once. A batch (of wakes or of completions) that
//!   fails on one of its runs (its logic, or an SQL error its rows cause; not a lost connection,
//!   a timeout or contention, which retry the batch) is rolled back and done again run by run: a
//!   run that fails alone goes to `store::engine_errors` (its wakes back after 1 s, then 4 s;
//!   the third failure, or the first of its logic, fails it `engine_error` with an audit entry
//!   saying why), and a completion whose run cannot be advanced is recorded with a wake to
//!   advance it later, so no step runs twice. **Architecture Invariant:** one bad run never
//!   stops another. Recording (the completions' batches and their run-by-run retry) is
//!   `pool/record.rs`; which errors belong to a run rather than to the database
//!   (`run_local`, `is_logic_error`) is `store::engine_errors`, which both paths ask.
//! - `hosts.rs` — the host protocol's model: `Capability` (parsed), the `Assignment` a claim
//!   hands out (rendered prompt, harness, caps with the step's timeout, repository, branch,
//!   issue, whether the agent writes a pull request description), what a session's `Usage`
//!   (`protocol`'s) has spent (`reported`, `estimated`, `spend_figure`), and the branch
//!   name `shopfloor/<issue>-<slug>` (lowercase title, runs of other characters one hyphen,
//!   trimmed, cut at 40, a trailing hyphen dropped; `shopfloor/<run>` without an issue), written
//!   once (`issue_branch`, which the pull request output takes too). With the feature `schema`
//!   (the API's) the `Assignment` is also the host protocol's OpenAPI schema (`AssignmentDoc`;
//!   its caps and item are `protocol`'s).
//! - `executor.rs` — the test executor (no-op work, a file of effects, a crew step's cost
//!   reported as a session would with `input.test.cost_usd`) used by tests and benchmarks with
//!   `--test-executor`. Without it, crew/gate/output steps wait for hosts and
//!   integrations.
//! - `catalog.rs` — parsed definitions of workflow versions, cached per process (versions are
//!   immutable).
//! - `triggers/` — GitHub triggers. `projection.rs` makes the item projection from webhook
//!   payloads (issue or pull request state, labels, assignees, head SHA, latest comment and
//!   review, check results on the head, board column; hidden HTML comments stripped from text);
//!   `ingest.rs` handles one delivery in one `Change`. What an item's or a check's delivery is
//!   about is read from its payload first (`Subject`), so that the statement recording the
//!   delivery also routes it (`store::triggers::record_delivery` with a `RouteAsk`): the
//!   projects that connected the repository, with their workflows; the envelope's
//!   `repository.default_branch` made the connected repository's, written only when it changed;
//!   and a wake for each step watching the issue or pull request. A delivery that opens a run is
//!   `BEGIN`, six statements and `COMMIT`; its outcome rides in the commit's events statement
//!   (`Change::finish_delivery`). Two things the store reads
//!   too stand outside, below it, re-exported here: `judge.rs` (top-level) decides whether a
//!   workflow fires (`events`, the CEL `if:` over `item`, `trigger`, `project`, and who may
//!   trigger: OWNER/MEMBER/COLLABORATOR and never bots unless `senders: any`); `item_keys.rs`
//!   holds the content hash (SHA-256 of canonical JSON without timestamps) and the dedup keys
//!   `[workflow, repository, number, content_hash(, generation)]`. Their writes are in
//!   `store/triggers/`: `items.rs` (deliveries, items, check results, the workflows that listen),
//!   `claim.rs` (trigger events, the claim rule, revocation, re-judging), `cycle_budgets.rs`
//!   (asks and resets); `store/triggers.rs` hands them the run operations they need
//!   (`runs::CLAIM_RUNS`); installations are in `store/installations.rs`. **Architecture Invariant:** nothing here calls
//!   GitHub; re-judging a queued event uses the stored projection, which webhooks keep current.
//! - `github/` — what the engine does on GitHub. `client.rs`: the GitHub App through octocrab
//!   (an RS256 JWT as the App; installation tokens scoped to the one repository a step needs and
//!   to the permissions of its use (`Scope`: a host's push `contents: write`; a pull request
//!   `pull_requests: write`; comments and labels `issues`/`pull_requests: write`; board moves
//!   `organization_projects: write`), cached per scope until five minutes before they expire; an
//!   installation's own description and repository list for claims; base URLs from `SHOPFLOOR_GITHUB_API_URL` and
//!   `SHOPFLOOR_GITHUB_GRAPHQL_URL`), every answer classified: 4xx final, a secondary or exhausted
//!   rate limit a deferral until GitHub's time, 5xx and timeouts retried (1 s, 2 s, 4 s) and then
//!   an outage, deferred too. `outputs.rs`: the output executor (`pull_request`, `comment`,
//!   `label`, `board_move`), idempotent after a crash: an open pull request on the run's branch is
//!   looked for before one is opened, a comment carries `<!-- shopfloor:<run>:<node> -->` and is
//!   looked for before it is posted; the test hook `SHOPFLOOR_TEST_CRASH_AFTER=pr_opened|comment_posted`
//!   aborts the process right after GitHub acted. `watch.rs`: gates on checks and waits on GitHub
//!   events, decided under the run's lock from what the webhooks stored. **Architecture
//!   Invariant:** GitHub is called outside any transaction, and only by the output executor
//!   (under a fenced lease), the host protocol's claim (an assignment's token), an installation
//!   claim and a repository connect (`api/src/http/installations.rs`, `repositories.rs`);
//!   advancing a run and ingesting a webhook never do.
//! - `schedule.rs` — cron arithmetic for `on.schedule` (croner, in the schedule's time zone): the
//!   next tick, and the latest tick at or before a moment (the one a downtime fires).
//! - `listen.rs` — the one `LISTEN` connection of a process, used by the engine loop
//!   (`pool.rs`) and an API replica's event hub (`api::http::events`): tokio-postgres, because
//!   its socket gets TCP keepalives and a user timeout (`Keepalive`: 10 s idle, 3 probes 5 s
//!   apart, user timeout 25 s by default; `SHOPFLOOR_LISTEN_KEEPALIVE_*`), which sqlx 0.8 cannot
//!   set, and the same limits asked of the server through startup `options`. `Target` reads a URL
//!   with sqlx's parser (`db::parse_url`: the same URLs, `PG*` variables and `.pgpass` as the
//!   pool; no TLS, like the pool: a `sslmode` that requires it is refused) and never shows the
//!   password. **deadpool-postgres is used here, and only here**: a pool of one makes the
//!   connection within 10 s, subscribed before it is handed out, with `Fast` recycling
//!   (`is_closed()`, no statement; the other methods send one, `Clean` even `UNLISTEN *`).
//!   Hand-written, because deadpool has no place for them: the task that drives the connection
//!   and forwards its notifications (deadpool's own task drops them), the report of a loss while
//!   idle (deadpool looks at a connection only when one is asked for, and a listener asks once),
//!   and the backoff between failed attempts (`listen::Backoff`: 1 s, doubling, at most 5 s).
//!   See `engine/src/listen.rs`, "Network cuts".
//! - `db.rs` — connecting (`connect_guarded`: the serving processes' connections under
//!   `GUARDS`, a 10 s statement, 5 s lock and 15 s idle-in-transaction timeout, so a frozen
//!   process's transaction is ended and its locks released, and the server's TCP keepalives), and `Db`, what every pool is held
//!   as: single statements on `&Db` and transactions through `Db::begin` (no `acquire`). A
//!   begin runs on a task of its own and always finishes, so a caller dropped mid-`BEGIN` never
//!   returns a connection left inside a transaction to the pool (sqlx 0.8.6 would:
//!   transact-rs/sqlx#4393); the tenant scope, task-local, is read in the caller's task first.
//!   A commit (`Db::commit`, which `Change::commit` and the single statements wrapped in a
//!   transaction use) runs on a task of its own too, so a caller dropped mid-`COMMIT` leaves
//!   the change committed, not a `ROLLBACK` sent after it (PostgreSQL's "there is no transaction
//!   in progress", which a host dropping its watching claim caused).
//!   On `Route::Pooler` (a transaction pooler in
//!   `DATABASE_URL`, which the CLI takes when `SHOPFLOOR_LISTEN_DATABASE_URL` is given) a single
//!   statement is a transaction of its own, each transaction begins `BEGIN; DEALLOCATE ALL` with
//!   the `GUARDS`' timeouts `SET LOCAL`, and the statement cache is off, because sqlx sends a statement in
//!   two exchanges between which a pooler may lend the server session to another client (see
//!   `engine/src/db.rs`, "Behind a transaction pooler"). `is_transaction_pooler` tells one by `pg_backend_pid()`
//!   (`shopfloor check`). **Architecture Invariant:** nothing sets session state on a pooled
//!   connection: no `SET` but `SET LOCAL`, no `set_config(…, false)`, no session advisory lock,
//!   no `LISTEN`; those go to the direct URL. The embedded `MIGRATOR` (run on a
//!   connection of its own without those limits), the schema version check.
//! - `db/conns.rs` — the connections behind a `Db`: a deadpool of sqlx connections and `Tx`, the
//!   transaction holding one (used as the connection, `&mut *tx`). sqlx's own pool pings each
//!   connection as it comes back, a round trip per transaction (about 2–3% of a webhook
//!   delivery's CPU and of the engine's runs per second, bench/history.md 2026-12-05); here a
//!   connection goes back without one when its use finished. A transaction takes one that came
//!   back under 500 ms ago without a ping (`PING_AFTER_IDLE`, HikariCP's bypass window), and its
//!   `BEGIN`, which changes nothing, finds one the server closed meanwhile and tries the next;
//!   single statements, connections idle longer and those whose use was cut short are pinged
//!   first. A `Tx` dropped open is rolled back at once on a task of its own, so its locks are
//!   not held until the connection's next use. `Db::pool` is sqlx's own pool beside it, opened
//!   only when used (tests, the migrator).
//! - `tenancy/` — the org a request acts for (`scope.rs`, below `db.rs`: a task-local slot,
//!   `scoped`, filled by `act_for`, and `enter`, what a tenant transaction begins with, given the
//!   scope's org by `Db::begin`) and the
//!   tenant pool (`mod.rs`, `tenant`): a `Db` beside a given one whose every transaction
//!   begins by taking the role `shopfloor_tenant` and setting `shopfloor.org` to the beginning
//!   task's org, both `LOCAL` (empty outside a scope: no rows); a single statement on it is a
//!   transaction of its own. Nothing is set on the session, so nothing outlives a transaction,
//!   on a direct connection or behind a transaction pooler alike. Without the role (migration
//!   0016 could not make it) the pool keeps the owner's role and warns once. See `engine/src/tenancy/mod.rs`, "The walls between tenants".
//! - `metrics.rs` — the process's one Prometheus registry (prometheus-client) and every metric:
//!   wakes claimed and their lateness (due time to claim), steps started and finished by kind and
//!   outcome with their durations, lease expiries, runs started and finished by status, HTTP
//!   requests by method, route template and status with their latency, GitHub webhooks received by
//!   event and outcome, outgoing webhook deliveries by event and outcome, spend in USD. A
//!   `Change` gathers what it did in a `Tally` that counts only after its `COMMIT` succeeds (a
//!   rolled-back change counts nothing). Read from the database at each scrape instead: running
//!   runs by substate (one query over the partial index of running runs and each run's open
//!   steps; it does not look at hosts, so an unroutable step counts as `waiting_for_agent`) and
//!   admission queue depths by kind of line (`admission_queues.waiting`); every process that
//!   serves `/metrics` reports the same figures for these (aggregate with `max`). `render` gives
//!   the OpenMetrics text. **Architecture Invariant:** no label carries tenant data or a secret:
//!   routes are templates, queues are kinds, webhook events are GitHub's event types (`unverified`
//!   until the signature holds).
//! - `trace.rs` — one trace per run, with the `spans` crate's `TraceParent` and `step_span`
//!   (below). A webhook delivery (`triggers::ingest`) or an API request gives its span's context
//!   to its `Change` (`set_trace`); `runs::submit` stores it with the run (`runs.trace_id`,
//!   `runs.traceparent`; a child run without one takes its parent's); a step's span is made in
//!   `pool.rs` around a leased step's execution, in `advance.rs` around a trigger or end node's
//!   resolution, and in the host around an attempt (the `Assignment` carries `traceparent`).
//!   Without an OpenTelemetry layer (no OTLP endpoint) spans have no context and runs store none.
//! - `event_log.rs` — each run event as a log record with the fixed key list `KEYS`
//!   (`shopfloor.org`, `.project`, `.run.id`, `.node`, `.attempt`, `.outcome`, `.outcome.reason`,
//!   `.workflow.version`, `.duration_ms`, `.cost.usd` to six decimals, `gen_ai.request.model`,
//!   `gen_ai.usage.input_tokens`/`output_tokens`, `vcs.repository.url.full`, `vcs.ref.head.name`,
//!   `vcs.ref.head.revision`): `EventRecord::new` refuses a key outside the list, a key twice and
//!   a string over 500 characters, and holds a null for each key without a value. `Change` keeps
//!   what it inserted (with facts not stored: durations, a step output's git refs) and hands it to
//!   `emit` after its `COMMIT` succeeds, outside the transaction; the sink is installed by
//!   `api::telemetry` only when the event log is exported, and without it no record is built.
//!   **Architecture Invariant:** a rolled-back change logs nothing, and no record carries a key
//!   outside the list or a secret.
//! - `sealing.rs` — the service's secret key (`SHOPFLOOR_SECRET_KEY`: 32 bytes, base64) and
//!   what it seals (`Sealed`: a signing key by `kid`, a webhook subscription's secret by id):
//!   XChaCha20-Poly1305 (RustCrypto) with a random nonce and the kind and id as associated data,
//!   `version || nonce || ciphertext || tag`; and stream positions, deterministically
//!   (`seal_position`: AES-SIV, RustCrypto's `aes-siv`, under an HMAC-derived key of their own,
//!   bound to the project). A wrong key, another row or kind, or a changed byte is an error,
//!   never a panic; `Debug` shows no key.
//! - `cluster.rs` — the embedded PostgreSQL cluster (initdb, a free loopback port, run as the
//!   `postgres` OS user when we are root): `cluster/os.rs` the machine's server binaries and
//!   OS user, `cluster/server.rs` one data directory's server, `cluster/error.rs` its errors.
//! - `run_context.rs` — a run's template context (`context`): what decisions, approval and
//!   crew prompts and child inputs are rendered over, read by the engine and the host protocol.
//! - `testkit.rs` (feature `testkit`) — a per-test database cloned from a migrated template,
//!   and what tests share: `seed` / `new_run` (an org, project and workflow, and a plain run
//!   of it), `org_with_people` (an org, its project and a member per role, whose tokens the API's
//!   and the console's tests issue), `pool_config` and `Engine` (an in-process engine's
//!   configuration, and the engine running until stopped; `Engine::executing` with the test
//!   executor), `OwnCluster` (a throwaway cluster of one test's own, stopped when dropped),
//!   `join_and_loop` / `FAN_OUT_JOIN_LOOP` (the fan-out, join and loop-back workflow) and
//!   `APPROVAL` (a run parked at an approval with a required field).
//!
//! # Scaling out
//!
//! API replicas and engines are stateless and scale out on Kubernetes (the Helm chart's two
//! Deployments); PostgreSQL is the one shared part, so its primary is where one installation's
//! ceiling is.
//!
//! **Engines on one database**, measured by `make bench`'s engine figure with `BENCH_ENGINES`
//! set (5,000 three-step runs each, test executor, on the bench's durable cluster, the quiet
//! 2-core machine, two rounds back to back; bench/history.md, 2026-12-03, "Engine count, on the
//! quiet machine"):
//!
//! | engines | runs/s | pgbench tps, same run | runs/s ÷ tps |
//! |---:|---:|---:|---:|
//! | 1 | 620, 561 | 6,696, 5,867 | 0.093, 0.096 |
//! | 2 | 900, 786 | 6,511, 6,449 | 0.138, 0.122 |
//! | 4 | 676, 475 | 6,204, 5,726 | 0.109, 0.083 |
//!
//! What bounds it: on this 2-core machine PostgreSQL and the engines share the CPUs, and the
//! database is CPU-bound at the cost per run below. A second engine adds about 40% (one
//! engine waits on its own round trips: it keeps at most four recording transactions in
//! flight). Four engines fall back to about one engine's figure or below: the profile shows the same statements with the
//! same calls a run, each taking about twice as long, because four engine processes take the
//! database's CPU; on separate machines (the Helm chart's engine Deployment) they would not.
//! The usual ceilings of LISTEN/NOTIFY are not what binds here,
//! but they are near: a notifying commit takes a cluster-wide lock, and every engine
//! transaction that leases a step notifies once (its lease-expiry wake must be known to the
//! other engines), so the lock is taken once per claim or recording transaction, each carrying
//! several runs' work, not once per step; changes that wrote only events tell the streams at
//! most every 50 ms per process. Each engine and API replica holds one LISTEN connection, so
//! the fan-out is one delivery per process per notifying commit: with many engines on one
//! primary, a notification per lease is the first thing to batch further.
//!
//! **What one primary carries.** `BENCH_PROFILE=1` with two engines on the quiet machine
//! (2026-12-03) puts PostgreSQL's statement time at about 1.6 ms a three-step run (4.5 ms on the
//! shared machine of 2026-12-02, 2.9 ms on a quiet one before that round's changes), the largest
//! parts the lease with its recovery wake, the terminal updates, the step inserts and the
//! journal's flush. With the profile's statement time per run, a primary with N cores spent on
//! engine work carries about N / that figure runs per second; a three-step run is about 11
//! journal events and 3 step rows, with 3 wakes written and deleted: at 1.6 ms, about 600 runs/s
//! per core, which matches the 841 runs/s the full run measured with PostgreSQL on about 1.3 of
//! the two cores (945 runs/s after migration 0025 took one key check off every journal event).
//! Beyond that: more cores and faster fsync on the primary first (the engine's throughput
//! follows `pgbench -N`'s, `engine_runs_per_s_vs_pgbench_tps`), then sharding.
//!
//! **Sharding by org with Citus** (distributed on `org_id`; every query of the product is
//! already scoped to one org, and row-level security walls each org's rows):
//!
//! - *Distributed on `org_id`, co-located:* `runs`, `steps`, `run_events` and `step_logs`
//!   (partitioned by month; Citus distributes partitioned tables), `wakes`, `approvals`,
//!   `concurrency_leases`, `admission_queues`, `admission_waits`, `admission_starts`, `items`,
//!   `trigger_events`, `item_cycle_budgets`, `audit_log`, `budgets`, `spend`, `projects`,
//!   `workflows`, `workflow_versions`, `schedules`, `memberships`, `users`, `hosts`,
//!   `api_tokens`, `repositories`, `github_checks`, `github_watches`, `step_sessions`,
//!   `run_log_sizes`, `step_messages`, `run_node_overrides`, `board_limits`,
//!   `idempotency_keys`, `jobs`, `webhook_subscriptions`, `webhook_deliveries`,
//!   `webhook_attempts`.
//! - *Reference tables (copied to every node):* `orgs`, `signing_keys` (no org's),
//!   `github_installations` and `github_installation_repositories` (an installation is no
//!   org's until one claims it), `github_deliveries` (deduplicated by GitHub's delivery id before
//!   the org is known).
//! - *What stands in the way in today's schema:*
//!   - primary keys and unique constraints without `org_id`, which Citus needs in every
//!     unique index of a distributed table: `runs (run_id)`, `steps (step_id)` and
//!     `(run_id, node, visit, attempt)`, `run_events (run_id, seq, run_created_at)`,
//!     `step_logs (step_id, seq, run_created_at)`, `wakes (wake_id)`, `approvals (step_id)`,
//!     `concurrency_leases (run_id, group_key)`, `item_cycle_budgets (item_id, workflow_id)`,
//!     `items (project_id, key)`, `workflows (project_id, name)`, `repositories (project_id,
//!     full_name)`, `github_checks (project_id, …)`, `schedules (workflow_id)`,
//!     `jobs (kind, subject)`, `hosts (host_id)` and `registered_with`, `api_tokens (jti)`,
//!     `audit_log (audit_id)`, `webhook_deliveries (delivery_id)`, `step_messages
//!     (message_id)`, `board_limits`, `run_node_overrides`; and the foreign keys between them,
//!     which must carry `org_id` too (`steps → runs` as `(org_id, run_id)`);
//!   - cross-org statements: the wake claim (`DELETE FROM wakes WHERE due_at <= now() ORDER BY
//!     due_at LIMIT n FOR UPDATE SKIP LOCKED`), the jobs' and schedules' claims and the pool's
//!     `next_due` read every org's rows at once: under Citus each engine would claim per shard
//!     (engines assigned to shard groups, or one claim per worker), since a multi-shard
//!     `ORDER BY … LIMIT … SKIP LOCKED` is not distributed;
//!   - LISTEN/NOTIFY is per node: a NOTIFY committed on a worker reaches only that worker's
//!     listeners, so engines and API replicas would listen on each worker (or the wakes be
//!     announced through the coordinator);
//!   - the event streams' order, `(xid, event_id)` below `shopfloor_event_horizon()`: xids and
//!     snapshots are per node and identity sequences are not monotonic across shards, so a
//!     stream position would become one position per worker (a vector), and the project
//!     stream's `Last-Event-ID` with it;
//!   - `audit_log.audit_id`, `wakes.wake_id`, `jobs.job_id`, `run_events.event_id`: identity
//!     columns, unique under Citus but ordered only per shard; the audit log's order already
//!     ties on time first.
//!
//! No migration is made here; the order of work would be: `org_id` into every key and foreign
//! key (one migration, no behaviour change on one node), per-worker claims and listeners, then
//! vector stream positions.

pub mod admission;
pub mod advance;
pub mod catalog;
pub mod cluster;
pub mod db;
pub mod definition;
pub mod event_log;
pub mod executor;
pub mod github;
pub mod hosts;
pub mod ids;
pub mod item_keys;
pub mod jobs;
pub mod judge;
pub mod listen;
pub mod metrics;
pub mod net_guard;
pub mod pool;
pub mod reasons;
pub mod run_context;
pub mod schedule;
pub mod sealing;
pub mod state;
pub mod store;
pub mod substate;
pub mod tenancy;
pub mod trace;
pub mod triggers;
pub mod walk;

#[cfg(feature = "testkit")]
pub mod testkit;
