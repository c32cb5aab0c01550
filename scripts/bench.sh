#!/usr/bin/env bash
# `make bench`: benchmark the installed tsoracle extension against baselines measured in the
# same run, on a throw-away cluster with the extension preloaded.
#
# Every candidate workload is interleaved with its baselines (the order rotates each
# repetition) and each figure is the median of BENCH_REPS runs; ratios are the median of the
# per-repetition ratios (candidate run i / baseline run i), so slow phases of a noisy machine
# hit both sides of a ratio alike. Speed never fails the script: a missed target is printed
# as NOT MET and the exit status is 0 unless something actually broke (a failed run, a
# crash in the server log, a cluster that would not start).
#
# Knobs (environment): BENCH_SECONDS (pgbench -T per run, default 8), BENCH_REPS (default 3),
# BENCH_THROUGHPUT_REPS (repetitions of section 1, tso_next() against SELECT 1 and
# pg_backend_pid(): default 7, or BENCH_REPS if more),
# BENCH_CLIENTS (default "8 32"), BENCH_PERCALL_N (rows for the per-call rows, default 2000000),
# BENCH_PERCALL_REPS (repetitions of the per-call rows, cheap, default 7),
# BENCH_P99_WINDOW_MS (tsoracle.window_ahead_ms during the p99 runs, default 50),
# BENCH_P99_RATE (total -R of the open-loop latency runs, default 4000/s),
# BENCH_WRITE_CLIENTS (INSERT and UPDATE rows, default: BENCH_CLIENTS),
# BENCH_UPDATE_ROWS (rows of the UPDATE tables, default 100000),
# BENCH_COPY_ROWS (rows per COPY, default 1000000), BENCH_COPY_REPS (default 5),
# BENCH_CEIL_CLIENTS (tso_seq against one-row INSERT commits, one key and from 8 clients up
# eight keys, default "1 2 4 8 32 128"; empty skips it), BENCH_CEIL_REPS (default 9),
# BENCH_CEIL_ONE_REPS and BENCH_CEIL_ONE_SECONDS (its one-client row: 15 pairs of 3 s runs, as
# one client's rate follows the virtual disk's flush, which drifts by 15 % from run to run),
# BENCH_MEMBER_CLIENTS (a member of a fleet: its tso_next() against its SELECT 1 and the
# oracle's tso_next(), default "1 8 32 128"; then its one-row INSERTs at BENCH_WRITE_CLIENTS,
# a COPY and an INSERT ... SELECT of BENCH_COPY_ROWS rows; empty skips it all),
# BENCH_SLOT_CLIENTS (tso_seq and tso_next() with a logical slot present, against the same
# baselines, default "1 8 32"; empty skips it), BENCH_SLOT_PLUGIN (its plugin, default pgoutput,
# the slot of a publication of another table, as an outbox's CDC makes; test_decoding too),
# BENCH_ORACLE_MEMBERS (an oracle serving simulated members, on a cluster of its own: one
# pgbench client per member, each a tsoracle.member_hello then tsoracle.member_next(k) round
# trips, scripts/bench/oracle_member.sql; default "8 64 256 1000"; empty skips it),
# BENCH_ORACLE_K (k, default "1 16"), BENCH_ORACLE_SECONDS (pgbench -T per point, default 5),
# BENCH_ONLY (run only these sections, e.g. "throughput writes": throughput, resolved, percall,
# batch, seq, ceiling, slot, member, writes, p99, curve, oracle; default: all),
# BENCH_CURVE_CLIENTS (the scaling curve, default "1 2 4 8 16 32 64 128 256"; empty skips it),
# BENCH_CURVE_SECONDS (pgbench -T per curve run, default 5), BENCH_CURVE_REPS (default 2),
# BENCH_CURVE_SAMPLING (pgbench --sampling-rate of the curve's per-transaction logs, default 0.2),
# BENCH_PLOT (where the curve's PNG goes, default BENCHMARKS-scaling.png next to BENCHMARKS.md;
# empty: no plot, and matplotlib is not needed),
# BENCH_REPORT (also write the report to this file),
# BENCH_KEEP=1 keeps the work directory (logs, per-transaction logs, results.tsv) for inspection,
# BENCH_PG_BIN (the PostgreSQL installation to run: the directory of its postgres, pg_ctl, initdb,
# pg_config, psql and pgbench; default /usr/lib/postgresql/15/bin, Debian's PostgreSQL 15; a
# relocatable installation such as /opt/tsoracle/postgresql-18.6.0/bin works too),
# BENCH_SO / BENCH_EXT_DIR benchmark another tsoracle.so / extension SQL directory than the
# installed ones (default: `pg_config --pkglibdir`/tsoracle.so and `pg_config --sharedir`/extension
# of that installation). The hand-off floor of a member (BENCHMARKS.md): BENCH_SO=$(
# CARGO_TARGET_DIR=target/floor TSORACLE_FEATURES=handoff-floor INSTALL_PROFILE=tests
# scripts/build-ext.sh PG_CONFIG)/<pkglibdir>/tsoracle.so BENCH_ONLY=member, a build whose
# member answers tso_next() without its oracle (the report says so).
# BENCH_FLOOR_SO: such a handoff-floor tsoracle.so (`make bench` builds one, release profile,
# in target/floor): the member section then starts a second member on it, beside the first and
# of the same oracle, and interleaves its one-row INSERTs with the first member's: the ratio of
# the member against its hand-off floor in the same run (empty: no floor rows).
#
# The server runs from a private snapshot of the PostgreSQL installation (postgres, pg_ctl,
# initdb, the libraries, the share directory) taken at the start, with tsoracle.so and its SQL
# copied in: PostgreSQL finds pkglibdir and sharedir relative to its executable, so the
# benchmark measures one consistent build even if tsoracle is reinstalled meanwhile (an in-place
# reinstall under a running server can crash it). The snapshot mirrors the absolute paths that
# pg_config reports under a private root, which keeps their relative layout whatever it is
# (Debian's bin and lib under /usr/lib/postgresql/N and share under /usr/share/postgresql/N, or
# one prefix with bin/, lib/ and share/).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
HERE="$ROOT/scripts/bench"
die() { echo "bench: $*" >&2; exit 1; }
as_pg() { runuser -u postgres -- "$@"; }
[ "$(id -u)" = 0 ] || die "run as root (initdb/pg_ctl run as the postgres OS user via runuser)"

# The PostgreSQL installation: clients (psql, pgbench) run from it, the server from a snapshot.
SYSBIN=${BENCH_PG_BIN:-/usr/lib/postgresql/15/bin}
PG_CONFIG="$SYSBIN/pg_config"
[ -x "$PG_CONFIG" ] || die "$PG_CONFIG not found (BENCH_PG_BIN=$SYSBIN: the bin directory of a PostgreSQL installation; for 15: apt-get install postgresql-15)"
for exe in postgres pg_ctl initdb psql pgbench; do
    [ -x "$SYSBIN/$exe" ] || die "$SYSBIN/$exe not found"
done
SYS_BINDIR=$("$PG_CONFIG" --bindir) || die "$PG_CONFIG --bindir failed"
SYS_PKGLIB=$("$PG_CONFIG" --pkglibdir) || die "$PG_CONFIG --pkglibdir failed"
SYS_SHARE=$("$PG_CONFIG" --sharedir) || die "$PG_CONFIG --sharedir failed"
[ "$(readlink -f "$SYS_BINDIR")" = "$(readlink -f "$SYSBIN")" ] \
    || die "$PG_CONFIG says its bin directory is $SYS_BINDIR, not $SYSBIN"
SRC_SO=${BENCH_SO:-$SYS_PKGLIB/tsoracle.so}
SRC_EXT=${BENCH_EXT_DIR:-$SYS_SHARE/extension}
SECS=${BENCH_SECONDS:-8}
REPS=${BENCH_REPS:-3}
# Section 1's ratios sit within a few percent of their targets on 2 shared cores, where a
# single run strays by 10 %: at least 7 repetitions, whatever BENCH_REPS says.
THROUGHPUT_REPS=${BENCH_THROUGHPUT_REPS:-$(( REPS > 7 ? REPS : 7 ))}
CLIENTS=${BENCH_CLIENTS:-"8 32"}
PERCALL_N=${BENCH_PERCALL_N:-2000000}
PERCALL_REPS=${BENCH_PERCALL_REPS:-7}
P99_WINDOW_MS=${BENCH_P99_WINDOW_MS:-50}
P99_CLIENTS=8
P99_RATE_CLIENTS=4
P99_RATE=${BENCH_P99_RATE:-4000}
BATCH_CLIENTS=8
WRITE_CLIENTS=${BENCH_WRITE_CLIENTS:-$CLIENTS}
UPDATE_ROWS=${BENCH_UPDATE_ROWS:-100000}
COPY_ROWS=${BENCH_COPY_ROWS:-1000000}
COPY_REPS=${BENCH_COPY_REPS:-5}
CURVE_CLIENTS=${BENCH_CURVE_CLIENTS-"1 2 4 8 16 32 64 128 256"}
CEIL_CLIENTS=${BENCH_CEIL_CLIENTS-"1 2 4 8 32 128"}
CEIL_REPS=${BENCH_CEIL_REPS:-9}
CEIL_ONE_REPS=${BENCH_CEIL_ONE_REPS:-15}
CEIL_ONE_SECS=${BENCH_CEIL_ONE_SECONDS:-3}
MEMBER_CLIENTS=${BENCH_MEMBER_CLIENTS-"1 8 32 128"}
SLOT_CLIENTS=${BENCH_SLOT_CLIENTS-"1 8 32"}
SLOT_PLUGIN=${BENCH_SLOT_PLUGIN:-pgoutput}
ORACLE_MEMBERS=${BENCH_ORACLE_MEMBERS-"8 64 256 1000"}
ORACLE_K=${BENCH_ORACLE_K:-"1 16"}
ORACLE_SECS=${BENCH_ORACLE_SECONDS:-5}
ONLY=${BENCH_ONLY:-}
# want SECTION: run this section (all of them unless BENCH_ONLY names some).
want() { [ -z "$ONLY" ] || [[ " $ONLY " == *" $1 "* ]]; }
CURVE_SECS=${BENCH_CURVE_SECONDS:-5}
CURVE_REPS=${BENCH_CURVE_REPS:-2}
CURVE_SAMPLING=${BENCH_CURVE_SAMPLING:-0.2}
PLOT=${BENCH_PLOT-$ROOT/BENCHMARKS-scaling.png}
MATPLOTLIB_PIN=3.10.3
# max_connections: 300, or more if the curve asks for more clients (plus the sampler and psql).
MAX_CONN=300
for c in $CURVE_CLIENTS $CLIENTS $WRITE_CLIENTS; do
    [ $(( c + 10 )) -le "$MAX_CONN" ] || MAX_CONN=$(( c + 10 ))
done

[ -f "$SRC_SO" ] || die "$SRC_SO not found (make install; for another installation: scripts/install-ext.sh $PG_CONFIG)"
[ -f "$SRC_EXT/tsoracle.control" ] || die "$SRC_EXT/tsoracle.control not found (make install)"

# The curve's plot needs matplotlib: install it now if it is missing (once; pinned), so that a
# machine without it fails here, not after twenty minutes of measuring.
if [ -n "$PLOT" ] && [ -n "$CURVE_CLIENTS" ] && ! python3 -c 'import matplotlib' 2>/dev/null; then
    echo "==> installing matplotlib==$MATPLOTLIB_PIN for the scaling plot (python3 -m pip)" >&2
    python3 -m pip install --quiet --disable-pip-version-check "matplotlib==$MATPLOTLIB_PIN" >&2 \
        && python3 -c 'import matplotlib' 2>/dev/null \
        || die "could not install matplotlib for python3 (BENCH_PLOT= runs without the plot)"
fi

WORK=$(mktemp -d /tmp/tsoracle-bench.XXXXXX) || die "mktemp failed"
chown postgres:postgres "$WORK"
chmod 755 "$WORK"
DATA="$WORK/pgdata"
LOG="$WORK/postgresql.log"
RES="$WORK/results.tsv"
RUNS="$WORK/runs"
mkdir -p "$RUNS"
: >"$RES"

cleanup() {
    local rc=$?
    if [ -n "${SAMPLER_PID:-}" ]; then kill "$SAMPLER_PID" 2>/dev/null; wait "$SAMPLER_PID" 2>/dev/null; fi
    if [ -s "$DATA/PG_VERSION" ]; then
        as_pg "$BIN/pg_ctl" -D "$DATA" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    local d
    for d in "$WORK/member" "$WORK/member-floor" "$WORK/oracle"; do
        if [ -s "$d/PG_VERSION" ]; then
            as_pg "$BIN/pg_ctl" -D "$d" -m immediate -w stop >/dev/null 2>&1 || true
        fi
    done
    if [ "${BENCH_KEEP:-0}" = 1 ]; then
        echo "bench: kept $WORK" >&2
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The private snapshot of the server installation (see the top of this file).
PGROOT="$WORK/root"
BIN="$PGROOT$SYS_BINDIR"
PKGLIB="$PGROOT$SYS_PKGLIB"
SHARE="$PGROOT$SYS_SHARE"
mkdir -p "$BIN" "$PKGLIB" "$SHARE"
cp "$SYSBIN/postgres" "$SYSBIN/pg_ctl" "$SYSBIN/initdb" "$BIN/"
# Every shared library of pkglibdir but tsoracle's, symbolic links kept (in a single-prefix
# installation pkglibdir is also libdir: initdb and pg_ctl find libpq.so.5 there through their
# RUNPATH $ORIGIN/../lib).
for f in "$SYS_PKGLIB"/*.so "$SYS_PKGLIB"/*.so.*; do
    [ -e "$f" ] || continue
    [ "$(basename "$f")" = tsoracle.so ] || cp -a "$f" "$PKGLIB/"
done
cp -a "$SYS_SHARE/." "$SHARE/"
rm -f "$SHARE"/extension/tsoracle*
snap_ok=0
for _ in $(seq 1 30); do
    # Copy, then accept the copy only if the sources were not being rewritten meanwhile.
    before=$(stat -c '%Y %s' "$SRC_SO" "$SRC_EXT"/tsoracle* 2>/dev/null | md5sum)
    cp "$SRC_SO" "$PKGLIB/tsoracle.so" && cp "$SRC_EXT"/tsoracle.control "$SRC_EXT"/tsoracle--*.sql "$SHARE/extension/"
    sleep 1
    after=$(stat -c '%Y %s' "$SRC_SO" "$SRC_EXT"/tsoracle* 2>/dev/null | md5sum)
    age=$(( $(date +%s) - $(stat -c %Y "$SRC_SO") ))
    if [ "$before" = "$after" ] && [ "$age" -ge 2 ] && cmp -s "$SRC_SO" "$PKGLIB/tsoracle.so"; then
        snap_ok=1
        break
    fi
    rm -f "$PKGLIB/tsoracle.so" "$SHARE"/extension/tsoracle*
    sleep 1
done
[ "$snap_ok" = 1 ] || die "$SRC_SO kept changing: could not take a consistent copy"
chmod -R a+rX "$PGROOT"
# The hand-off floor's member runs from a snapshot of its own: the same installation, the same
# SQL scripts, its tsoracle.so the floor build.
FLOOR_SO=${BENCH_FLOOR_SO:-}
if [ -n "$FLOOR_SO" ]; then
    [ -f "$FLOOR_SO" ] || die "BENCH_FLOOR_SO=$FLOOR_SO: no such file"
    grep -qa 'built with the feature handoff-floor' "$FLOOR_SO" \
        || die "BENCH_FLOOR_SO=$FLOOR_SO was not built with the feature handoff-floor"
    FROOT="$WORK/floor-root"
    cp -a "$PGROOT" "$FROOT" && cp "$FLOOR_SO" "$FROOT$SYS_PKGLIB/tsoracle.so" || die "the floor's snapshot failed"
    FBIN="$FROOT$SYS_BINDIR"
fi

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
[ "$PORT" != 55432 ] || PORT=55433

echo "==> initdb $DATA (port $PORT)" >&2
"$ROOT/scripts/init-cluster.sh" "$BIN" "$DATA" "$PORT" "$WORK" "max_connections=$MAX_CONN" "jit=off" \
    || die "initdb failed"
as_pg "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start >/dev/null \
    || { tail -n 30 "$LOG" >&2; die "the cluster did not start"; }

PSQL=("$SYSBIN/psql" -X -q -At -h "$WORK" -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1)
sql() { "${PSQL[@]}" -c "$1"; }
rec() { local IFS=$'\t'; echo "$*" >>"$RES"; }
status_json() { sql "SELECT row_to_json(s) FROM tso_status() s" 2>/dev/null || echo '{}'; }
status_rec() { rec status "$1" "$(status_json)"; }

pkglibdir=$(sql "SELECT setting FROM pg_config WHERE name = 'PKGLIBDIR'")
case "$pkglibdir" in
    "$PGROOT"/*) ;;
    *) die "the server loads libraries from '$pkglibdir', not from the snapshot in $PGROOT" ;;
esac
sql "CREATE EXTENSION tsoracle" || die "CREATE EXTENSION tsoracle failed"
state=""
for _ in $(seq 1 300); do
    state=$(sql "SELECT state FROM tso_status()" 2>/dev/null)
    [ "$state" = serving ] && break
    sleep 0.2
done
[ "$state" = serving ] || { tail -n 30 "$LOG" >&2; die "tsoracle did not reach 'serving' (state: '$state')"; }

# A trivial C function of another extension (pg_trgm's show_limit(), from contrib): what
# PostgreSQL's look-ups of a function that is not built in cost a one-call statement. Skipped
# where contrib is not installed.
EXTFN=""
sql "CREATE EXTENSION pg_trgm" >/dev/null 2>&1 && EXTFN=extfn

sql "CREATE SEQUENCE s; CREATE SEQUENCE s100 INCREMENT BY 100;
     CREATE TABLE counter (id int PRIMARY KEY, v bigint NOT NULL);
     INSERT INTO counter VALUES (1, 0);" && sql "VACUUM ANALYZE counter" || die "set-up failed"

# The write paths (section 5): three tables alike but for the default of ts (8 bytes each:
# bigint or timestamptz), each with a b-tree index on ts; three tables alike but for how the
# version column is stamped. Autovacuum is off for them: the script truncates (INSERT, COPY)
# or vacuums (UPDATE) a table and takes a checkpoint before every run instead, so that every
# run starts from the same state and no run pays for another's checkpoint or vacuum.
sql "CREATE SEQUENCE s_ts;
     CREATE TABLE t_tso   (ts bigint      NOT NULL DEFAULT tso_next(),        v int NOT NULL) WITH (autovacuum_enabled = off);
     CREATE TABLE t_clock (ts timestamptz NOT NULL DEFAULT clock_timestamp(), v int NOT NULL) WITH (autovacuum_enabled = off);
     CREATE TABLE t_seq   (ts bigint      NOT NULL DEFAULT nextval('s_ts'),   v int NOT NULL) WITH (autovacuum_enabled = off);
     CREATE INDEX t_tso_ts ON t_tso (ts);
     CREATE INDEX t_clock_ts ON t_clock (ts);
     CREATE INDEX t_seq_ts ON t_seq (ts);
     CREATE TABLE a_tso   (id int PRIMARY KEY, v int NOT NULL, version bigint      NOT NULL) WITH (autovacuum_enabled = off);
     CREATE TABLE a_clock (id int PRIMARY KEY, v int NOT NULL, version timestamptz NOT NULL) WITH (autovacuum_enabled = off);
     CREATE TABLE a_inc   (id int PRIMARY KEY, v int NOT NULL, version bigint      NOT NULL) WITH (autovacuum_enabled = off);
     INSERT INTO a_tso   SELECT g, 0, tso_next()        FROM generate_series(1, $UPDATE_ROWS) g;
     INSERT INTO a_clock SELECT g, 0, clock_timestamp() FROM generate_series(1, $UPDATE_ROWS) g;
     INSERT INTO a_inc   SELECT g, 0, 1                 FROM generate_series(1, $UPDATE_ROWS) g;" \
    && sql "VACUUM ANALYZE a_tso, a_clock, a_inc" || die "set-up of the write tables failed"
# UUID keys: tables alike but for the default of their primary key (PostgreSQL 18 has uuidv7()).
sql "CREATE TABLE t_uuid (id uuid PRIMARY KEY DEFAULT tso_next_uuid(),   v int NOT NULL) WITH (autovacuum_enabled = off);
     CREATE TABLE t_rand (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), v int NOT NULL) WITH (autovacuum_enabled = off);" \
    || die "set-up of the UUID tables failed"
UUIDV7=()
if sql "CREATE TABLE t_uuidv7 (id uuid PRIMARY KEY DEFAULT uuidv7(), v int NOT NULL) WITH (autovacuum_enabled = off)" 2>/dev/null; then
    UUIDV7=(ins_uuidv7)
fi

SEQ_OK=1
if ! sql "SELECT tso_seq('k', 1)" >/dev/null 2>"$WORK/tso_seq.err"; then
    SEQ_OK=0
    rec info tso_seq "not available: $(head -n 1 "$WORK/tso_seq.err")"
    echo "==> tso_seq: not available ($(head -n 1 "$WORK/tso_seq.err"))" >&2
fi

# --- the machine and the settings ----------------------------------------------------------
rec info cpus "$(nproc)"
rec info cpu_model "$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)"
rec info memory "$(free -m | awk '/^Mem:/ {print $2 " MiB"}')"
rec info kernel "$(uname -r)"
rec info server "$(sql 'SELECT version()')"
rec info server_version "$(sql 'SHOW server_version')"
rec info pg_bin "$SYSBIN ($PG_CONFIG: $("$PG_CONFIG" --version))"
rec info pgbench "$("$SYSBIN/pgbench" --version)"
so_build=release
readelf -S "$PKGLIB/tsoracle.so" 2>/dev/null | grep -q '\.debug_info' && so_build="DEBUG (has .debug_info: probably an unoptimised build, e.g. installed by cargo pgrx test; figures are not representative)"
grep -qa 'built with the feature handoff-floor' "$PKGLIB/tsoracle.so" \
    && so_build="HANDOFF-FLOOR (a member answers tso_next() without its oracle: the member rows measure the hand-off alone)"
rec info extension "$SRC_SO: $(stat -c %s "$PKGLIB/tsoracle.so") bytes, sha256 $(sha256sum "$PKGLIB/tsoracle.so" | cut -c1-12), installed $(date -u -d "@$(stat -c %Y "$SRC_SO")" '+%F %T UTC'), build: $so_build"
rec info settings "$(sql "SELECT string_agg(name || '=' || setting || coalesce(unit, ''), ', ' ORDER BY name)
    FROM pg_settings WHERE name IN ('shared_buffers', 'max_connections', 'fsync', 'synchronous_commit',
      'wal_level', 'tsoracle.window_ahead_ms', 'tsoracle.failover_advance_ms', 'work_mem',
      'data_checksums', 'io_method', 'max_wal_size', 'checkpoint_timeout')")"
rec info percall_n "$PERCALL_N"
rec info percall_reps "$PERCALL_REPS"
rec info seconds "$SECS"
rec info bench "pgbench -n -M prepared -T $SECS -c <clients> -j <min(clients, $(nproc))> -f <script>; $REPS repetitions ($THROUGHPUT_REPS for tso_next() against SELECT 1 and pg_backend_pid()), order rotated per repetition"
rec info scripts "$(for f in "$HERE"/*.sql; do printf '%s: %s  ' "$(basename "$f" .sql)" "$(tr '\n' ' ' <"$f" | sed 's/ *$//')"; done)"
status_rec start

# --- helpers ---------------------------------------------------------------------------------

# Sample the wait events of active client backends and of the tsoracle worker every 0.25 s,
# in one session, into $1, for about as long as one run (the session ends by itself: killing
# it would log FATALs).
start_sampler() {
    local out=$1 n=$(( ${RUN_SECS:-$SECS} * 4 - 1 ))
    {
        # Renice the sampler (psql and its backend) so that it still gets to run on a
        # saturated machine; it costs a few queries a second.
        echo 'SELECT pg_backend_pid() AS sampler_pid \gset'
        echo '\setenv SAMPLER_PID :sampler_pid'
        echo '\! renice -n -5 -p "$SAMPLER_PID" "$PPID" >/dev/null 2>&1'
        for _ in $(seq 1 "$n"); do
            echo "SELECT pg_sleep(0.25) \\g /dev/null"
            echo "SELECT CASE WHEN backend_type = 'client backend' THEN '' ELSE 'worker ' END
                          || coalesce(wait_event_type || ':' || wait_event, 'CPU')
                     FROM pg_stat_activity
                    WHERE pid <> pg_backend_pid()
                      AND ((backend_type = 'client backend' AND state = 'active') OR backend_type LIKE 'tsoracle%');"
        done
    } >"$out.sql"
    "${PSQL[@]}" -f "$out.sql" >"$out" 2>/dev/null &
    SAMPLER_PID=$!
}
# Sample how far the resolved timestamp lags the last issued value (tso_resolved_status().lag_ms)
# every 50 ms, into $1, for about as long as one run (INSERT ... DEFAULT tso_next() runs).
start_lag_sampler() {
    local out=$1 n=$(( ${RUN_SECS:-$SECS} * 20 - 2 ))
    {
        for _ in $(seq 1 "$n"); do
            echo "SELECT pg_sleep(0.05) \\g /dev/null"
            echo "SELECT lag_ms FROM tso_resolved_status();"
        done
    } >"$out.sql"
    "${PSQL[@]}" -f "$out.sql" >"$out" 2>/dev/null &
    LAG_SAMPLER_PID=$!
}
# stop_psql PID: give a sampler 3 s to end by itself, then end it.
stop_psql() {
    [ -n "$1" ] || return 0
    for _ in $(seq 1 30); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill "$1" 2>/dev/null
    wait "$1" 2>/dev/null
}
stop_lag_sampler() { stop_psql "${LAG_SAMPLER_PID:-}"; LAG_SAMPLER_PID=""; }
stop_sampler() { stop_psql "${SAMPLER_PID:-}"; SAMPLER_PID=""; }

# CPU busy % of the machine over $1 seconds while this benchmark is idle between runs, minus the
# CPU its own cluster used meanwhile: what other tenants of the machine use (the figures of a
# run next to a busy gap are suspect).
busy_pct() {
    python3 "$HERE/foreign_cpu.py" "$1" "$(head -n 1 "$DATA/postmaster.pid" 2>/dev/null)"
}

# The server must still be up (a crash restart is waited for; a dead server ends the run).
check_server() {
    for _ in $(seq 1 100); do
        [ "$(sql "SELECT state FROM tso_status()" 2>/dev/null)" = serving ] && return 0
        sleep 0.2
    done
    echo "bench: the server is down or tsoracle is not serving; last lines of $LOG:" >&2
    tail -n 15 "$LOG" >&2
    echo "bench: (if tsoracle.so was reinstalled while the benchmark ran, just rerun)" >&2
    exit 1
}

# run_pgbench WORKLOAD SCRIPT CLIENTS REP [extra pgbench args...]: one pgbench run, recorded.
run_pgbench() {
    local name=$1 script=$2 clients=$3 rep=$4
    shift 4
    local jobs=$clients
    [ "$jobs" -le "$(nproc)" ] || jobs=$(nproc)
    local tag="$name.c$clients.r$rep"
    check_server
    local out="$RUNS/$tag.out"
    start_sampler "$RUNS/$tag.waits"
    [ "$name" = ins_tso ] && start_lag_sampler "$RUNS/$tag.lag"
    "$SYSBIN/pgbench" -h "$WORK" -p "${TARGET_PORT:-$PORT}" -U postgres -n -M prepared -T "${RUN_SECS:-$SECS}" -c "$clients" -j "$jobs" \
        -f "$HERE/$script.sql" "$@" postgres >"$out" 2>&1
    local rc=$?
    stop_sampler
    if [ "$name" = ins_tso ]; then
        stop_lag_sampler
        rec lag "$name" "$clients" "$rep" "$RUNS/$tag.lag"
    fi
    local tps
    tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$out" | head -n 1)
    if [ "$rc" -ne 0 ] || [ -z "$tps" ]; then
        rec fail "$name" "$clients" "$rep" "$(grep -m 1 -iE 'error|abort|fatal' "$out" | tr '\t' ' ')"
        printf '    %-16s c=%-3s rep %s: FAILED (%s)\n' "$name" "$clients" "$rep" "$(grep -m 1 -iE 'error|abort|fatal' "$out")" >&2
    else
        rec tps "$name" "$clients" "$rep" "$tps"
        rec txns "$name" "$clients" "$rep" "$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$out" | head -n 1)"
        printf '    %-16s c=%-3s rep %s: %12.1f tps\n' "$name" "$clients" "$rep" "$tps" >&2
    fi
    rec waits "$name" "$clients" "$rep" "$RUNS/$tag.waits"
    rec busy "$name" "$clients" "$rep" "$(busy_pct 1)"
}

# rotated REP ITEM...: the items, one per line, rotated left by REP (the order of repetition
# REP, so that no workload always runs first or right after the same other one).
rotated() {
    local rep=$1
    shift
    local list=("$@") n=$# i
    for ((i = 0; i < n; i++)); do echo "${list[(i + rep) % n]}"; done
}

# interleave CLIENTS REP WORKLOAD...: run the workloads once each, order rotated by REP.
interleave() {
    local clients=$1 rep=$2 w
    shift 2
    for w in $(rotated "$rep" "$@"); do
        run_pgbench "$w" "$w" "$clients" "$rep"
    done
}

rec info busy_before "$(busy_pct 3)"

# --- 1. throughput: tso_next() vs SELECT 1 vs nextval('s') ------------------------------------
if want throughput; then
# SELECT clock_timestamp() is there to show what calling any function costs a one-call
# statement (against SELECT 1, which calls none).
echo "==> throughput: tso_next() vs SELECT 1 vs nextval('s') vs clock_timestamp() vs pg_backend_pid() (clients: $CLIENTS)" >&2
# SELECT pg_backend_pid() is a built-in function as trivial as one gets. The after_* pair:
# sessions that called tso_next() (or clock_timestamp()) once, then only SELECT 1: what a
# backend's later transactions pay for having once called tsoracle (pgbench -D done=0; each
# client's first transaction sets done).
for c in $CLIENTS; do
    RUN_SECS=3 run_pgbench warmup select1 "$c" 0 2>/dev/null   # connections, caches, CPU frequency
    for r in $(seq 1 "$THROUGHPUT_REPS"); do
        interleave "$c" "$r" select1 tso_next nextval clock pid $EXTFN
        for w in $(rotated "$r" after_tso_next after_clock); do
            run_pgbench "$w" "$w" "$c" "$r" -D done=0
        done
    done
done
fi

# --- 1b. tso_resolved(): cheap enough to poll ----------------------------------------------------
if want resolved; then
echo "==> throughput: tso_resolved() vs SELECT 1 ($BATCH_CLIENTS clients)" >&2
# Its SELECT 1 runs are recorded as res_select1: section 1's own SELECT 1 runs at the same
# client count are the baselines its tso_next() runs were paired with.
for r in $(seq 1 "$REPS"); do
    for w in $(rotated "$r" select1 resolved); do
        run_pgbench "res_$w" "$w" "$BATCH_CLIENTS" "$r"
    done
done
fi

# --- 2. per-call cost inside one backend -----------------------------------------------------
if want percall; then
echo "==> per-call cost: count(f()) over generate_series(1, $PERCALL_N)" >&2
{
    echo '\timing on'
    labels=(loop clock nextval tso_next)
    exprs=('count(1)' 'count(clock_timestamp())' "count(nextval('s'))" 'count(tso_next())')
    for i in 0 1 2 3; do
        echo "SELECT ${exprs[$i]} FROM generate_series(1, $PERCALL_N);"   # warm-up
    done
    for r in $(seq 1 "$PERCALL_REPS"); do
        for i in 0 1 2 3; do
            j=$(( (i + r) % 4 ))
            echo "\\echo @@ ${labels[$j]} $r"
            echo "SELECT ${exprs[$j]} FROM generate_series(1, $PERCALL_N);"
        done
    done
} >"$WORK/percall.sql"
check_server
if "${PSQL[@]}" -f "$WORK/percall.sql" >"$WORK/percall.out" 2>&1; then
    awk '/^@@ /{q=$2; r=$3; next} /^Time: /{ if (q != "") { printf "ms\t%s\t1\t%s\t%s\n", q, r, $2; q="" } }' \
        "$WORK/percall.out" >>"$RES"
    grep -A2 '^@@' "$WORK/percall.out" | grep -E '^@@|^Time' | paste - - | sed 's/^/    /' >&2
    rec busy percall 1 0 "$(busy_pct 1)"
else
    rec fail percall 1 0 "$(grep -m 1 ERROR "$WORK/percall.out" | tr '\t' ' ')"
    echo "    per-call runs FAILED: $(grep -m 1 ERROR "$WORK/percall.out")" >&2
fi
fi

# --- 3. tso_next_batch(1000) -----------------------------------------------------------------
if want batch; then
echo "==> tso_next_batch(1000), $BATCH_CLIENTS clients" >&2
for r in $(seq 1 "$REPS"); do
    run_pgbench tso_next_batch tso_next_batch "$BATCH_CLIENTS" "$r"
done
fi

# --- 4. tso_seq('k', 100) vs a counter table vs nextval ----------------------------------------
if want seq; then
if [ "$SEQ_OK" = 1 ]; then
    echo "==> tso_seq('k', 100) vs counter-table UPDATE ... RETURNING vs nextval('s100') (clients: $CLIENTS)" >&2
    for c in $CLIENTS; do
        for r in $(seq 1 "$REPS"); do
            for w in $(rotated "$r" tso_seq counter nextval100); do
                [ "$w" = tso_seq ] && status_rec "seq_before.c$c.r$r"
                run_pgbench "$w" "$w" "$c" "$r"
                [ "$w" = tso_seq ] && status_rec "seq_after.c$c.r$r"
            done
        done
    done
else
    echo "==> tso_seq: not available, skipping its rows" >&2
fi
fi

# --- 4b. tso_seq against the durable-commit ceiling ----------------------------------------
if want ceiling; then
# Any design that makes each block durable before it returns pays at least one flushed commit
# per call: independent clients each committing a one-row INSERT (PostgreSQL's own group
# commit, no shared row) are that ceiling. One client's per-transaction log gives the latency.
if [ "$SEQ_OK" = 1 ] && [ -n "$CEIL_CLIENTS" ]; then
    echo "==> tso_seq('k', 100) vs one-row INSERT commits (clients: $CEIL_CLIENTS)" >&2
    sql "CREATE TABLE IF NOT EXISTS commit_ceiling (v int NOT NULL) WITH (autovacuum_enabled = off)" \
        || die "set-up of the commit-ceiling table failed"
    # Eight keys k1..k8 exist before the runs (a key's first block is the worker's).
    sql "SELECT count(tso_seq('k' || g, 1)) FROM generate_series(1, 8) g" >/dev/null \
        || die "set-up of the keys k1..k8 failed"
    for c in $CEIL_CLIENTS; do
        # Several keys at once (8 keys, each call one at random) from 8 clients up.
        keys=""
        [ "$c" -ge 8 ] && keys=tso_seq_keys
        # One client: many short pairs, so that the median of their ratios does not move
        # with the disk's drift (each pair runs back to back, the order alternating).
        reps=$CEIL_REPS
        [ "$c" = 1 ] && reps=$CEIL_ONE_REPS
        for r in $(seq 1 "$reps"); do
            for w in $(rotated "$r" tso_seq ins_commit $keys); do
                if [ "$c" = 1 ]; then
                    RUN_SECS=$CEIL_ONE_SECS run_pgbench "ceil_$w" "$w" "$c" "$r" -l --log-prefix="$RUNS/txlog.ceil_$w.c$c.r$r"
                    rec lat "ceil_$w" "$c" "$r" "$RUNS/txlog.ceil_$w.c$c.r$r"
                else
                    run_pgbench "ceil_$w" "$w" "$c" "$r"
                fi
            done
        done
        sql "TRUNCATE commit_ceiling" >/dev/null
    done
fi
fi

# --- 4b'. with a logical slot present --------------------------------------------------------
if want slot; then
# A logical slot of the database (pgoutput here, for a publication of another table, as a
# Debezium outbox makes; BENCH_SLOT_PLUGIN=test_decoding for another plugin) makes every
# advance of tsoracle.seq and tsoracle.high_water a row version it can decode (at wal_level =
# logical nothing is written in place, slot or not: docs/operations/in-place.md): tso_seq goes
# through the worker's group commit. The cluster restarts with wal_level = logical, the slot exists
# (nothing consumes it), and the same pairs run as without it: tso_seq against one-row INSERT
# commits, tso_next() against SELECT 1. Then the slot is dropped and wal_level put back.
if [ "$SEQ_OK" = 1 ] && [ -n "$SLOT_CLIENTS" ]; then
    echo "==> with a $SLOT_PLUGIN slot (clients: $SLOT_CLIENTS)" >&2
    restart_with() {
        sql "$1" >/dev/null && as_pg "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 restart >/dev/null \
            || { tail -n 30 "$LOG" >&2; die "the restart for the slot runs failed"; }
        for _ in $(seq 1 300); do
            [ "$(sql "SELECT state FROM tso_status()" 2>/dev/null)" = serving ] && return 0
            sleep 0.2
        done
        die "not serving after the restart for the slot runs"
    }
    restart_with "ALTER SYSTEM SET wal_level = logical"
    sql "CREATE TABLE IF NOT EXISTS commit_ceiling (v int NOT NULL) WITH (autovacuum_enabled = off)" \
        || die "set-up of the commit-ceiling table failed"
    sql "SELECT count(tso_seq('k' || g, 1)) FROM generate_series(1, 8) g" >/dev/null \
        || die "set-up of the keys k1..k8 failed"
    sql "CREATE TABLE IF NOT EXISTS bench_outbox (id bigint PRIMARY KEY, body text)" >/dev/null \
        && sql "CREATE PUBLICATION bench_pub FOR TABLE bench_outbox" >/dev/null \
        || die "the publication for the slot could not be made"
    sql "SELECT pg_create_logical_replication_slot('bench_slot', '$SLOT_PLUGIN')" >/dev/null \
        || die "the $SLOT_PLUGIN slot could not be made"
    rec info slot_plugin "$SLOT_PLUGIN"
    for c in $SLOT_CLIENTS; do
        for r in $(seq 1 "$REPS"); do
            for w in $(rotated "$r" tso_seq ins_commit tso_next select1); do
                run_pgbench "slot_$w" "$w" "$c" "$r"
            done
        done
        sql "TRUNCATE commit_ceiling" >/dev/null
    done
    rec info slot_group_commits "$(sql "SELECT group_commits FROM tso_status()")"
    sql "SELECT pg_drop_replication_slot('bench_slot')" >/dev/null
    sql "DROP PUBLICATION bench_pub" >/dev/null
    restart_with "ALTER SYSTEM RESET wal_level"
fi
fi

# --- 4c. a member of a fleet ----------------------------------------------------------------
if want member; then
# A second cluster on this machine, a member of the first (tsoracle.oracle through its socket):
# tso_next() on the member against SELECT 1 on the member and tso_next() on the oracle; the
# values the member fetched per round trip (tso_member_status()); one client's latency against
# member SELECT 1 plus a round trip to the oracle (SELECT 1 there).
# start_member NAME BIN: initdb $WORK/NAME from the installation BIN as a member of this
# cluster, start it and wait until it serves; sets MPORT and MSQL (psql on it).
start_member() {
    local data="$WORK/$1" state=""
    MPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$ROOT/scripts/init-cluster.sh" "$2" "$data" "$MPORT" "$WORK" "max_connections=$MAX_CONN" "jit=off" \
        "tsoracle.oracle=host=$WORK port=$PORT user=postgres dbname=postgres" || die "initdb of $1 failed"
    as_pg "$2/pg_ctl" -D "$data" -l "$WORK/$1.log" -w -t 60 start >/dev/null \
        || { tail -n 30 "$WORK/$1.log" >&2; die "$1 did not start"; }
    MSQL=("$SYSBIN/psql" -X -q -At -h "$WORK" -p "$MPORT" -U postgres -d postgres -v ON_ERROR_STOP=1)
    "${MSQL[@]}" -c "CREATE EXTENSION tsoracle" || die "CREATE EXTENSION on $1 failed"
    for _ in $(seq 1 300); do
        state=$("${MSQL[@]}" -c "SELECT state FROM tso_status()" 2>/dev/null)
        [ "$state" = serving ] && break
        sleep 0.2
    done
    [ "$state" = serving ] || { tail -n 30 "$WORK/$1.log" >&2; die "$1 is not serving ($state)"; }
}
if [ -n "$MEMBER_CLIENTS" ]; then
    echo "==> a member of this cluster (clients: $MEMBER_CLIENTS)" >&2
    start_member member "$BIN"
    member_counts() { "${MSQL[@]}" -c "SELECT round_trips || ' ' || values_fetched FROM tso_member_status()"; }
    for c in $MEMBER_CLIENTS; do
        for r in $(seq 1 "$REPS"); do
            for w in $(rotated "$r" mem_tso_next mem_select1 orc_tso_next); do
                port=$PORT script=tso_next
                case "$w" in mem_*) port=$MPORT ;; esac
                [ "$w" = mem_select1 ] && script=select1
                before=$(member_counts)
                if [ "$c" = 1 ]; then
                    TARGET_PORT=$port run_pgbench "$w" "$script" "$c" "$r" -l --log-prefix="$RUNS/txlog.$w.c$c.r$r"
                    rec lat "$w" "$c" "$r" "$RUNS/txlog.$w.c$c.r$r"
                else
                    TARGET_PORT=$port run_pgbench "$w" "$script" "$c" "$r"
                fi
                [ "$w" = mem_tso_next ] && rec member "$c" "$r" "$before" "$(member_counts)"
            done
            if [ "$c" = 1 ]; then
                run_pgbench orc_select1 select1 1 "$r" -l --log-prefix="$RUNS/txlog.orc_select1.c1.r$r"
                rec lat orc_select1 1 "$r" "$RUNS/txlog.orc_select1.c1.r$r"
            fi
        done
    done
    # The member's write paths, ts DEFAULT tso_next() against DEFAULT clock_timestamp() on the
    # member: one-row INSERTs (WRITE_CLIENTS), a COPY and an INSERT ... SELECT of COPY_ROWS rows
    # (a statement's reservation: docs/fleet.md). TRUNCATE + CHECKPOINT before each run.
    "${MSQL[@]}" -c "CREATE TABLE t_tso (ts bigint NOT NULL DEFAULT tso_next(), v int NOT NULL) WITH (autovacuum_enabled = off);
        CREATE TABLE t_clock (ts timestamptz NOT NULL DEFAULT clock_timestamp(), v int NOT NULL) WITH (autovacuum_enabled = off);
        CREATE INDEX ON t_tso (ts); CREATE INDEX ON t_clock (ts)" || die "the member's write tables"
    mem_prep() { "${MSQL[@]}" -c "TRUNCATE t_$1" && "${MSQL[@]}" -c "CHECKPOINT"; }
    inserts="tso clock"
    if [ -n "$FLOOR_SO" ]; then
        # The floor's member: the same settings, the same oracle, the same table; stopped
        # once its rows are measured.
        echo "==> the hand-off floor's member ($FLOOR_SO)" >&2
        mport=$MPORT msql=("${MSQL[@]}")
        start_member member-floor "$FBIN"
        FDATA="$WORK/member-floor" FPORT=$MPORT FSQL=("${MSQL[@]}")
        MPORT=$mport MSQL=("${msql[@]}")
        "${FSQL[@]}" -c "CREATE TABLE t_tso (ts bigint NOT NULL DEFAULT tso_next(), v int NOT NULL) WITH (autovacuum_enabled = off);
            CREATE INDEX ON t_tso (ts)" || die "the floor's member's table"
        inserts="tso clock floor"
    fi
    echo "==> member INSERT INTO t(v) VALUES (\$1), ts DEFAULT tso_next() vs clock_timestamp()${FLOOR_SO:+ vs the hand-off floor} (clients: $WRITE_CLIENTS)" >&2
    for c in $WRITE_CLIENTS; do
        for r in $(seq 1 "$REPS"); do
            for x in $(rotated "$r" $inserts); do
                if [ "$x" = floor ]; then
                    { "${FSQL[@]}" -c "TRUNCATE t_tso" && "${FSQL[@]}" -c "CHECKPOINT"; } || die "preparing the floor's t_tso failed"
                    TARGET_PORT=$FPORT run_pgbench mem_ins_floor ins_tso "$c" "$r"
                    continue
                fi
                mem_prep "$x" || die "preparing the member's t_$x failed"
                TARGET_PORT=$MPORT run_pgbench "mem_ins_$x" "ins_$x" "$c" "$r"
            done
        done
    done
    if [ -n "$FLOOR_SO" ]; then
        grep -E 'PANIC|terminated by signal' "$WORK/member-floor.log" | head -n 3 | while read -r line; do rec fail mem_ins_floor 1 1 "$line"; done
        # A floor whose proxy connected again meanwhile measured reconnections, not the hand-off.
        connects=$("${FSQL[@]}" -c "SELECT connects FROM tso_member_status()")
        [ "$connects" = 1 ] || rec fail mem_ins_floor 1 1 "the floor's member connected to the oracle $connects times, not once"
        as_pg "$FBIN/pg_ctl" -D "$FDATA" -m fast -w stop >/dev/null 2>&1
    fi
    echo "==> member COPY and INSERT ... SELECT of $COPY_ROWS rows, ts DEFAULT tso_next() vs clock_timestamp(), $COPY_REPS repetitions" >&2
    seq 1 "$COPY_ROWS" >"$WORK/copy.data"
    for r in $(seq 1 "$COPY_REPS"); do
        for wx in $(rotated "$r" copy_tso copy_clock insel_tso insel_clock); do
            x=${wx#*_}
            mem_prep "$x" || die "preparing the member's t_$x failed"
            t0=$(date +%s%N)
            case $wx in
                copy_*) "${MSQL[@]}" -c "COPY t_$x (v) FROM STDIN" <"$WORK/copy.data" >"$RUNS/mem_$wx.r$r.out" 2>&1 ;;
                *) "${MSQL[@]}" -c "INSERT INTO t_$x (v) SELECT g FROM generate_series(1, $COPY_ROWS) g" >"$RUNS/mem_$wx.r$r.out" 2>&1 ;;
            esac
            rc=$?
            t1=$(date +%s%N)
            n=$("${MSQL[@]}" -c "SELECT count(*) FROM t_$x" 2>/dev/null)
            if [ "$rc" -ne 0 ] || [ "$n" != "$COPY_ROWS" ]; then
                rec fail "mem_$wx" 1 "$r" "$(head -n 1 "$RUNS/mem_$wx.r$r.out" | tr '\t' ' ') (rows: $n)"
            else
                ms=$(( (t1 - t0) / 1000 ))
                rec copy "mem_$wx" "$COPY_ROWS" "$r" "$(printf '%d.%03d' $(( ms / 1000 )) $(( ms % 1000 )))"
                printf '    %-16s rep %s: %10s ms\n' "mem_$wx" "$r" "$(( ms / 1000 ))" >&2
            fi
            rec busy "mem_$wx" 1 "$r" "$(busy_pct 1)"
        done
    done
    "${MSQL[@]}" -c "TRUNCATE t_tso, t_clock" || die "clean-up of the member's write tables failed"
fi
fi

# --- 5. the write paths users run: INSERT with a default, COPY, UPDATE of a version stamp ------
if want writes; then
# Before every run: TRUNCATE (INSERT) or VACUUM (UPDATE) of the table about to be written, then
# CHECKPOINT, so that each run starts from the same state and pays for no other run's dirt.
write_prep() {
    case $1 in
        ins_*) sql "TRUNCATE t_${1#ins_}" ;;
        upd_*) sql "VACUUM a_${1#upd_}" ;;
    esac && sql "CHECKPOINT"
}
# write_rows CLIENTS WORKLOAD... [-- extra pgbench args]: REPS repetitions of the workloads,
# interleaved, the order rotated each repetition, each run prepared by write_prep.
write_rows() {
    local c=$1
    shift
    local list=() extra=() r w
    while [ $# -gt 0 ] && [ "$1" != -- ]; do list+=("$1"); shift; done
    [ $# -gt 0 ] && { shift; extra=("$@"); }
    for r in $(seq 1 "$REPS"); do
        for w in $(rotated "$r" "${list[@]}"); do
            check_server
            write_prep "$w" || die "preparing $w failed"
            run_pgbench "$w" "$w" "$c" "$r" "${extra[@]}"
        done
    done
}
rec info update_rows "$UPDATE_ROWS"
echo "==> INSERT INTO t(v) VALUES (\$1), ts DEFAULT tso_next() vs clock_timestamp() vs nextval('s_ts') (clients: $WRITE_CLIENTS)" >&2
for c in $WRITE_CLIENTS; do
    write_rows "$c" ins_tso ins_clock ins_seq
done
echo "==> INSERT INTO t(v) VALUES (\$1), id uuid PRIMARY KEY DEFAULT tso_next_uuid() vs gen_random_uuid()${UUIDV7:+ vs uuidv7()} (clients: $WRITE_CLIENTS)" >&2
for c in $WRITE_CLIENTS; do
    write_rows "$c" ins_uuid ins_rand "${UUIDV7[@]}"
done
echo "==> UPDATE ... SET version = tso_next() vs clock_timestamp() vs version + 1, random id of $UPDATE_ROWS (clients: $WRITE_CLIENTS)" >&2
for c in $WRITE_CLIENTS; do
    write_rows "$c" upd_tso upd_clock upd_inc -- -D rows="$UPDATE_ROWS"
done

echo "==> COPY t(v) FROM STDIN, $COPY_ROWS rows, ts DEFAULT tso_next() vs clock_timestamp() vs nextval('s_ts'), $COPY_REPS repetitions" >&2
seq 1 "$COPY_ROWS" >"$WORK/copy.data"
rec info copy_rows "$COPY_ROWS"
rec info copy_reps "$COPY_REPS"
for r in $(seq 1 "$COPY_REPS"); do
    for x in $(rotated "$r" tso clock seq); do
        check_server
        write_prep "ins_$x" || die "preparing the COPY into t_$x failed"
        t0=$(date +%s%N)
        "${PSQL[@]}" -c "COPY t_$x (v) FROM STDIN" <"$WORK/copy.data" >"$RUNS/copy_$x.r$r.out" 2>&1
        rc=$?
        t1=$(date +%s%N)
        n=$(sql "SELECT count(*) FROM t_$x" 2>/dev/null)
        if [ "$rc" -ne 0 ] || [ "$n" != "$COPY_ROWS" ]; then
            rec fail "copy_$x" 1 "$r" "$(head -n 1 "$RUNS/copy_$x.r$r.out" | tr '\t' ' ') (rows: $n)"
            printf '    %-16s rep %s: FAILED (%s)\n' "copy_$x" "$r" "$(head -n 1 "$RUNS/copy_$x.r$r.out")" >&2
        else
            ms=$(( (t1 - t0) / 1000 ))
            ms=$(printf '%d.%03d' $(( ms / 1000 )) $(( ms % 1000 )))
            rec copy "copy_$x" "$COPY_ROWS" "$r" "$ms"
            printf '    %-16s rep %s: %10s ms\n' "copy_$x" "$r" "$ms" >&2
        fi
        rec busy "copy_$x" 1 "$r" "$(busy_pct 1)"
    done
done
sql "TRUNCATE t_tso, t_clock, t_seq" && sql "CHECKPOINT" || die "clean-up of the write tables failed"
fi

# --- 6. p99 latency across window extensions -------------------------------------------------
if want p99; then
# Latency scripts end with a \set: pgbench caches its clock within one pass of a client's
# state machine, so without a meta-command after the query a reply that is already there
# when pgbench looks gets latency 0 (common on 2 oversubscribed cores); the \set makes it
# read the clock after the reply. Two shapes: closed loop (P99_CLIENTS clients as fast as
# they can: the machine is saturated, tails are mostly run-queue waits) and open loop
# (P99_RATE_CLIENTS clients at -R P99_RATE in total: tails show stalls of the call itself;
# latency = pgbench's latency minus its schedule lag).
echo "==> p99 latency, tsoracle.window_ahead_ms = $P99_WINDOW_MS: closed loop ($P99_CLIENTS clients), open loop ($P99_RATE_CLIENTS clients, -R $P99_RATE)" >&2
sql "ALTER SYSTEM SET tsoracle.window_ahead_ms = $P99_WINDOW_MS" && sql "SELECT pg_reload_conf()" >/dev/null
# The worker extends only when less than half of the window is left: wait until the window
# committed under the old setting has drained and extensions come at the new pace.
for _ in $(seq 1 100); do
    left=$(sql "SELECT window_left_ms FROM tso_status()" 2>/dev/null)
    [ -n "$left" ] && [ "$left" -le $(( 2 * P99_WINDOW_MS )) ] && break
    sleep 0.1
done
sleep 0.5
rec info p99_window "$(sql 'SHOW tsoracle.window_ahead_ms')"
rec info p99_rate "$P99_RATE"
status_rec p99_start
for r in $(seq 1 "$REPS"); do
    for shape in closed open; do
        for w in $(rotated "$r" select1 tso_next); do
            if [ "$shape" = closed ]; then
                name="p99_$w" c=$P99_CLIENTS extra=()
            else
                name="p99r_$w" c=$P99_RATE_CLIENTS extra=(-R "$P99_RATE")
            fi
            status_rec "before.$name.r$r"
            run_pgbench "$name" "lat_$w" "$c" "$r" "${extra[@]}" -l --log-prefix="$RUNS/$name.r$r" \
                --sampling-rate="$([ "$shape" = closed ] && echo 0.25 || echo 1)"
            status_rec "after.$name.r$r"
            rec lat "$name" "$c" "$r" "$RUNS/$name.r$r"
        done
    done
done
status_rec p99_end
sql "ALTER SYSTEM RESET tsoracle.window_ahead_ms" && sql "SELECT pg_reload_conf()" >/dev/null
fi

# --- 7. the scaling curve: tso_next() and SELECT 1 from 1 to 256 clients ---------------------
if want curve; then
# Closed loop, the latency scripts (see section 6), per-transaction logs sampled at
# CURVE_SAMPLING; throughput from pgbench, p50/p99 from the logs (scripts/bench/report.py).
if [ -n "$CURVE_CLIENTS" ]; then
    echo "==> scaling curve: SELECT tso_next() and SELECT 1, clients: $CURVE_CLIENTS (${CURVE_SECS} s runs, $CURVE_REPS repetitions)" >&2
    rec info curve "pgbench -n -M prepared -T <$CURVE_SECS + 1 per 64 clients, for connecting> -c <clients> -j <min(clients, $(nproc))> -f lat_<workload>.sql -l --sampling-rate=$CURVE_SAMPLING; $CURVE_REPS repetitions, order rotated"
    rec info curve_seconds "$CURVE_SECS"
    rec info curve_reps "$CURVE_REPS"
    RUN_SECS=3 run_pgbench warmup lat_select1 "$(echo $CURVE_CLIENTS | awk '{print $NF}')" 0 2>/dev/null
    for c in $CURVE_CLIENTS; do
        for r in $(seq 1 "$CURVE_REPS"); do
            for w in $(rotated "$r" select1 tso_next); do
                # pgbench's -T clock includes connecting (a few seconds for 256 clients on a
                # loaded machine): one more second per 64 clients; the report flags runs that
                # still measured less than the intended time (transactions / tps).
                RUN_SECS=$(( CURVE_SECS + (c + 63) / 64 )) run_pgbench "curve_$w" "lat_$w" "$c" "$r" \
                    -l --log-prefix="$RUNS/txlog.curve_$w.c$c.r$r" --sampling-rate="$CURVE_SAMPLING"
                rec lat "curve_$w" "$c" "$r" "$RUNS/txlog.curve_$w.c$c.r$r"
            done
        done
    done
fi
fi

if want oracle && [ -n "$ORACLE_MEMBERS" ]; then
# An oracle serving simulated members (issue 55), on a cluster of its own sized for the largest
# point: each pgbench client is a member, through the real protocol (a hello, then
# tsoracle.member_next(k) round trips; its first member_next is tried again while the oracle
# answers 57P03, its registration not durable yet, as a member's worker does:
# bench_first_next). Per point (report.py): round trips/s and values/s once every member
# has said hello (per-transaction logs), p50/p99 of a round trip (the hellos excluded), the
# cores the oracle's processes used (/proc/PID/schedstat) over half of BENCH_ORACLE_SECONDS once
# every member said hello, and the Pss of the member backends (/proc/PID/smaps_rollup) then.
    most=1
    for m in $ORACLE_MEMBERS; do [ "$m" -le "$most" ] || most=$m; done
    ODATA="$WORK/oracle"
    OPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    echo "==> an oracle of its own (port $OPORT; members: $ORACLE_MEMBERS; k: $ORACLE_K)" >&2
    "$ROOT/scripts/init-cluster.sh" "$BIN" "$ODATA" "$OPORT" "$WORK" "max_connections=$(( most + 10 ))" "jit=off" \
        "tsoracle.max_members=$most" || die "initdb of the oracle failed"
    as_pg "$BIN/pg_ctl" -D "$ODATA" -l "$WORK/oracle.log" -w -t 60 start >/dev/null \
        || { tail -n 30 "$WORK/oracle.log" >&2; die "the oracle did not start"; }
    OSQL=("$SYSBIN/psql" -X -q -At -h "$WORK" -p "$OPORT" -U postgres -d postgres -v ON_ERROR_STOP=1)
    "${OSQL[@]}" -c "CREATE EXTENSION tsoracle" || die "CREATE EXTENSION on the oracle failed"
    "${OSQL[@]}" -c "CREATE ROLE bench_member LOGIN; GRANT tsoracle_member TO bench_member;
        CREATE FUNCTION bench_first_next() RETURNS void LANGUAGE plpgsql AS \$\$
        BEGIN
            FOR i IN 1..600 LOOP
                BEGIN
                    PERFORM tsoracle.member_next(1);
                    RETURN;
                EXCEPTION WHEN SQLSTATE '57P03' THEN
                    PERFORM pg_sleep(0.05);
                END;
            END LOOP;
            RAISE EXCEPTION 'not served within 30 s';
        END \$\$" || die "set-up of the oracle failed"
    ostate=""
    for _ in $(seq 1 300); do
        ostate=$("${OSQL[@]}" -c "SELECT state FROM tso_status()" 2>/dev/null)
        [ "$ostate" = serving ] && break
        sleep 0.2
    done
    [ "$ostate" = serving ] || { tail -n 30 "$WORK/oracle.log" >&2; die "the oracle is not serving ($ostate)"; }
    # Each simulated member (pgbench client c says hello as cluster 1000000 + c) admitted for
    # the bench's role, as a DBA admits a member (docs/operations/fleet/join.md).
    "${OSQL[@]}" -c "SELECT count(*) FROM pg_catalog.generate_series(1000000, 1000000 + $most) AS id
        WHERE tso_fleet_admit(id, 'bench_member')" >/dev/null || die "admitting the simulated members failed"
    OVER=$("${OSQL[@]}" -c "SELECT extversion FROM pg_extension WHERE extname = 'tsoracle'")
    OPM=$(head -n 1 "$ODATA/postmaster.pid")
    rec info oracle_load "load average before the section: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
    rec info oracle_bench "one pgbench client per member: -n -M prepared -T <$ORACLE_SECS s + 3 s + 1 s per 50 members> -c <members> -j $(nproc) -f oracle_member.sql -D k=<k>, pgbench on the same cores; an oracle of its own, max_connections=$(( most + 10 )), tsoracle.max_members=$most, shared_buffers=$("${OSQL[@]}" -c 'SHOW shared_buffers')"
    # The oracle's processes: CPU time of all (µs), Pss of the members' (scripts/bench/oracle_procs.py).
    oracle_procs() { python3 "$HERE/oracle_procs.py" "$OPM" "$1"; }
    # sleep_until T S: sleep until S seconds after the instant T (date +%s.%N).
    sleep_until() { sleep "$(awk -v t="$1" -v s="$2" -v now="$(date +%s.%N)" 'BEGIN { d = t + s - now; print (d > 0 ? d : 0) }')"; }
    # gone: wait until the previous point's sessions have ended (a hello for a member whose
    # session lives is refused).
    gone() {
        for _ in $(seq 1 100); do
            [ "$(oracle_procs pss)" = "0 0" ] && break
            sleep 0.1
        done
    }
    for m in $ORACLE_MEMBERS; do
        jobs=$m
        [ "$jobs" -le "$(nproc)" ] || jobs=$(nproc)
        # Connections and hellos take about 1 s per 200 members on 2 idle cores, several
        # times that on busy ones: measured once every member has said hello on a live
        # session (or after `ramp` seconds), for half of BENCH_ORACLE_SECONDS.
        ramp=$(( m / 50 + 3 ))
        secs=$(( ORACLE_SECS + ramp ))
        # The baseline: as many sessions of the same role making prepared SELECT 1 round
        # trips, no hello: what any round trip to this server costs with m backends sharing
        # the cores (report.py: the rate after every client's first, as for the members).
        gone
        tag="oracle.m$m.select1"
        if "$SYSBIN/pgbench" -h "$WORK" -p "$OPORT" -U bench_member -n -M prepared -T "$secs" -c "$m" -j "$jobs" \
            -f "$HERE/select1.sql" -l --log-prefix="$RUNS/txlog.$tag" postgres >"$RUNS/$tag.out" 2>&1 \
            && grep -q '^tps = ' "$RUNS/$tag.out"; then
            rec oracle_base "$m" "$RUNS/txlog.$tag"
        else
            rec fail "$tag" "$m" 1 "$(grep -m 1 -iE 'error|abort|fatal' "$RUNS/$tag.out" | tr '\t' ' ')"
        fi
        for k in $ORACLE_K; do
            gone
            tag="oracle.m$m.k$k"
            "$SYSBIN/pgbench" -h "$WORK" -p "$OPORT" -U bench_member -n -M prepared -T "$secs" -c "$m" -j "$jobs" \
                -D hello=0 -D k="$k" -D ver="$OVER" -f "$HERE/oracle_member.sql" \
                -l --log-prefix="$RUNS/txlog.$tag" postgres >"$RUNS/$tag.out" 2>&1 &
            bench_pid=$!
            for _ in $(seq 1 $(( ramp * 5 ))); do
                sleep 0.2
                [ "$("${OSQL[@]}" -c "SELECT count(*) FROM tso_fleet_status() f JOIN pg_stat_activity a ON a.pid = f.session_pid" 2>/dev/null)" = "$m" ] && break
            done
            sleep 0.5
            s0=$(date +%s.%N); t0=$(oracle_procs cpu)
            sleep_until "$s0" "$(( (ORACLE_SECS + 1) / 2 ))"
            s1=$(date +%s.%N); t1=$(oracle_procs cpu)
            # Ticks of processes that ended are lost: no figure if the run ended before.
            kill -0 "$bench_pid" 2>/dev/null || t1=""
            read -r pss backends <<<"$(oracle_procs pss)"
            wait "$bench_pid"
            rc=$?
            if [ "$rc" -ne 0 ] || ! grep -q '^tps = ' "$RUNS/$tag.out"; then
                rec fail "$tag" "$m" 1 "$(grep -m 1 -iE 'error|abort|fatal' "$RUNS/$tag.out" | tr '\t' ' ')"
                printf '    %-16s: FAILED (%s)\n' "$tag" "$(grep -m 1 -iE 'error|abort|fatal' "$RUNS/$tag.out")" >&2
                continue
            fi
            cores=-1
            [ -n "$t1" ] && cores=$(awk -v a="$t0" -v b="$t1" -v s0="$s0" -v s1="$s1" 'BEGIN { printf "%.3f", (b - a) / 1e6 / (s1 - s0) }')
            rec oracle "$m" "$k" "$RUNS/txlog.$tag" "$pss" "$backends" "$cores"
            printf '    %-16s: %s member backends, %s kB Pss, %s cores\n' "$tag" "$backends" "$pss" "$cores" >&2
        done
    done
    as_pg "$BIN/pg_ctl" -D "$ODATA" -m fast -w stop >/dev/null 2>&1
fi

check_server
status_rec end

# A backend or the worker that died would show up here.
rec info server_log_problems "$(grep -cE 'PANIC|terminated by signal|was terminated|all server processes terminated' "$LOG")"
grep -E 'PANIC|terminated by signal|was terminated' "$LOG" | head -n 5 | while read -r line; do rec info server_log "$line"; done

echo >&2
report_args=()
[ -n "$PLOT" ] && [ -n "$CURVE_CLIENTS" ] && report_args=(--plot "$PLOT")
python3 "$HERE/report.py" "$RES" "${report_args[@]}" >"$WORK/report.txt" || die "the report failed (results: $RES; BENCH_KEEP=1 keeps them)"
cat "$WORK/report.txt"
if [ -n "${BENCH_REPORT:-}" ]; then
    cp "$WORK/report.txt" "$BENCH_REPORT" && echo "bench: report written to $BENCH_REPORT" >&2
fi

# Slowness never fails the benchmark; a crash or a failed run does.
problems=$(grep -c '^fail' "$RES")
crashes=$(grep -cE 'PANIC|terminated by signal|was terminated|all server processes terminated' "$LOG")
if [ "$problems" -gt 0 ] || [ "$crashes" -gt 0 ]; then
    die "$problems failed run(s), $crashes crash line(s) in the server log (see above)"
fi
