//! README.md's "A five-minute tour", run as written against a real `shopfloor serve`: the
//! tour's `sh` block is read from the README when the test runs, and its commands run in
//! order in one bash session, so what one line sets (`TOKEN=$(…)`, `alias sf=…`, `RUN=$(…)`)
//! the next ones use. A command that fails names its README line; so does an outcome the
//! README promises and the command did not print.
//!
//! The adaptations, each mechanical, and nothing else:
//! - `make run` is not run: the test starts `shopfloor serve` on a free port, on a test
//!   database and with a secret key (what `make run` does with `DATABASE_URL` set), and waits
//!   for `/readyz`. `localhost:8080` in the commands becomes that port. The session gets the
//!   same `DATABASE_URL` and `SHOPFLOOR_SECRET_KEY`, as the README's table says `admin` needs
//!   them beside a server on one database.
//! - The commands run in a temporary directory where `target/release/shopfloor` is a link to
//!   this build's binary and `engine` a link to the repository's, so the README's paths
//!   resolve; the binary's directory is on `PATH` for the bare `shopfloor` of the host lines,
//!   and `HOME` is a directory of the test's own, for `sf login`'s config.
//! - `sf runs follow` and `sf runs list --watch` run until interrupted: they run with stdin
//!   from /dev/null under `timeout` (the hang guard) and are interrupted, as Ctrl-C would,
//!   once they have printed the run; an end of their own is taken as it comes.
//! - What `sf hosts register` prints is run, with `--work-dir` added, in the background after
//!   the `shopfloor check --host` line ("on the host, before that command"), and the session
//!   waits for the host to have registered before the next line. `claude` on `PATH` is a
//!   stand-in that prints a version, as `check --host` looks for it there.

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use engine::testkit::test_db;
use shopfloor_tests::process::{Proc, free_port, shopfloor};
use shopfloor_tests::shopfloor_bin;

const README: &str = include_str!("../../README.md");

/// The heading whose first `sh` block is the tour.
const TOUR: &str = "## A five-minute tour";

/// The port the README's commands name.
const README_ADDRESS: &str = "localhost:8080";

/// How long the whole tour may take before the test calls it hung. Only a hang guard: a
/// loaded machine may take long, and nothing is asserted about how long.
const HANG_GUARD: Duration = Duration::from_secs(600);

/// A stand-in for Claude Code: `check --host` only looks for `claude` on `PATH`. It answers
/// like `claude --version`; as a harness it prints no session, so the step the host claims
/// (the tour's run's `plan`) fails, which the tour does not look at.
const CLAUDE_STUB: &str = "#!/bin/sh\necho '2.0.14 (Claude Code)'\n";

/// One line of the tour's block, with its line number in README.md.
#[derive(Debug, Clone)]
struct TourLine {
    number: usize,
    text: String,
}

impl TourLine {
    /// The command without its trailing comment (which bash drops itself).
    fn command(&self) -> &str {
        self.text.split_once(" #").map_or(self.text.as_str(), |(c, _)| c).trim()
    }

    /// The trailing comment, empty when there is none.
    fn comment(&self) -> &str {
        self.text.split_once(" #").map_or("", |(_, c)| c).trim()
    }

    fn is_command(&self) -> bool {
        let t = self.text.trim();
        !t.is_empty() && !t.starts_with('#')
    }

    /// `NAME` when the line is `NAME=$(…)`: the session writes the value down after it.
    fn assigned(&self) -> Option<&str> {
        let (name, rest) = self.command().split_once('=')?;
        let plain = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        (plain && rest.starts_with("$(")).then_some(name)
    }

    /// The lines that run until interrupted.
    fn runs_until_interrupted(&self) -> bool {
        let c = self.command();
        c.starts_with("sf runs follow") || (c.starts_with("sf runs list") && c.contains("--watch"))
    }

    fn named(&self) -> String {
        format!("README.md:{} `{}`", self.number, self.command())
    }
}

/// The lines of the first ```sh block under [`TOUR`].
fn tour_lines(readme: &str) -> Vec<TourLine> {
    let lines: Vec<&str> = readme.lines().collect();
    let heading = lines.iter().position(|l| l.trim() == TOUR).unwrap_or_else(|| panic!("README.md has no `{TOUR}` heading"));
    let open = (heading + 1..lines.len()).find(|&i| lines[i].trim() == "```sh").unwrap_or_else(|| panic!("no ```sh block under `{TOUR}`"));
    let close = (open + 1..lines.len()).find(|&i| lines[i].trim() == "```").unwrap_or_else(|| panic!("the tour's ```sh block is not closed"));
    (open + 1..close).map(|i| TourLine { number: i + 1, text: lines[i].to_owned() }).collect()
}

/// The one command line of the tour that `is`, or a failure that says which is missing.
fn find<'a>(tour: &'a [TourLine], what: &str, is: impl Fn(&str) -> bool) -> &'a TourLine {
    let found: Vec<&TourLine> = tour.iter().filter(|l| l.is_command() && is(l.command())).collect();
    match found.as_slice() {
        [one] => one,
        [] => panic!("README.md's tour has no {what} line"),
        many => panic!("README.md's tour has {} {what} lines: {many:?}", many.len()),
    }
}

/// Where the session keeps each line's output: `<n>.out`, `<n>.err`, `<n>.value`.
struct Outputs(PathBuf);

impl Outputs {
    fn read(&self, line: &TourLine, ext: &str) -> String {
        std::fs::read_to_string(self.0.join(format!("{}.{ext}", line.number))).unwrap_or_default()
    }

    fn out(&self, line: &TourLine) -> String {
        self.read(line, "out")
    }

    fn value(&self, line: &TourLine) -> String {
        self.read(line, "value")
    }

    fn host_log(&self) -> String {
        std::fs::read_to_string(self.0.join("host.log")).unwrap_or_default()
    }

    /// Everything a failure message needs to show about a line.
    fn shown(&self, line: &TourLine) -> String {
        format!("\n--- stdout\n{}--- stderr\n{}--- the host's log\n{}", self.out(line), self.read(line, "err"), self.host_log())
    }
}

/// The directory the commands run in, and what they find there.
struct Stage {
    dir: tempfile::TempDir,
}

impl Stage {
    fn new() -> Stage {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for sub in ["work/target/release", "home", "bin", "out", "host-work"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        std::os::unix::fs::symlink(shopfloor_bin(), d.join("work/target/release/shopfloor")).unwrap();
        let engine = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine");
        std::os::unix::fs::symlink(engine, d.join("work/engine")).unwrap();
        let claude = d.join("bin/claude");
        std::fs::write(&claude, CLAUDE_STUB).unwrap();
        std::fs::set_permissions(&claude, std::fs::Permissions::from_mode(0o755)).unwrap();
        Stage { dir }
    }

    fn path(&self, sub: &str) -> PathBuf {
        self.dir.path().join(sub)
    }

    /// The stand-in `claude`, then the binary's directory, then the system's tools.
    fn search_path(&self) -> String {
        let bin_dir = shopfloor_bin().parent().unwrap().to_owned();
        let system = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
        format!("{}:{}:{system}", self.path("bin").display(), bin_dir.display())
    }
}

/// Quotes a path for bash.
fn quoted(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

/// The session's own helpers, before the tour's first line.
fn prelude(out: &Path, host_work: &Path) -> String {
    format!(
        r#"set -o pipefail
shopt -s expand_aliases
__out={out}
__host_work={host_work}
# A line that failed: its number and status, for the test to report with the line's output.
__ran() {{
  if [ "$2" -ne 0 ]; then echo "$1 $2" > "$__out/failed"; exit 1; fi
}}
# A command that runs until interrupted: stdin from /dev/null, `timeout` as the hang guard, and
# Ctrl-C's SIGINT once its output ($__watch_out) shows $__shows. Its own end counts as it is.
__until_shown() {{
  timeout --signal=INT --kill-after=10 180 "$@" </dev/null &
  local pid=$!
  until grep -qF -- "$__shows" "$__watch_out"; do
    if ! kill -0 "$pid" 2>/dev/null; then wait "$pid"; return; fi
    sleep 0.2
  done
  kill -INT "$pid"
  wait "$pid"
  return 0
}}
# The alias ends in a blank, so bash expands the alias after it too (`sf`).
alias __interrupted='__until_shown '
# Pastes what `hosts register` printed ($1, a file) on "the host", with a work directory of the
# test's, and waits for the host to have registered (it writes its credential then).
__paste_host() {{
  eval "exec $(cat "$1") --work-dir \"\$__host_work\"" >"$__out/host.log" 2>&1 &
  __host_pid=$!
  until [ -e "$__host_work/credential.json" ]; do
    kill -0 "$__host_pid" 2>/dev/null || return 1
    sleep 0.2
  done
}}
# The host stops with the session, as its drain lets it.
trap '[ -n "${{__host_pid:-}}" ] && kill -TERM "$__host_pid" 2>/dev/null && wait "$__host_pid"' EXIT
"#,
        out = quoted(out),
        host_work = quoted(host_work),
    )
}

/// How a tour line runs in the session.
fn adapted(line: &TourLine, port: u16) -> Option<String> {
    // Terminal 1: the test runs the server itself.
    if line.command() == "make run" {
        return None;
    }
    let text = line.text.replace(README_ADDRESS, &format!("localhost:{port}"));
    Some(if line.runs_until_interrupted() { format!("__interrupted {}", text.trim_start()) } else { text })
}

/// The bash script of the whole session: each tour line in a group of its own with its output
/// in files, then its status checked; the variable a line sets is written down after it.
fn session(tour: &[TourLine], port: u16, stage: &Stage, run_var: &str) -> String {
    let out = stage.path("out");
    let register = find(tour, "`sf hosts register`", |c| c.starts_with("sf hosts register"));
    let check = find(tour, "`shopfloor check --host`", |c| c.contains("shopfloor check --host"));
    let mut script = prelude(&out, &stage.path("host-work"));
    for line in tour.iter().filter(|l| l.is_command()) {
        let Some(text) = adapted(line, port) else { continue };
        let n = line.number;
        script.push_str(&format!("echo {n} > \"$__out/current\"\n"));
        if line.runs_until_interrupted() {
            script.push_str(&format!("__shows=\"${run_var}\"; __watch_out=\"$__out/{n}.out\"\n"));
        }
        // The closing brace on a line of its own: the README's trailing comment would hide it.
        script.push_str(&format!("{{ {text}\n}} >\"$__out/{n}.out\" 2>\"$__out/{n}.err\"\n__ran {n} $?\n"));
        if let Some(var) = line.assigned() {
            script.push_str(&format!("printf '%s' \"${var}\" > \"$__out/{n}.value\"\n"));
        }
        if line.number == check.number {
            // A host that does not come up is the printed command's failure.
            let (r, out) = (register.number, out.join(format!("{}.out", register.number)));
            script.push_str(&format!("echo {r} > \"$__out/current\"\n__paste_host {}\n__ran {r} $?\n", quoted(&out)));
        }
    }
    script
}

/// Runs the session to its end; a failed line or a hang ends the test with the line named.
fn run_session(script: &str, stage: &Stage, db_url: &str, tour: &[TourLine]) {
    let out = Outputs(stage.path("out"));
    std::fs::write(stage.path("session.sh"), script).unwrap();
    let mut bash = Command::new("bash");
    bash.arg(stage.path("session.sh"))
        .current_dir(stage.path("work"))
        .env_clear()
        .env("PATH", stage.search_path())
        .env("HOME", stage.path("home"))
        .env("DATABASE_URL", db_url)
        .env("SHOPFLOOR_SECRET_KEY", engine::testkit::SECRET_KEY)
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        // A group of its own, so that a hang can be ended with everything the session started.
        .process_group(0);
    let mut child = Proc(bash.spawn().expect("spawn bash"));
    let status = wait_or_hang(&mut child, &out, tour);
    if status.success() {
        return;
    }
    let failed = std::fs::read_to_string(out.0.join("failed")).unwrap_or_default();
    let (number, code) = failed.trim().split_once(' ').unwrap_or_else(|| panic!("the session ended {status} outside any README line"));
    let line = line_numbered(tour, number);
    panic!("{} exited {code}{}", line.named(), out.shown(line));
}

fn line_numbered<'a>(tour: &'a [TourLine], number: &str) -> &'a TourLine {
    tour.iter().find(|l| l.number.to_string() == number.trim()).unwrap_or_else(|| panic!("no tour line {number}"))
}

fn wait_or_hang(child: &mut Proc, out: &Outputs, tour: &[TourLine]) -> std::process::ExitStatus {
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            // SAFETY: signalling the process group of our own child.
            unsafe {
                libc::kill(-(child.0.id() as libc::pid_t), libc::SIGKILL);
            }
            let current = std::fs::read_to_string(out.0.join("current")).unwrap_or_default();
            let line = line_numbered(tour, &current);
            panic!("{} never ended{}", line.named(), out.shown(line));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The number of the latest migration in `migrations/` (`0022_….sql` → 22).
fn latest_migration() -> i64 {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations");
    std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.split('_').next()?.parse::<i64>().ok())
        .max()
        .expect("migrations/ holds numbered migrations")
}

/// The server answered `/readyz` with what the README's comment shows, and its schema is
/// the latest migration's number, as the comment says.
fn check_readyz(tour: &[TourLine], out: &Outputs) {
    let line = find(tour, "`curl …/readyz`", |c| c.starts_with("curl") && c.contains("/readyz"));
    let comment = line.comment();
    let promised = comment.split_once('{').and_then(|(_, rest)| rest.split_once('}')).map(|(body, _)| format!("{{{body}}}"));
    let promised: serde_json::Value =
        serde_json::from_str(&promised.unwrap_or_default()).unwrap_or_else(|e| panic!("{}: its comment shows no JSON ({e})", line.named()));
    let answered: serde_json::Value =
        serde_json::from_str(&out.out(line)).unwrap_or_else(|e| panic!("{} printed no JSON ({e}){}", line.named(), out.shown(line)));
    assert_eq!(answered, promised, "{} answered otherwise than its comment says", line.named());
    assert_eq!(answered["status"], "ready", "{}", line.named());
    assert_eq!(promised["schema"].as_i64(), Some(latest_migration()), "{}: the schema is not the number of the latest migration in migrations/", line.named());
}

/// `TOKEN=$(… create-org …)` got a token, alone on standard output.
fn check_token(tour: &[TourLine], out: &Outputs) {
    let line = find(tour, "`admin create-org`", |c| c.contains("admin create-org"));
    assert!(line.assigned().is_some(), "{}: the tour keeps the token in a variable", line.named());
    let token = out.value(line);
    assert!(
        token.lines().count() == 1 && token.trim().split('.').count() == 3,
        "{} should print a JWT alone on stdout, got {token:?}{}",
        line.named(),
        out.shown(line)
    );
}

/// `shopfloor validate FILE` printed `ok FILE`.
fn check_validate(tour: &[TourLine], out: &Outputs) {
    let line = find(tour, "`shopfloor validate`", |c| c.contains("shopfloor validate "));
    let file = line.command().split_whitespace().last().unwrap_or_default();
    assert_eq!(out.out(line), format!("ok {file}\n"), "{}{}", line.named(), out.shown(line));
}

/// `sf login` wrote its config where the comment says, with mode 0600.
fn check_login(tour: &[TourLine], out: &Outputs, home: &Path) {
    let line = find(tour, "`sf login`", |c| c.contains("sf login"));
    assert!(out.out(line).starts_with("Logged in to http://localhost:"), "{}{}", line.named(), out.shown(line));
    assert!(
        line.comment().contains("~/.config/shopfloor") && line.comment().contains("0600"),
        "{}: the comment no longer says where the config goes",
        line.named()
    );
    let config = home.join(".config/shopfloor/config.json");
    let mode = std::fs::metadata(&config).unwrap_or_else(|e| panic!("{}: no {} ({e})", line.named(), config.display())).permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{}: {}", line.named(), config.display());
}

/// `RUN=$(sf runs submit …)` got a run id alone; returns it with the variable's name.
fn check_submit(tour: &[TourLine], out: &Outputs) -> String {
    let line = find(tour, "`sf runs submit`", |c| c.contains("sf runs submit"));
    let run = out.value(line);
    assert!(
        run.starts_with("run-") && run.lines().count() == 1 && !run.contains(' '),
        "{} should print the new run's id alone, got {run:?}{}",
        line.named(),
        out.shown(line)
    );
    run.trim().to_owned()
}

/// The variable the tour keeps its run in (`RUN`).
fn run_variable(tour: &[TourLine]) -> String {
    let line = find(tour, "`sf runs submit`", |c| c.contains("sf runs submit"));
    line.assigned().unwrap_or_else(|| panic!("{}: the tour keeps the run's id in a variable", line.named())).to_owned()
}

/// The run commands after the submit: the approval, the list, the sentence, the live views.
fn check_run_commands(tour: &[TourLine], out: &Outputs, run: &str) {
    let approve = find(tour, "`sf approve`", |c| c.starts_with("sf approve"));
    assert!(out.out(approve).starts_with(&format!("approved $start on {run}")), "{}{}", approve.named(), out.shown(approve));
    let list = find(tour, "`sf runs list`", |c| c.starts_with("sf runs list") && !c.contains("--watch"));
    let table = out.out(list);
    assert!(table.lines().any(|l| l.starts_with(run) && l.contains("issue-to-pr")), "{} does not list the run{}", list.named(), out.shown(list));
    let why = find(tour, "`sf runs why`", |c| c.starts_with("sf runs why"));
    let sentence = out.out(why);
    let first = sentence.chars().next().unwrap_or(' ');
    assert!(
        sentence.lines().count() == 1 && first.is_uppercase() && sentence.split_whitespace().count() > 3,
        "{} should say what holds the run in a sentence{}",
        why.named(),
        out.shown(why)
    );
    for live in tour.iter().filter(|l| l.is_command() && l.runs_until_interrupted()) {
        assert!(out.out(live).contains(run), "{} never showed the run{}", live.named(), out.shown(live));
    }
}

/// `sf hosts register` printed the command the README shows under it, with a token in it.
fn check_register(tour: &[TourLine], out: &Outputs, port: u16) {
    let line = find(tour, "`sf hosts register`", |c| c.starts_with("sf hosts register"));
    let example = tour.iter().find(|l| l.number == line.number + 1).map(|l| l.text.trim().trim_start_matches('#').trim().to_owned()).unwrap_or_default();
    let example = example.replace(README_ADDRESS, &format!("localhost:{port}"));
    let printed = out.out(line);
    let words: Vec<&str> = printed.split_whitespace().collect();
    let shown: Vec<&str> = example.split_whitespace().collect();
    let alike = words.len() == shown.len() && words.iter().zip(&shown).all(|(w, s)| w == s || (s.ends_with('…') && w.starts_with(s.trim_end_matches('…'))));
    assert!(printed.lines().count() == 1 && alike, "{} printed\n  {printed}but the README shows under it\n  {example}", line.named());
}

/// `shopfloor check --host` passed every check: the harness, git, the server.
fn check_host_check(tour: &[TourLine], out: &Outputs) {
    let line = find(tour, "`shopfloor check --host`", |c| c.contains("shopfloor check --host"));
    let text = out.out(line);
    for name in ["claude", "git", "server"] {
        assert!(
            text.lines().any(|l| l.starts_with("ok") && l.contains(&format!(" {name}: "))),
            "{}: no passing `{name}` check{}",
            line.named(),
            out.shown(line)
        );
    }
}

/// `sf hosts list` showed the pasted host, and `sf hosts drain box-1` drained it.
fn check_hosts(tour: &[TourLine], out: &Outputs) {
    let list = find(tour, "`sf hosts list`", |c| c.starts_with("sf hosts list"));
    assert!(out.out(list).lines().any(|l| l.starts_with("box-1 ")), "{} does not show box-1{}", list.named(), out.shown(list));
    let drain = find(tour, "`sf hosts drain`", |c| c.starts_with("sf hosts drain"));
    assert!(out.out(drain).starts_with("box-1 drained"), "{}{}", drain.named(), out.shown(drain));
}

/// After the tour, the list shows the host drained (the test's own command, not the README's).
fn check_drained(stage: &Stage) {
    let listed = Command::new("target/release/shopfloor")
        .args(["hosts", "list"])
        .current_dir(stage.path("work"))
        .env_clear()
        .env("PATH", stage.search_path())
        .env("HOME", stage.path("home"))
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&listed.stdout);
    assert!(table.lines().any(|l| l.starts_with("box-1 ") && l.contains("(drained ")), "after the tour, `hosts list` should show box-1 drained:\n{table}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_readme_tour_runs_as_written() {
    let tour = tour_lines(README);
    let db = test_db().await;
    let stage = Stage::new();
    let port = free_port();
    // What `make run` does with DATABASE_URL set: `shopfloor serve` on it.
    let mut server = shopfloor(&["serve", "--log", "warn"], &db.url);
    let server = Proc(server.env("SHOPFLOOR_LISTEN", format!("127.0.0.1:{port}")).spawn().expect("spawn shopfloor serve"));
    shopfloor_tests::until_ok(&format!("http://127.0.0.1:{port}/readyz")).await;

    let script = session(&tour, port, &stage, &run_variable(&tour));
    tokio::task::block_in_place(|| run_session(&script, &stage, &db.url, &tour));

    let out = Outputs(stage.path("out"));
    check_readyz(&tour, &out);
    check_token(&tour, &out);
    check_validate(&tour, &out);
    check_login(&tour, &out, &stage.path("home"));
    let run = check_submit(&tour, &out);
    check_run_commands(&tour, &out, &run);
    check_register(&tour, &out, port);
    check_host_check(&tour, &out);
    check_hosts(&tour, &out);
    tokio::task::block_in_place(|| check_drained(&stage));
    drop(server);
    db.finish().await;
}
