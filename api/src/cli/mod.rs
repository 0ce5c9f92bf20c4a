//! The `shopfloor` command line: one binary, one subcommand per process or task.
//!
//! Every setting is a flag and an environment variable of the same name (`--listen` and
//! `SHOPFLOOR_LISTEN`); the defaults are shown by `--help`. These names are a stable interface:
//! scripts and the Helm chart rely on them.

mod admin;
mod args;
mod check;
mod database;
mod error;
mod processes;
mod secret_key;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

pub use args::{
    ApiArgs, DbArgs, EngineArgs, GithubAppArgs, GithubArgs, HostsArgs, ListenArgs, ListenDbArgs, MigrateArgs, PoolArgs, SecretKeyArgs, ServeArgs, ServerArgs,
    WebhooksArgs,
};
pub use database::Database;
pub use error::CliError;
pub use processes::app;

#[derive(Debug, Parser)]
#[command(
    name = "shopfloor",
    version,
    about = "A durable, audited backend for software factories: GitHub events start runs of workflows that coding agents, CI gates and people walk."
)]
pub struct Cli {
    /// Log filter (tracing's EnvFilter syntax), e.g. `info` or `shopfloor=debug,sqlx=warn`.
    #[arg(long = "log", env = "SHOPFLOOR_LOG", default_value = "info", global = true)]
    pub log: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// All in one for a laptop or a demo: migrations, the API and one engine. With no
    /// DATABASE_URL it runs its own PostgreSQL cluster under SHOPFLOOR_DATA_DIR/pg.
    Serve(ServeArgs),
    /// One stateless API replica.
    Api(ApiArgs),
    /// One engine process of the pool.
    Engine(EngineArgs),
    /// The host agent: claims crew steps and runs coding agents in git worktrees.
    Host(host::HostArgs),
    /// Inside a crew step's walls, the host starts this first: it carries the step's
    /// connections to the host's proxy, then runs the harness and ends with it.
    #[command(hide = true)]
    Room(host::egress::bridge::RoomArgs),
    /// Apply migrations, and seal signing keys still in plaintext when SHOPFLOOR_SECRET_KEY is
    /// set; refuses a database whose schema is newer than this binary.
    Migrate(MigrateArgs),
    /// Bootstrap: orgs, projects, their first tokens; the embedded cluster.
    #[command(subcommand)]
    Admin(admin::AdminCommand),
    /// Readiness checks, one line each with the fix for each failure; exit 0 only when all pass.
    /// `--host` checks a host machine (harnesses, git, the server) instead of a server.
    Check(check::CheckArgs),
    /// Check workflow files offline; prints `ok FILE` per valid file and `FILE:LINE:COL: message`
    /// per problem, exits 1 on any.
    Validate {
        /// Workflow YAML files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// The operator's commands, which talk to a server over its REST API (the `cli` crate).
    #[command(flatten)]
    Client(::cli::ClientCommand),
}

impl Command {
    /// Whether the command is a long-running process, which exports traces and the event log
    /// when OTLP is configured (`crate::telemetry`).
    pub fn exports_telemetry(&self) -> bool {
        matches!(self, Command::Serve(_) | Command::Api(_) | Command::Engine(_) | Command::Host(_))
    }

    /// The process's name in its telemetry resource.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Serve(_) => "serve",
            Command::Api(_) => "api",
            Command::Engine(_) => "engine",
            Command::Host(_) => "host",
            _ => "cli",
        }
    }
}

/// Runs a parsed command line; returns the process exit code.
pub async fn run(cli: Cli) -> Result<u8, CliError> {
    match cli.command {
        Command::Serve(args) => processes::serve(args).await.map(|()| 0),
        Command::Api(args) => processes::api(args).await.map(|()| 0),
        Command::Engine(args) => processes::engine(args).await.map(|()| 0),
        Command::Migrate(db) => processes::migrate(db).await.map(|()| 0),
        Command::Admin(cmd) => admin::run(cmd).await.map(|()| 0),
        Command::Validate { files } => {
            let ok = engine::definition::report::validate_files(&files, &mut std::io::stdout());
            Ok(if ok { 0 } else { 1 })
        }
        Command::Host(args) => host::run(args).await.map(|()| 0).map_err(CliError::msg),
        Command::Room(args) => host::egress::bridge::run(args).await.map_err(CliError::msg),
        Command::Check(args) => Ok(check::run(args).await),
        Command::Client(cmd) => Ok(::cli::run(cmd).await),
    }
}
