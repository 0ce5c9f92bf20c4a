//! The operator's command line: subcommands that talk to a shopfloor server over its REST API,
//! and never to the database (`login`, `context`, `runs …`, `approve`, `reject`,
//! `workflows …`, `hosts …`, `projects …`, `members …`, `webhooks …`, `audit list`,
//! `tokens …`, `budgets show|set|remove`).
//!
//! Where the server and token come from: `SHOPFLOOR_SERVER` and `SHOPFLOOR_TOKEN`, else the file
//! `shopfloor login` wrote (`config.rs`); the org and project from `--org`/`--project`
//! (`SHOPFLOOR_ORG`, `SHOPFLOOR_PROJECT`), else that file. Output is a table by default and the
//! API's own JSON, byte for byte, with `--json`. A refused request prints the problem's title
//! and detail on one line and exits 1; a usage mistake exits 2.
//!
//! `http.rs` is the HTTP client (`error.rs` its one error type), `sse.rs` reads the project's
//! event stream, `table.rs` renders tables and colour, `list.rs` pages lists, `form.rs` asks an
//! approval's fields, `model.rs` is a run as the API describes it, `follow.rs` is
//! `runs follow`, `resolve.rs` is `runs resolve`, and `session.rs`, `runs.rs`, `approvals.rs`,
//! `workflows.rs`, `hosts.rs`, `projects.rs`, `members.rs` (with the roles a command may
//! name), `webhooks.rs` and `resources.rs` (audit, tokens, budgets) hold the commands.
//!
//! # Its modules
//!
//! The operator's command line: reqwest to a server's REST API, and no server code (it depends
//! on `engine` only for the name of a run's start approval). `http.rs`: the client, paths built
//! by segment, a refusal printed as the problem's title and detail on one line, exit 1; a usage
//! mistake exits 2 (`error.rs`: `ClientError`). The config file `login` writes (`config.rs`;
//! flags and `SHOPFLOOR_SERVER`/`_TOKEN`/`_ORG`/`_PROJECT` override it), tables with colour only
//! on a terminal and never with `NO_COLOR` (`table.rs`), a list's pages and its one way of
//! printing (`list.rs`: `print_list`), `--json` printing the API's bytes as they came, approval forms asked field by field (`form.rs`), and
//! the project event stream followed with `Last-Event-ID` for `runs list --watch` and
//! `runs follow` (`sse.rs`, `follow.rs`: crossterm raw mode on a terminal, keys `a`/`c`/`q`).
//! The commands: `session.rs` (login, context), `runs.rs` (with `model.rs`, a run as the API
//! describes it, and `resolve.rs`; `runs show` prints a failed step's own words, its output's
//! `error`, under the steps), `approvals.rs` (approve, reject), `workflows.rs` (with
//! versions and a version's source), `hosts.rs` (with `host_command`, which the console's "Add
//! a host" page shows too), `projects.rs` (list, show, pause), `members.rs` (and the roles a
//! token or member may have), `webhooks.rs` (outgoing webhooks, deliveries, replay) and
//! `resources.rs` (audit, tokens, budgets). **Architecture Invariant:** the client never opens the database; what it
//! shows and changes goes through the same routes as every other caller. A running crew step's
//! transcript is the one thing it reads on a timer (its step log, once a second, only while such
//! a step runs), because session lines are not run events. Its tests drive the binary
//! (`api/tests/it/cli.rs`, with `runs follow` in a pseudo-terminal).

mod approvals;
mod config;
mod error;
mod follow;
mod form;
mod hosts;
mod http;
mod list;
mod members;
mod model;
mod projects;
mod resolve;
mod resources;
mod runs;
mod session;
mod sse;
mod table;
mod webhooks;
mod workflows;

pub use hosts::host_command;
pub use table::ago_in;

use clap::{Args, Subcommand};

/// The client's subcommands, flattened into `shopfloor`'s own.
#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Store a server and a token in your config directory (file mode 0600).
    Login(session::LoginArgs),
    /// Show where commands go, or switch the org and project they use.
    Context(session::ContextArgs),
    /// Runs: list, show, why, follow, submit, cancel, retry, rerun, say, resolve.
    Runs(runs::RunsArgs),
    /// Answer an approval a run waits on with the form's fields (asked in turn on a terminal).
    Approve(approvals::ApproveArgs),
    /// Reject an approval: the run is cancelled with `rejected at <node>: <reason>`.
    Reject(approvals::RejectArgs),
    /// Workflows: list, push, validate (on the server), pause, unpause, versions, show.
    Workflows(workflows::WorkflowsArgs),
    /// Hosts of the project: list, register, drain, undrain, deregister.
    Hosts(hosts::HostsArgs),
    /// Projects of the org: list, show, pause, unpause.
    Projects(projects::ProjectsArgs),
    /// Members of the org: list, add, remove, role.
    Members(members::MembersArgs),
    /// The project's outgoing webhooks: list, create, delete, deliveries, replay.
    Webhooks(webhooks::WebhooksArgs),
    /// The audit log.
    Audit(resources::AuditArgs),
    /// API tokens: create, list, revoke.
    Tokens(resources::TokensArgs),
    /// Budgets: show, set, remove.
    Budgets(resources::BudgetsArgs),
}

/// Where a command goes and how it prints; accepted after any subcommand.
#[derive(Debug, Clone, Args)]
pub(crate) struct Conn {
    /// The server's URL, instead of the one `shopfloor login` stored.
    #[arg(long, env = "SHOPFLOOR_SERVER", global = true)]
    pub server: Option<String>,
    /// The org's slug, instead of the current context's.
    #[arg(long, env = "SHOPFLOOR_ORG", global = true)]
    pub org: Option<String>,
    /// The project's slug, instead of the current context's.
    #[arg(long, env = "SHOPFLOOR_PROJECT", global = true)]
    pub project: Option<String>,
    /// Print the API's JSON exactly as it answered, instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

/// Runs a client command; returns the exit code. Errors are printed here, as one line: the
/// caller has nothing left to add.
pub async fn run(cmd: ClientCommand) -> u8 {
    let result = match cmd {
        ClientCommand::Login(args) => session::login(args).await,
        ClientCommand::Context(args) => session::context(args).await,
        ClientCommand::Runs(args) => runs::run(args).await,
        ClientCommand::Approve(args) => approvals::approve(args).await,
        ClientCommand::Reject(args) => approvals::reject(args).await,
        ClientCommand::Workflows(args) => workflows::workflows(args).await,
        ClientCommand::Hosts(args) => hosts::hosts(args).await,
        ClientCommand::Projects(args) => projects::projects(args).await,
        ClientCommand::Members(args) => members::members(args).await,
        ClientCommand::Webhooks(args) => webhooks::webhooks(args).await,
        ClientCommand::Audit(args) => resources::audit(args).await,
        ClientCommand::Tokens(args) => resources::tokens(args).await,
        ClientCommand::Budgets(args) => resources::budgets(args).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
    }
}

/// Writes a line to standard output; a closed pipe (`| head`) is not an error worth a panic.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}
pub(crate) use say;
