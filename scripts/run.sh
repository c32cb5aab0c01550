#!/usr/bin/env bash
# Start (or restart) a local cluster of PostgreSQL $PG_MAJOR (default 15) with tsoracle
# preloaded, create the extension and show it working; `run.sh stop` stops it. Data lives in
# .run/ (PostgreSQL 15) or .run/pg<major>/ (owned by the postgres OS user, since PostgreSQL
# refuses to run as root); the port is 55432 for 15 and 554<major> for the others.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PG_MAJOR=${PG_MAJOR:-15}
BIN=$("$ROOT/scripts/pg-install.sh" "$PG_MAJOR")
if [ "$PG_MAJOR" = 15 ]; then
    RUN="$ROOT/.run"
    PORT=${TSORACLE_PORT:-55432}
else
    RUN="$ROOT/.run/pg$PG_MAJOR"
    PORT=${TSORACLE_PORT:-554$PG_MAJOR}
fi
DATA="$RUN/pgdata"
LOG="$RUN/postgresql.log"
as_pg() { runuser -u postgres -- "$@"; }

if [ "${1:-}" = stop ]; then
    if [ -s "$DATA/PG_VERSION" ]; then as_pg "$BIN/pg_ctl" -D "$DATA" -m fast -w stop || true; fi
    exit 0
fi

mkdir -p "$RUN"
chown postgres:postgres "$ROOT/.run" "$RUN"
if [ ! -s "$DATA/PG_VERSION" ]; then
    echo "==> initdb $DATA"
    "$ROOT/scripts/init-cluster.sh" "$BIN" "$DATA" "$PORT" "$RUN"
fi

if as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
    echo "==> restarting the cluster on port $PORT (to load the freshly installed extension)"
    as_pg "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -m fast -w restart >/dev/null
else
    echo "==> starting the cluster on port $PORT"
    as_pg "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -w start >/dev/null
fi

PSQL=("$BIN/psql" -X -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1)
"${PSQL[@]}" -q -c "CREATE EXTENSION IF NOT EXISTS tsoracle"
# A cluster made by an earlier version: move its extension to the installed library's version.
"${PSQL[@]}" -q -c "ALTER EXTENSION tsoracle UPDATE"
"${PSQL[@]}" <<'SQL'
\echo '==> five timestamps, strictly increasing:'
SELECT ts, tso_physical(ts) AS physical_ms, tso_logical(ts) AS logical, tso_to_timestamptz(ts) AS at
  FROM (SELECT tso_next() AS ts FROM generate_series(1, 5)) t;
\echo '==> a batch of 1000 consecutive timestamps starts at:'
SELECT tso_next_batch(1000) AS first;
\echo '==> a UUIDv7 made of the next timestamp, and that timestamp back:'
SELECT id, tso_from_uuid(id) AS ts, tso_to_timestamptz(tso_from_uuid(id)) AS at
  FROM (SELECT tso_next_uuid() AS id) t;
\set QUIET on
SET client_min_messages = warning;
CREATE TABLE IF NOT EXISTS demo_outbox (ts bigint PRIMARY KEY DEFAULT tso_next(), payload text);
TRUNCATE demo_outbox;
INSERT INTO demo_outbox (payload) VALUES ('order 1 placed'), ('order 2 placed'), ('order 1 paid');
\set QUIET off
\echo '==> an outbox stamped with DEFAULT tso_next() (3 rows), read in order by a consumer'
\echo '    that moves its cursor :last to tso_resolved() (:last starts at 0):'
\echo '      SELECT tso_resolved() AS r \\gset'
\echo '      SELECT ts, payload FROM demo_outbox WHERE ts > :last AND ts <= :r ORDER BY ts;'
\echo '      \\set last :r'
\set last 0
SELECT tso_resolved() AS r \gset
SELECT ts, payload FROM demo_outbox WHERE ts > :last AND ts <= :r ORDER BY ts;
\set last :r
\echo '==> one more row, and the same three lines again: the consumer reads only the new row:'
\set QUIET on
INSERT INTO demo_outbox (payload) VALUES ('order 1 shipped');
\set QUIET off
SELECT tso_resolved() AS r \gset
SELECT ts, payload FROM demo_outbox WHERE ts > :last AND ts <= :r ORDER BY ts;
\set last :r
\echo '==> a durable gapless block of 100 from counter demo_orders:'
SELECT tso_seq('demo_orders', 100) AS start, tso_seq_peek('demo_orders') AS next_start;
\echo '==> the safe frontier (no leases: the committed high-water):'
SELECT tso_safe_frontier();
\echo '==> tso_status():'
\x on
SELECT * FROM tso_status();
\echo '==> tso_clock():'
SELECT * FROM tso_clock();
SQL

cat <<EOF2

tsoracle is running on 127.0.0.1:$PORT (data: $DATA, log: $LOG).
  connect:  psql -h 127.0.0.1 -p $PORT -U postgres postgres
  stop:     make stop PG_MAJOR=$PG_MAJOR
EOF2
