#!/usr/bin/env bash
# `make bench`: builds the release binaries and runs the benchmark harness, which starts its
# own durable PostgreSQL cluster under target/bench-cluster and appends to BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! ls /usr/lib/postgresql/*/bin/pgbench >/dev/null 2>&1 && ! command -v pgbench >/dev/null; then
    echo "make bench: installing PostgreSQL with apt-get" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql
fi
cargo build --release -p shopfloor-api -p shopfloor-bench --bins
exec "${CARGO_TARGET_DIR:-target}/release/shopfloor-bench"
