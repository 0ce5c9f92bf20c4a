# What the scripts share, sourced by them (not run): where PostgreSQL's server binaries are.

# True when PostgreSQL's server binaries are found where the `shopfloor` binary looks for them.
have_pg_server() {
    local dir
    dir=$(pg_config --bindir 2>/dev/null || true)
    for dir in "$dir" /usr/lib/postgresql/*/bin; do
        [[ -n $dir && -x $dir/pg_ctl && -x $dir/initdb && -x $dir/postgres ]] && return 0
    done
    command -v pg_ctl >/dev/null && command -v initdb >/dev/null && command -v postgres >/dev/null
}
