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
# The peer (bench/peer): graphile-worker, pinned, installed with npm under target/peer.
command -v node >/dev/null && command -v npm >/dev/null ||
    { echo "make bench: Node.js and npm are needed for the peer (graphile-worker): install nodejs and npm, then \`make bench\` again" >&2; exit 1; }
# Always under ./target: `bench/src/peer.rs` looks for it there, whatever CARGO_TARGET_DIR says.
peer=target/peer
mkdir -p "$peer"
if ! cmp -s bench/peer/package.json "$peer/package.json" || [[ ! -d $peer/node_modules/graphile-worker ]]; then
    echo "make bench: installing the peer (graphile-worker) with npm" >&2
    cp bench/peer/package.json "$peer/"
    (cd "$peer" && npm install --no-audit --no-fund --silent)
fi
cp bench/peer/chains.mjs "$peer/"
cargo build --release -p shopfloor-api -p shopfloor-bench --bins
exec "${CARGO_TARGET_DIR:-target}/release/shopfloor-bench"
