#!/usr/bin/env bash
# `make test`: installs what is missing (PostgreSQL, PgBouncer, bubblewrap, Chromium, the agent CLIs pinned
# in scripts/agent-clis.txt), builds the workspace's tests, starts a throwaway
# PostgreSQL cluster when DATABASE_URL is not set, runs every test against it, and stops the
# cluster on exit, keeping the tests' exit status.
#
# Environment:
#   DATABASE_URL      a server to test against instead of a throwaway cluster; its role must
#                     be allowed to CREATE DATABASE (each test clones its own database)
#   CARGO_TARGET_DIR  honoured; the throwaway cluster lives in $CARGO_TARGET_DIR/test-cluster
#   SHOPFLOOR_BIN     the `shopfloor` binary that runs `admin cluster start|stop`
#                     (default: the debug build in the target directory)
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "make test: $*" >&2; }
die() { say "$*"; exit 1; }

source scripts/lib.sh  # have_pg_server

install_pg_server() {
    local sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
            sudo=(sudo -n)
        else
            die "PostgreSQL server binaries not found and installing them needs root: run \`sudo apt-get install postgresql\` (or set DATABASE_URL to a server to test against), then \`make test\` again"
        fi
    fi
    if ! command -v apt-get >/dev/null; then
        die "PostgreSQL server binaries not found and there is no apt-get: install the PostgreSQL server (postgresql-server with dnf, postgresql@16 with brew) or set DATABASE_URL, then \`make test\` again"
    fi
    say "installing PostgreSQL with apt-get"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql
    have_pg_server || die "apt-get installed postgresql but its server binaries are still not found"
}

# Builds never read the test database: sqlx's macros use the offline `.sqlx/` cache.
export SQLX_OFFLINE=${SQLX_OFFLINE:-true}

if ! cargo nextest --version >/dev/null 2>&1; then
    say "installing cargo-nextest"
    cargo install --locked cargo-nextest
fi
if [[ -z ${DATABASE_URL:-} ]] && ! have_pg_server; then
    install_pg_server
fi

# Installs Debian's package $1 with apt-get, for $2 (what needs it); $3 checks it is there
# after. Without root or apt-get it says how to install it and stops.
apt_install() {
    local package=$1 why=$2 check=$3
    if [[ $(id -u) -ne 0 ]] && ! { command -v sudo >/dev/null && sudo -n true 2>/dev/null; }; then
        die "$package is missing and installing it needs root: run \`sudo apt-get install $package\`, then \`make test\` again"
    fi
    command -v apt-get >/dev/null ||
        die "$package is missing and there is no apt-get: install $package with your system's package manager, then \`make test\` again"
    say "installing $package with apt-get ($why)"
    local as_root=(); [[ $(id -u) -eq 0 ]] || as_root=(sudo -n)
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$package"
    "$check" || die "apt-get installed $package but it is still not found"
}

# The tests behind PgBouncer (tests/e2e/pgbouncer.rs) start pgbouncer processes of their own.
have_pgbouncer() {
    command -v pgbouncer >/dev/null || [[ -x /usr/sbin/pgbouncer ]]
}
have_pgbouncer || apt_install pgbouncer "the tests behind PgBouncer" have_pgbouncer

# The walls around crew steps (host/src/walls.rs, tests/e2e/walls.rs) are bubblewrap's.
have_bwrap() {
    command -v bwrap >/dev/null
}
have_bwrap || apt_install bubblewrap "the walls around crew steps" have_bwrap

# --- The console's browser tests (tests/console/browser.rs) need Chromium and chromedriver. ---
# Installed with apt-get when missing and possible; otherwise the browser test fails and says
# how to install them.
have_browser() {
    { command -v chromium >/dev/null || command -v chromium-browser >/dev/null; } &&
        { command -v chromedriver >/dev/null || [[ -x /usr/lib/chromium/chromedriver ]]; }
}
if ! have_browser; then
    if command -v apt-get >/dev/null && { [[ $(id -u) -eq 0 ]] || sudo -n true 2>/dev/null; }; then
        say "installing chromium and chromium-driver with apt-get (the console's browser tests)"
        as_root=(); [[ $(id -u) -eq 0 ]] || as_root=(sudo -n)
        "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
        "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver ||
            say "could not install chromium and chromium-driver; the browser tests will fail and say how to install them"
    else
        say "chromium and chromium-driver are missing and cannot be installed here; the browser tests will fail and say how to install them"
    fi
fi
# --- end of the browser tests' setup ---

# --- The real agent CLIs (tests/e2e/agents.rs), pinned in scripts/agent-clis.txt. ---
pins=$(scripts/agent-clis.sh)
while IFS= read -r pin; do
    export "${pin?}"
done <<<"$pins"
# --- end of the agent CLIs' setup ---

say "building"
cargo build --workspace --bins
cargo nextest run --workspace --no-run

if [[ -z ${DATABASE_URL:-} ]]; then
    target_dir=${CARGO_TARGET_DIR:-target}
    cluster_dir=$target_dir/test-cluster
    shopfloor=${SHOPFLOOR_BIN:-$target_dir/debug/shopfloor}
    [[ -x $shopfloor ]] || die "$shopfloor was not built"

    # Stops the cluster however we leave, and exits with the status we were leaving with.
    stop_cluster() {
        local status=$?
        trap - EXIT
        if ! "$shopfloor" admin cluster stop --data-dir "$cluster_dir"; then
            say "could not stop the test cluster in $cluster_dir; stop it with \`$shopfloor admin cluster stop --data-dir $cluster_dir\`"
        fi
        if [[ $status -ne 0 ]]; then
            say "the test cluster's log is $cluster_dir/pg.log"
        fi
        exit "$status"
    }
    trap stop_cluster EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM

    # A cluster left by an interrupted run is stopped and thrown away: each run starts clean.
    "$shopfloor" admin cluster stop --data-dir "$cluster_dir" || true
    rm -rf "$cluster_dir"
    started=$SECONDS
    DATABASE_URL=$("$shopfloor" admin cluster start --data-dir "$cluster_dir")
    [[ $DATABASE_URL == postgres://* ]] ||
        die "\`$shopfloor admin cluster start\` printed no database URL (got '$DATABASE_URL')"
    export DATABASE_URL
    say "throwaway PostgreSQL at $DATABASE_URL (started in $((SECONDS - started)) s)"
fi

cargo nextest run --workspace --no-fail-fast
cargo test --workspace --doc
scripts/helm-check.sh
# RustCrypto's `rsa` is open to the Marvin timing attack (RUSTSEC-2023-0071, no fixed
# version): the App's JWT is signed with ring, and nothing may bring `rsa` back.
if cargo tree --workspace --target all -i rsa 2>/dev/null | grep -q '^rsa '; then
    cargo tree --workspace --target all -i rsa
    die "the crate \`rsa\` (RUSTSEC-2023-0071) is in the dependency tree again"
fi
