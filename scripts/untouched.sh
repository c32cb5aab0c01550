#!/usr/bin/env bash
# Prove that `make test` leaves alone what a user runs: the tsoracle files of every
# PostgreSQL installation a server may run from (scripts/postgresql-versions), and the demo
# servers `make run` started (.run/). `snapshot` records them before the tests, `check`
# compares after: same file contents, same running postmasters (same PIDs, still answering).
#
# Usage: scripts/untouched.sh snapshot|check FILE
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:?usage: untouched.sh snapshot|check FILE}
file=${2:?usage: untouched.sh snapshot|check FILE}

state() {
    local name bin pkglib share f pidfile pid
    for name in $(awk '$0 !~ /^#/ && NF {print $1}' scripts/postgresql-versions); do
        bin=$(PG_INSTALL_NO_FETCH=1 scripts/pg-install.sh "$name" 2>/dev/null) || continue
        pkglib=$("$bin/pg_config" --pkglibdir)
        share=$("$bin/pg_config" --sharedir)
        for f in "$pkglib/tsoracle.so" "$share/extension"/tsoracle*; do
            [ -e "$f" ] && echo "file $f $(md5sum <"$f" | cut -d' ' -f1)"
        done
    done
    for pidfile in .run/pgdata/postmaster.pid .run/pg*/pgdata/postmaster.pid; do
        [ -f "$pidfile" ] || continue
        pid=$(head -n1 "$pidfile")
        if kill -0 "$pid" 2>/dev/null; then echo "server $pidfile pid $pid running"; fi
    done
    return 0
}

case "$mode" in
snapshot) state >"$file" ;;
check)
    if diff -u "$file" <(state) >&2; then
        echo "untouched: $(grep -c '^file' "$file") installed files and $(grep -c '^server' "$file") demo servers as before the tests"
    else
        echo "untouched: make test changed the installations or the demo servers above (- before, + after)" >&2
        exit 1
    fi
    ;;
*) echo "usage: untouched.sh snapshot|check FILE" >&2; exit 2 ;;
esac
