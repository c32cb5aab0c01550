#!/usr/bin/env bash
# Golden-output tests of the SQL surface (tests/pg_regress, pg_regress as pgvector and
# pg_graphql use it): every function's errors with SQLSTATE and HINT, the privilege matrix,
# the objects, columns and settings the extension installs. Each file in tests/pg_regress/sql
# runs through psql; its output must equal tests/pg_regress/expected/<name>.out byte for byte.
#
# Usage: scripts/test-regress.sh BIN
#   BIN: the bin directory of a PostgreSQL installation with this tree's build installed
#   (`make test` passes the private copy scripts/test-pg.sh made). A throwaway cluster is
#   started from it on a free loopback port, with tsoracle preloaded, and stopped after.
#
# An intended change of the output: run this, review results/<name>.out (the path is
# printed) against the diff, and copy it over expected/<name>.out.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${1:?usage: test-regress.sh BIN}
TESTS=(setup surface errors privileges)

die() { echo "test-regress: $*" >&2; exit 1; }

PG_CONFIG=$BIN/pg_config
[ -x "$PG_CONFIG" ] || die "$PG_CONFIG not found"
REGRESS=$("$PG_CONFIG" --pkglibdir)/pgxs/src/test/regress/pg_regress
[ -x "$REGRESS" ] || die "$REGRESS not found (the server development files of this major)"

WORK=$(mktemp -d /tmp/tsoracle-regress.XXXXXX)
chown postgres:postgres "$WORK"
chmod 755 "$WORK"
DATA=$WORK/data
cleanup() {
    local rc=$?
    if [ -s "$DATA/PG_VERSION" ]; then
        runuser -u postgres -- "$BIN/pg_ctl" -D "$DATA" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    # Kept on failure, for the diffs and the server log.
    if [ "$rc" = 0 ]; then rm -rf "$WORK"; else echo "test-regress: kept $WORK" >&2; fi
    exit "$rc"
}
trap cleanup EXIT

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
scripts/init-cluster.sh "$BIN" "$DATA" "$PORT" "$WORK" \
    max_prepared_transactions=2 lc_messages=C log_min_messages=warning
runuser -u postgres -- "$BIN/pg_ctl" -D "$DATA" -l "$WORK/server.log" -w start >/dev/null \
    || { cat "$WORK/server.log" >&2; die "the server did not start"; }

psql=("$BIN/psql" -h "$WORK" -p "$PORT" -U postgres -d postgres -qAtX -v ON_ERROR_STOP=1)
"${psql[@]}" -c "CREATE EXTENSION tsoracle" >/dev/null
# The first fence runs when the worker sees the extension: the tests start once it serves.
for _ in $(seq 1 300); do
    "${psql[@]}" -c "SELECT tso_next()" >/dev/null 2>&1 && break
    sleep 0.1
done
"${psql[@]}" -c "SELECT tso_next()" >/dev/null || die "the oracle does not serve"

mkdir -p "$WORK/out"
if ! "$REGRESS" --bindir="$BIN" --host="$WORK" --port="$PORT" --user=postgres \
    --use-existing --dbname=postgres \
    --inputdir=tests/pg_regress --outputdir="$WORK/out" "${TESTS[@]}"; then
    [ ! -f "$WORK/out/regression.diffs" ] || cat "$WORK/out/regression.diffs" >&2
    echo "test-regress: the output is in $WORK/out/results/" >&2
    exit 1
fi
