//! The host agent (`shopfloor host`): it registers with a registration token, claims crew steps
//! its capabilities satisfy, runs each with its harness (Claude Code, Codex, or a command) in a
//! git worktree of a cached clone, streams the session to the server, and reports the outcome.
//!
//! - `config` — the settings (flags and `SHOPFLOOR_*` variables).
//! - `client` — the host protocol as the host calls it.
//! - `agent` — the loop: registration, recovery from the journal, claims, slots, drain.
//! - `attempt` — one attempt: worktree, harness, supervision (timeout, cancel), commit, push,
//!   report, cleanup.
//! - `harness` — each harness's command line and the reading of its output.
//! - `prices` — the price table spend is estimated with while a session runs.
//! - `git` — the cached clone, worktrees, commits and pushes, every call time-limited.
//! - `process` — process groups, bounded calls, liveness, and the shutdown signals every
//!   `shopfloor` process uses.
//! - `journal` — the per-attempt journal, written before each action.
//! - `recovery` — the decision, after a restart, about each journalled attempt.
//! - `trace` — the attempt's span, in its run's trace (the assignment's `traceparent`).
//!
//! The host is a client of the API and nothing else: it holds no database connection, and it
//! never writes the installation token or its own credential where a harness can read them.
//!
//! # A host runs a crew step
//!
//! 1. An admin makes a registration token (`POST …/projects/{project}/host-registrations`).
//!    `shopfloor host --server … --token … --capabilities linux,harness:claude-code --slots 2`
//!    calls `POST /api/v1/host/register`; `store::hosts::register` inserts the host and revokes
//!    the token in one `Change`, and the answer is a host credential, which the host keeps in its
//!    work directory and uses from then on.
//! 2. The engine's walk starts a crew node: `steps::create` writes it `pending` with the node's
//!    `requires` and `harness:<its harness>` (`hosts::crew_requires`; an edit-and-retry's harness
//!    when it changed it), so a host that cannot run the harness never claims it and a run no
//!    capable host can take is `unroutable`, naming the missing capability; an engine without an executor for it (`advance::take_or_offer`) leaves it to
//!    the hosts and its change ends with `NOTIFY … 'w0'`.
//! 3. The host's claim (`POST /api/v1/host/claim`, `max` = free slots, `held` = its steps) waits
//!    on the replica's event hub. The notification bumps the hub's `ready` signal, and the claim
//!    runs `store::hosts::claim`: the host's row is locked (its slots are counted under that
//!    lock), the oldest ready crew steps of its project whose `requires` its capabilities hold are
//!    read, their runs locked `FOR UPDATE SKIP LOCKED` (a run an engine holds is passed over and
//!    looked at again 100 ms later), and each is leased (`pending → leased`, holder
//!    `host:<id>`) with its `lease_expiry` wake. The assignment carries the rendered prompt,
//!    the caps (the step's timeout; the node's `caps.turns`, passed as `--max-turns`; and the
//!    dollars the session may spend, passed as `--max-budget-usd`: the least of the node's
//!    `caps.usd` and what is left of the run's hard `usd_per_run` and of the project's and the
//!    org's hard daily and monthly limits, `budgets::remaining`; nothing left fails the step
//!    `budget_hard_stop`), whether the step must change files (`expect: changes`, by default
//!    when a pull request is opened from its work; `expect: any` says otherwise), the repository if the run is about a connected one, the
//!    branch `shopfloor/<issue>-<slug>` and whether a pull request will be opened from this work.
//!    After the claim's commit, the replica mints a token of the repository's installation for
//!    that repository alone (`GithubApp::installation_token`, cached until shortly before it
//!    expires) when the GitHub App is configured; without one the host's own git credentials
//!    apply. That token lasts an hour and the journal never keeps it, so the host asks for a
//!    fresh one for the step it holds (`POST /api/v1/host/steps/{step}/token`, fenced by its
//!    lease) before each fetch and push and after adopting an attempt.
//! 4. The host journals the attempt, fetches its cached clone and makes the attempt's worktree
//!    (a clone borrowing the cache's objects) at the branch's tip on the remote (a later run on
//!    the issue goes on from the earlier one's commits) or the default branch's, renewing the
//!    lease every 10 s meanwhile. It calls `start` (`leased → running`, a `step.running` event),
//!    journals `launching`, starts the harness inside its walls (see "What a crew step may
//!    reach"), bwrap the leader of a new process group, with the prompt on stdin (Claude Code's as a
//!    stream-json user line, its input kept open for people's messages until a result line comes
//!    with none waiting) (plus, when a pull
//!    request follows, the request for its description, from `.github/pull_request_template.md`
//!    when the repository has one) and its output going to a file, and journals its pid.
//! 5. While it runs, the host reads the file as it grows: each line is numbered and sent in
//!    session reports about once a second (`store::hosts::report`: the lines the run's 8 MiB
//!    transcript cap has room for, with a note when it is reached; the cumulative tokens, cost,
//!    turns; the lease renewed; no event). A report or heartbeat finds the step over a hard
//!    budget (`budget_hard_stop`, final) or its session past the node's `caps.turns`
//!    (`turn_cap`, ordinary: a harness that ignores its own `--max-turns`) and fails it. Each
//!    report's and heartbeat's answer says whether to stop, and carries people's undelivered
//!    messages (intervene), which the host writes to Claude Code's input as user lines and
//!    acknowledges; so does the claim, which the host keeps open (asking for nothing when its slots are
//!    full): a cancel's `step.cancelled` event reaches it through the hub's feed at once.
//! 6. At the timeout, told to stop, or once the session's spend reaches its caps' `usd` (the
//!    host's own count: `budget cap reached`, final), the host journals the reason, sends SIGINT
//!    to the group, and SIGKILL after the grace (30 s for a timeout, at most 3 s for a cancel),
//!    reading what the CLI prints meanwhile (Claude Code prints its final cost and turns; Codex
//!    writes its last token count to its session file). When the harness has exited, whatever
//!    it left in its group is killed. A step the server ended (a cancel, a hard budget) is then
//!    reported all the same: its end stands and its work is not pushed, but the session's final
//!    figures are recorded (see 7).
//! 7. On success the host commits what the agent left uncommitted and pushes `HEAD` to the
//!    branch (never forced); a step that must change files and changed none fails `no_changes`,
//!    one whose push the remote refuses fails `push_refused` (not retried).
//!    It journals the result, then calls `complete`: `store::hosts::complete` locks the run,
//!    moves the step fenced on its holder (`running → succeeded | failed`), writes the
//!    `step.session` event with the figures, and wakes the run for an engine, which advances it.
//!    A step the server ended while this host held it keeps its end: the result is dropped, the
//!    figures are recorded (the spend corrected to the CLI's own final figure, the event marked
//!    `after_end`) and the answer is its state; a step another host holds answers 409.
//! 8. The host removes the worktree and the journal entry. Had it died instead, the lease would
//!    lapse: 45 s later the engine fails the step `lease_expired` (infrastructure) and the walk
//!    starts a new attempt, which any capable host claims. Started again, the dead host decides
//!    about each journalled attempt (`recovery::decide`): it adopts a harness still running for
//!    a step still its own, terminates one whose step moved on, and reports a result it had
//!    journalled but not sent.
//!
//! # Its modules
//!
//! The host agent: a client of the host protocol, nothing else (no database connection).
//!
//! - `client.rs` — the protocol's calls, with the server's answers read leniently (unknown
//!   fields ignored), and the host's side of the wire types that differ from the server's; the
//!   shared ones are `protocol`'s.
//! - `config.rs` — the settings: `--server`, `--token` (a registration token on first start; the
//!   credential it gets is kept in `<work-dir>/credential.json`, mode 0600), `--capabilities`,
//!   `--max-concurrent` (`--slots`), `--work-dir`, `--claude-command`, `--codex-command`,
//!   `--git-url-template` (`{repo}`: a mirror, or local bare repositories in tests),
//!   `--interrupt-grace-secs` (30), `--git-timeout-secs`, `--heartbeat-secs` (10),
//!   `--drain-secs`, `--git-author`, `--prices`, `--pass-env` (the host's variables a harness
//!   gets, by name: the model APIs' keys and base URLs unless told otherwise), `--unsandboxed`,
//!   the limits (`--max-processes`, `--max-memory-mib`, `--max-cpu-secs`), `--egress-allow`;
//!   each also a `SHOPFLOOR_*` variable. The walls are probed here: a host that cannot build
//!   them stops before registering (see `host/src/walls.rs`, "What a crew step may reach").
//! - `walls.rs` — the walls around a harness (bubblewrap's namespaces and mounts, every
//!   capability dropped; `Walls::probe` at start, `Walls::wrap` for each launch); `process.rs`
//!   interrupts a walled harness without signalling bwrap, whose end would take the harness
//!   before its last word.
//! - `limits.rs` — each step's control group (v2, else v1): made with its limits, joined by the
//!   harness before it runs, read for a limit reached, removed after.
//! - `egress.rs` — what a walled step may reach and on whose word; `egress/proxy.rs`, the
//!   host's proxy for each step (on a unix socket in its attempt directory, refusals reported
//!   with its session); `egress/bridge.rs`, `shopfloor room`, which runs first in the room and
//!   carries the harness's connections to that proxy.
//! - `attempt/room.rs` — a step's room: its home (the harness's `HOME`, with copies of the host
//!   user's Claude Code login and settings), Codex's home, what the walls hide and bind back,
//!   the harness's environment, built from nothing, and its way out (the proxy, with what the
//!   step may reach: the operator's list, the model API's endpoints and base URLs, the node's).
//! - `agent.rs` — the loop: lock the work directory (`flock`), register once, recover the
//!   journal, then keep exactly one claim open: asking for its free slots, or for nothing (a
//!   watch) when they are full, so a cancel or a lapsed lease reaches it at once; a watch is
//!   dropped and replaced when a slot frees, a claim that asks for work never is (it may hold
//!   leases). First SIGTERM: no more claims for work, running steps go on for the drain time,
//!   then are handed back (`host_draining`, infrastructure, retried elsewhere); a second signal
//!   exits at once.
//! - `attempt.rs` — one attempt (see the walkthrough; what attempts share and how one is told
//!   to stop in `attempt/signal.rs`, the running harness's session in `attempt/session.rs`); the reporter task beside it sends the
//!   session about once a second and heartbeats, and stops the harness when an answer says so.
//!   Before each fetch and push, and after adopting an attempt, it asks for a fresh
//!   installation token (`client::token`; kept in memory, the one at hand used when the server
//!   cannot give one). Claude Code's input is written by `converse`: the prompt as the first
//!   stream-json user line (an `SDKUserMessage`), each person's message from the answers as a
//!   further one (acknowledged once written); it is closed at a result line when no message
//!   waits, so Claude Code answers what it has and exits. An adopted harness's input went with
//!   the host that started it: it takes no messages.
//! - `harness.rs` — how a harness run ended (`Ended`, from its output and exit: a command's exit
//!   code; the CLI's last words when it ended before a result or a turn, `no turn completed (exit
//!   code 1): Not inside a trusted directory…`; the tool calls it was refused) and what budgets
//!   count of it (`spend`). Under `harness/`: `command_line.rs`, each CLI's command line from the
//!   assignment's caps and the node's policy (see `host/src/harness/command_line.rs`, "Each policy's flags"); `claude.rs`, Claude
//!   Code's stream-json: its assistant lines (the last snapshot per message id, tool calls, an
//!   estimate per message), its result line (the last of several; cost rounded to 6 decimals,
//!   turns, tokens summed over every model of `modelUsage` (a budget stop zeroes `usage`; helper
//!   models and an interrupted call appear only there), the model the one asked for among
//!   `modelUsage`'s, or the init line's, never `<synthetic>`; its `permission_denials`, the
//!   refused calls; an `error_…` subtype or `is_error` fails: `error_max_turns` → `turn cap
//!   reached`, `error_max_budget_usd` → `budget cap reached` (final), `api_error_status` → `API
//!   error N: <the API's words>`, final for a 4xx but 408/429; a result line with no cost settles
//!   nothing); no result line → the snapshots, output tokens a lower bound; `codex.rs`, Codex's
//!   `exec --json` items and turns (only `turn.failed` or no `turn.completed` fails; a refused
//!   request's message is the API's JSON error body, final by its `type`; else classed by the
//!   status it names; top-level `error` events are retries), its session file (running token
//!   totals, model calls as turns, the tool calls its sandbox refused), the `{"id", "msg"}`
//!   events of Codex before 0.44, its model the assignment's; `pull_request.rs`, the description
//!   the agent is asked for (after a `PULL REQUEST` line, starting `Closes #<issue>`). The unit
//!   tests, `harness/tests.rs`, read every fixture of `host/tests/fixtures`: recordings of the
//!   pinned CLIs against `tests/model_fake`, and real-format transcripts of older releases.
//! - `prices.rs` — the price table (`host/prices.json`, or `--prices`) estimates are made with,
//!   and the models each pinned CLI uses by default or offers (see `engine/src/hosts.rs`, "How spend is known").
//! - `git.rs` — one bare cached clone per repository (`repos/<owner>/<name>.git`), a worktree
//!   per attempt that is a clone of its own borrowing the cache's objects (`git clone --shared`:
//!   the agent's commits never reach the cache other attempts read), detached at the branch's tip
//!   on the remote (or the default branch's), commits by the host's author, `git push origin HEAD:refs/heads/<branch>` (never forced). The
//!   installation token reaches git only through `GIT_CONFIG_*` variables of fetch and push.
//!   A push the remote's rules refuse (`! [remote rejected]` for a protected branch, a hook, a
//!   repository rule, GitHub refusing the App's token a change under `.github/workflows/`) is
//!   `GitError::Refused`, with the refused ref and the remote's words: the step fails
//!   `push_refused`, class `final`, since another session would be refused the same. Any other
//!   push failure (a cut connection, the remote failing, a branch that moved meanwhile) is
//!   `push_failed`, infrastructure, retried from the remote's branch.
//! - `process.rs` — process groups: a harness is the leader of its own group, writing to a file
//!   in its attempt directory (so it can be adopted after a restart of the host); `call` runs a
//!   bounded command (every git call) and kills its group past its limit; liveness by pid and
//!   start time (a reused pid is another process; a zombie is not alive); and `shutdown_signals`,
//!   the first SIGTERM draining and the second aborting, which `serve`, `api` and `engine` use too.
//! - `journal.rs` — `<work-dir>/journal/<step>.json`, written (temporary file, fsync, rename)
//!   before each action: claimed, prepared, launching, running (pid), exited (the result),
//!   reported, cleaned, and the reason the host is terminating the harness, written before the
//!   first signal. The installation token is never written.
//! - `recovery.rs` — the decision about each journalled attempt after a restart, a pure function
//!   of the journal and what is seen (the process alive; the server: ours, moved on, unsure,
//!   unreachable): nothing, clean, adopt, wait, defer, observe, conclude, terminate; unit tests
//!   cover every case. **Architecture Invariant:** no decision adopts a dead process or concludes
//!   a live one, and an attempt the host was terminating is concluded with the reason journalled
//!   before the kill.
//! - `trace.rs` — an attempt's span: the `spans` crate's step span with `shopfloor.harness`,
//!   child of the run's trace through the assignment's `traceparent` (exported when the process
//!   exports).

pub mod agent;
pub mod attempt;
pub mod client;
pub mod config;
pub mod egress;
pub mod git;
pub mod harness;
pub mod journal;
pub mod limits;
pub mod prices;
pub mod process;
pub mod recovery;
pub mod trace;
pub mod walls;

pub use config::HostArgs;

/// Why the host agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// It could not start: settings, work directory, credential.
    #[error("{0}")]
    Setup(String),
    /// The server refuses its credential (the host was deregistered, or the credential expired).
    #[error("the server refuses this host's credential: {0}")]
    Refused(String),
}

/// Runs the host agent until a signal stops it.
pub async fn run(args: HostArgs) -> Result<(), HostError> {
    agent::run(args).await
}
