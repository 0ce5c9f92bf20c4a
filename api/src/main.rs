//! The `shopfloor` binary. Errors end as one line on standard error and a non-zero exit code;
//! never a panic or a backtrace.

use std::process::ExitCode;

use clap::Parser;

// The servers allocate per request and per statement; mimalloc costs less CPU there than
// glibc's malloc (bench/history.md, #20).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = api::cli::Cli::parse();
    // The long-running processes export traces and the event log when OTLP is configured; the
    // short commands only log. Set up before the runtime: the exporters block on threads of
    // their own, and are shut down (flushed) after it, on every way out.
    let telemetry = api::telemetry::init(&cli.log, cli.command.exports_telemetry(), cli.command.name());
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(api::cli::run(cli));
    drop(runtime);
    telemetry.shutdown();
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
