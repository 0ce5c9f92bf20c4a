#!/usr/bin/env bash
# `make fuzz-api`: schemathesis (from PyPI, in a virtualenv under target/fuzz) against a real
# `shopfloor serve` on a database of its own, with a real org, project, workflow, run and host
# in the path parameters. Every check runs: server errors, status codes, content types,
# headers and response schemas against the document, schema-violating requests accepted,
# schema-valid requests refused, missing auth accepted, undeclared methods. Two things no
# document states are said to the fuzzer (below): a workflow source may not be a valid
# workflow (422), and an Idempotency-Key is fresh for each new request. The server allows
# private webhook targets, since which names are public depends on its network. Two passes:
# the host protocol as a registered host, then the REST API as the org's owner. Exits
# non-zero when any check failed.
#
# Environment:
#   DATABASE_URL       a server to make the fuzz database on (its role must CREATE DATABASE);
#                      unset: a throwaway cluster under target/fuzz/cluster
#   FUZZ_MAX_TIME      seconds of each pass (default 120)
#   FUZZ_SEED          schemathesis's seed, to replay a run
#   SCHEMATHESIS_VERSION  the version installed (default below)
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "make fuzz-api: $*" >&2; }
die() { say "$*"; exit 1; }

version=${SCHEMATHESIS_VERSION:-4.32.5}
max_time=${FUZZ_MAX_TIME:-120}
dir=target/fuzz
venv=$dir/venv
mkdir -p "$dir"

command -v python3 >/dev/null || die "python3 not found: install it (\`apt-get install python3 python3-venv\`), then \`make fuzz-api\` again"
command -v psql >/dev/null || die "psql not found: install it (\`apt-get install postgresql-client\`), then \`make fuzz-api\` again"
if ! "$venv/bin/schemathesis" --version 2>/dev/null | grep -q "version $version\$"; then
    say "installing schemathesis $version from PyPI into $venv"
    python3 -m venv "$venv" || die "cannot make a virtualenv: install python3-venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$version"
fi

export SQLX_OFFLINE=${SQLX_OFFLINE:-true}
cargo build --bin shopfloor
shopfloor=${CARGO_TARGET_DIR:-target}/debug/shopfloor

pids=()
cleanup() {
    local status=$?
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
    if [[ -n ${fuzz_db:-} ]]; then psql -q "$server_url" -c "DROP DATABASE IF EXISTS $fuzz_db WITH (FORCE)" >/dev/null 2>&1 || true; fi
    if [[ -n ${cluster:-} ]]; then "$shopfloor" admin cluster stop --data-dir "$cluster" >/dev/null 2>&1 || true; fi
    exit "$status"
}
trap cleanup EXIT

if [[ -z ${DATABASE_URL:-} ]]; then
    cluster=$dir/cluster
    "$shopfloor" admin cluster stop --data-dir "$cluster" >/dev/null 2>&1 || true
    rm -rf "$cluster"
    server_url=$("$shopfloor" admin cluster start --data-dir "$cluster")
else
    server_url=$DATABASE_URL
fi
fuzz_db=shopfloor_fuzz_$$
psql -q "$server_url" -c "CREATE DATABASE $fuzz_db" >/dev/null
db_url=$(python3 -c 'import sys, urllib.parse as u; p = u.urlsplit(sys.argv[1]); print(u.urlunsplit(p._replace(path="/" + sys.argv[2])))' "$server_url" "$fuzz_db")

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
base=http://127.0.0.1:$port
export DATABASE_URL=$db_url SHOPFLOOR_LOG=${SHOPFLOOR_LOG:-warn}
export SHOPFLOOR_SECRET_KEY=$(python3 -c 'import base64, os; print(base64.b64encode(os.urandom(32)).decode())')
# The fuzzer sends far more than a person: no rate limits, and crew steps to no host.
SHOPFLOOR_LISTEN=127.0.0.1:$port SHOPFLOOR_WEBHOOKS_ALLOW_PRIVATE=true SHOPFLOOR_RATE_PER_TOKEN=0 SHOPFLOOR_RATE_PER_HOST=0 SHOPFLOOR_RATE_PER_ADDRESS=0 \
    "$shopfloor" serve >"$dir/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 600); do
    curl -sf "$base/readyz" >/dev/null && break
    kill -0 "${pids[0]}" 2>/dev/null || die "shopfloor serve exited: see $dir/serve.log"
    sleep 0.1
done
curl -sf "$base/readyz" >/dev/null || die "shopfloor serve was not ready within 60 s: see $dir/serve.log"

# The data the paths name: an org and project, a workflow with an approval, a run waiting
# on it, a host registered to the project.
token=$("$shopfloor" admin create-org --slug fuzz --owner-email fuzz@example.com 2>/dev/null)
"$shopfloor" admin create-project --org fuzz --slug web >/dev/null 2>&1
api() { curl -sf -H "Authorization: Bearer $1" -H 'Content-Type: application/json' "${@:3}" "$base/api/v1/$2"; }
printf 'name: fuzz\nnodes:\n  ask:\n    approval: { prompt: Ship it? }\n' |
    curl -sf -H "Authorization: Bearer $token" -H 'Content-Type: application/yaml' --data-binary @- "$base/api/v1/orgs/fuzz/projects/web/workflows" >/dev/null
run=$(api "$token" orgs/fuzz/projects/web/runs -d '{"workflow": "fuzz"}' | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])')
registration=$(api "$token" orgs/fuzz/projects/web/host-registrations -d '{}' | python3 -c 'import json, sys; print(json.load(sys.stdin)["token"])')
host=$(api "$registration" host/register -d '{"name": "fuzz-box", "capabilities": ["linux"]}')
host_id=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["host_id"])' "$host")
host_token=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["token"])' "$host")

# The credentials work, or every request of a pass would be a refusal that tests nothing.
api "$token" orgs/fuzz/projects/web/runs -o /dev/null || die "the owner's token is refused"
claimed=$(curl -s -o "$dir/claim.json" -w '%{http_code}' -X POST -H "Authorization: Bearer $host_token" -H 'Content-Type: application/json' -d '{"max": 0, "wait_secs": 0}' "$base/api/v1/host/claim")
[[ $claimed == 200 ]] || die "the host's credential is refused on claim ($claimed): $(cat "$dir/claim.json")"

cat >"$dir/schemathesis.toml" <<TOML
# Written by scripts/fuzz-api.sh for one run.
[parameters]
org = "fuzz"
project = "web"
name = "fuzz"
run = "$run"
node = "ask"
host = "$host_id"
period = "day"

# A workflow's source is YAML whose graph (each \`after:\` naming a node of the file, no cycle,
# expressions that parse) no JSON Schema states: a source that is not a valid workflow is
# refused with 422 \`invalid-workflow\` and its problems, by design.
[[operations]]
include-operation-id = ["create_workflow_version", "put_workflow_version"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]
TOML

# A client sends a fresh Idempotency-Key with each new request (one reused with another
# request is refused with 422 by design, which no schema can state): the fuzzer does too.
cat >"$dir/fuzz_hooks.py" <<'PY'
import uuid

import schemathesis


@schemathesis.hook
def before_call(context, case, kwargs):
    positive = case.meta is None or case.meta.generation.mode.is_positive
    if positive and case.headers and "Idempotency-Key" in case.headers:
        case.headers["Idempotency-Key"] = str(uuid.uuid4())
PY
export PYTHONPATH=$dir${PYTHONPATH:+:$PYTHONPATH} SCHEMATHESIS_HOOKS=fuzz_hooks

st=("$venv/bin/schemathesis" --config-file "$dir/schemathesis.toml" run "$base/api/v1/openapi.json" --url "$base"
    --checks all --max-time "$max_time" --workers 2 --request-timeout 60
    # A claim waits up to 30 s for work by design.
    --max-response-time 45
    ${FUZZ_SEED:+--seed "$FUZZ_SEED"}
    # Asks GitHub itself (no GitHub here); the event stream never ends by design.
    --exclude-operation-id claim_installation --exclude-operation-id stream_project_events)
status=0
# The host first: the owner's pass deregisters it (`DELETE …/hosts/{host}`), which revokes
# its credential.
say "pass 1: the host protocol as a registered host ($max_time s)"
"${st[@]}" -H "Authorization: Bearer $host_token" --include-tag host-protocol || status=1
say "pass 2: the REST API as the org's owner ($max_time s)"
"${st[@]}" -H "Authorization: Bearer $token" --exclude-tag host-protocol || status=1
if grep -q 'panicked' "$dir/serve.log"; then
    say "the server panicked: see $dir/serve.log"
    status=1
fi
exit "$status"
