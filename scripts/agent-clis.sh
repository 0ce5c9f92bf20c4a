#!/usr/bin/env bash
# Installs the agent CLIs pinned in scripts/agent-clis.txt from npm, each under
# $CARGO_TARGET_DIR/agent-clis/<package>@<version> (reused while its pin is unchanged), and
# prints one `NAME=PATH` line per CLI for the tests: SHOPFLOOR_TEST_CLAUDE, SHOPFLOOR_TEST_CODEX.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "agent CLIs: $*" >&2; }

command -v npm >/dev/null || {
    say "npm is missing: install Node.js 18 or later (\`apt-get install nodejs npm\`), then \`make test\` again"
    exit 1
}
root=$(realpath -m "${CARGO_TARGET_DIR:-target}/agent-clis")
while read -r package version; do
    [[ -z $package || $package == \#* ]] && continue
    dir=$root/${package//\//+}@$version
    if [[ ! -f $dir/.installed ]]; then
        say "installing $package@$version"
        rm -rf "$dir"
        mkdir -p "$dir"
        # The package's own install step puts its platform's binary in place (Claude Code's
        # postinstall; Codex's optional dependency per platform).
        npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "$package@$version" >&2
        touch "$dir/.installed"
    fi
    case $package in
        @anthropic-ai/claude-code) echo "SHOPFLOOR_TEST_CLAUDE=$dir/node_modules/.bin/claude" ;;
        @openai/codex) echo "SHOPFLOOR_TEST_CODEX=$dir/node_modules/.bin/codex" ;;
        *) say "no test variable for $package"; exit 1 ;;
    esac
done < scripts/agent-clis.txt
