#!/usr/bin/env bash
# `make chaos`: the full chaos suite (tests/e2e/chaos/) with 2000 runs. The suite starts,
# crashes and stops a throwaway PostgreSQL cluster of its own in a temporary directory (it
# has to crash it without disturbing anything else), so no DATABASE_URL is used, and runs
# PgBouncer and a network namespace of its own (root, iproute2); this script only makes sure
# the PostgreSQL server binaries, PgBouncer and cargo-nextest are there, builds, and runs.
# `make test` runs the same suite with its short default (CHAOS_RUNS unset).
#
# Environment:
#   CHAOS_RUNS  runs to push through the faults (default here: 2000)
#   CHAOS_SEED  the seed of the driver's choices, to replay a schedule a run printed
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "make chaos: $*" >&2; }
die() { say "$*"; exit 1; }

source scripts/lib.sh  # have_pg_server

if ! have_pg_server; then
    sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        sudo -n true 2>/dev/null || die "PostgreSQL server binaries not found and installing them needs root: run \`sudo apt-get install postgresql\`, then \`make chaos\` again"
        sudo=(sudo -n)
    fi
    command -v apt-get >/dev/null || die "PostgreSQL server binaries not found and there is no apt-get: install the PostgreSQL server, then \`make chaos\` again"
    say "installing PostgreSQL with apt-get"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql
    have_pg_server || die "apt-get installed postgresql but its server binaries are still not found"
fi
if ! command -v pgbouncer >/dev/null && [[ ! -x /usr/sbin/pgbouncer ]]; then
    [[ $(id -u) -eq 0 ]] || die "pgbouncer not found and installing it needs root: run \`sudo apt-get install pgbouncer\`, then \`make chaos\` again"
    command -v apt-get >/dev/null || die "pgbouncer not found and there is no apt-get: install PgBouncer, then \`make chaos\` again"
    say "installing pgbouncer with apt-get"
    env DEBIAN_FRONTEND=noninteractive apt-get update -q
    env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends pgbouncer
fi
if ! cargo nextest --version >/dev/null 2>&1; then
    say "installing cargo-nextest"
    cargo install --locked cargo-nextest
fi

# Builds never read a database: sqlx's macros use the offline `.sqlx/` cache.
export SQLX_OFFLINE=${SQLX_OFFLINE:-true}
# The engines the suite starts are this build's `shopfloor` binary.
cargo build --bin shopfloor
CHAOS_RUNS=${CHAOS_RUNS:-2000} exec cargo nextest run -p shopfloor-tests --no-capture chaos
