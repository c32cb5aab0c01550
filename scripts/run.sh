#!/usr/bin/env bash
# Start (or restart) a local PostgreSQL 15 cluster with tsoracle preloaded, create the
# extension and show it working. Data lives in .run/ (owned by the postgres OS user, since
# PostgreSQL refuses to run as root). Run `make stop` to stop it.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=/usr/lib/postgresql/15/bin
PORT=${TSORACLE_PORT:-55432}
DATA="$ROOT/.run/pgdata"
LOG="$ROOT/.run/postgresql.log"
as_pg() { runuser -u postgres -- "$@"; }

mkdir -p "$ROOT/.run"
chown postgres:postgres "$ROOT/.run"
if [ ! -s "$DATA/PG_VERSION" ]; then
    echo "==> initdb $DATA"
    as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 >/dev/null
    cat >>"$DATA/postgresql.conf" <<CONF
# --- tsoracle demo cluster ---
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$ROOT/.run'
shared_preload_libraries = 'tsoracle'
tsoracle.database = 'postgres'
CONF
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
\echo '==> a durable gapless block of 100 from counter demo_orders:'
SELECT tso_seq('demo_orders', 100) AS start, tso_seq_peek('demo_orders') AS next_start;
\echo '==> the safe frontier (no leases: the committed high-water):'
SELECT tso_safe_frontier();
\echo '==> tso_status():'
\x on
SELECT * FROM tso_status();
SQL

cat <<EOF2

tsoracle is running on 127.0.0.1:$PORT (data: $DATA, log: $LOG).
  connect:  psql -h 127.0.0.1 -p $PORT -U postgres postgres
  stop:     make stop
EOF2
