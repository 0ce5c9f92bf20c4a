#!/usr/bin/env bash
# `make helm-check`: renders helm/shopfloor with the default values (plus a database URL)
# and with helm/shopfloor/ci-values.yaml, and validates every manifest against the
# Kubernetes schemas. Needs `helm` and `kubeconform`; neither is shipped by a package
# registry this machine reaches, so without them it says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
command -v helm >/dev/null || missing+=(helm)
command -v kubeconform >/dev/null || missing+=(kubeconform)
if ((${#missing[@]})); then
    echo "helm-check: not run: ${missing[*]} not installed (no package registry reachable here ships them); install helm 3 and kubeconform to render and validate helm/shopfloor" >&2
    exit 0
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
helm lint helm/shopfloor --set database.url=postgres://x@db/shopfloor
helm template t helm/shopfloor --set database.url=postgres://x@db/shopfloor >"$out/default.yaml"
helm template t helm/shopfloor -f helm/shopfloor/ci-values.yaml --api-versions monitoring.coreos.com/v1 >"$out/ci.yaml"
kubeconform -strict -summary -ignore-missing-schemas "$out/default.yaml" "$out/ci.yaml"
