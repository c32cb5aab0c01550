#!/usr/bin/env python3
"""`make bench`: benchmark the installed tsoracle extension against baselines measured in the
same run, on a throw-away cluster with the extension preloaded.

Every candidate workload is interleaved with its baselines (the order rotates each
repetition) and each figure is the median of BENCH_REPS runs; ratios are the median of the
per-repetition ratios (candidate run i / baseline run i), so slow phases of a noisy machine
hit both sides of a ratio alike. Speed never fails the harness: a missed target is printed
as NOT MET and the exit status is 0 unless something actually broke (a failed run, a crash
in the server log, a cluster that would not start). It writes results.tsv, one record a
line, and report.py (beside it) turns that into the report.

Knobs (environment):
  BENCH_SECONDS      pgbench -T per run (default 8)
  BENCH_REPS         repetitions (default 3)
  BENCH_THROUGHPUT_REPS  repetitions of section 1, tso_next() against SELECT 1 and
                     pg_backend_pid() (default 7, or BENCH_REPS if more)
  BENCH_CLIENTS      default "8 32"
  BENCH_PERCALL_N    rows of the per-call rows (default 2000000); BENCH_PERCALL_REPS (7)
  BENCH_P99_WINDOW_MS  tsoracle.window_ahead_ms during the p99 runs (default 50)
  BENCH_P99_RATE     total -R of the open-loop latency runs (default 4000/s)
  BENCH_WRITE_CLIENTS  INSERT and UPDATE rows (default: BENCH_CLIENTS)
  BENCH_UPDATE_ROWS  rows of the UPDATE tables (default 100000)
  BENCH_COPY_ROWS    rows per COPY (default 1000000); BENCH_COPY_REPS (default 5)
  BENCH_CEIL_CLIENTS tso_seq against one-row INSERT commits, one key and from 8 clients up
                     eight keys (default "1 2 4 8 32 128"; empty skips it); BENCH_CEIL_REPS
                     (default 9); BENCH_CEIL_ONE_REPS and BENCH_CEIL_ONE_SECONDS (its one-client
                     row: 15 pairs of 3 s runs, as one client's rate follows the virtual disk's
                     flush, which drifts by 15 % from run to run)
  BENCH_MEMBER_CLIENTS  a member of a fleet: its tso_next() against its SELECT 1 and the
                     oracle's tso_next() (default "1 8 32 128"); then its one-row INSERTs at
                     BENCH_WRITE_CLIENTS, a COPY and an INSERT ... SELECT of BENCH_COPY_ROWS
                     rows; empty skips it all
  BENCH_DISTANCE_RTTS  a member a network away (section distance): the round trips (ms) the
                     link between it and its oracle is set to (default "0 2 10"; 0 is always
                     run: tps_0); BENCH_DISTANCE_CLIENTS (default "1 8 32"; empty skips it)
  BENCH_LINK         the forwarder of that section (default target/release/tso-link;
                     `cargo build --release -p tsoracle-tests --bin tso-link`)
  BENCH_SLOT_CLIENTS tso_seq and tso_next() with a logical slot present, against the same
                     baselines (default "1 8 32"; empty skips it); BENCH_SLOT_PLUGIN (its
                     plugin, default pgoutput, the slot of a publication of another table, as an
                     outbox's CDC makes; test_decoding too)
  BENCH_ORACLE_MEMBERS  an oracle serving simulated members, on a cluster of its own: one
                     pgbench client per member, each a tsoracle.member_hello then
                     tsoracle.member_next(k, session) round trips (oracle_member.sql; default
                     "8 64 256 1000"; empty skips it); BENCH_ORACLE_K (default "1 16");
                     BENCH_ORACLE_SECONDS (pgbench -T per point, default 5)
  BENCH_ONLY         run only these sections, e.g. "throughput writes": throughput, resolved,
                     percall, batch, seq, ceiling, slot, member, distance, writes, p99, curve,
                     oracle (default: all)
  BENCH_CURVE_CLIENTS  the scaling curve (default "1 2 4 8 16 32 64 128 256"; empty skips it);
                     BENCH_CURVE_SECONDS (default 5); BENCH_CURVE_REPS (default 2);
                     BENCH_CURVE_SAMPLING (--sampling-rate of its per-transaction logs, 0.2)
  BENCH_PLOT         where the curve's PNG goes (default BENCHMARKS-scaling.png next to
                     BENCHMARKS.md; empty: no plot, and matplotlib is not needed)
  BENCH_REPORT       also write the report to this file
  BENCH_KEEP=1       keep the work directory (logs, per-transaction logs, results.tsv)
  BENCH_PG_BIN       the PostgreSQL installation to run: the directory of its postgres, pg_ctl,
                     initdb, pg_config, psql and pgbench (default /usr/lib/postgresql/15/bin)
  BENCH_SO / BENCH_EXT_DIR  another tsoracle.so / extension SQL directory than the installed
                     ones (`pg_config --pkglibdir`/tsoracle.so, `pg_config --sharedir`/extension)
  BENCH_FLOOR_SO     a tsoracle.so built with the feature handoff-floor (`make bench` builds
                     one, release profile, in target/floor): the member section then starts a
                     second member on it, beside the first and of the same oracle, and
                     interleaves its one-row INSERTs with the first member's (empty: no floor)

The server runs from a private snapshot of the PostgreSQL installation (postgres, pg_ctl,
initdb, the libraries, the share directory) taken at the start, with tsoracle.so and its SQL
copied in: PostgreSQL finds pkglibdir and sharedir relative to its executable, so the
benchmark measures one consistent build even if tsoracle is reinstalled meanwhile (an in-place
reinstall under a running server can crash it). The snapshot mirrors the absolute paths that
pg_config reports under a private root, which keeps their relative layout whatever it is.
"""
import datetime
import filecmp
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.join(ROOT, "scripts", "bench")
NPROC = len(os.sched_getaffinity(0))


class Die(Exception):
    """The benchmark cannot go on: the message says why."""


def env(name, default):
    """An environment knob: its value if set (even empty), else the default."""
    return os.environ.get(name, default)


def env_nonempty(name, default):
    """An environment knob that falls back to the default when empty too."""
    return os.environ.get(name) or default


def ints(s):
    return [int(x) for x in s.split()]


def as_pg(*cmd, **kw):
    """Run a command as the postgres OS user."""
    return subprocess.run(["runuser", "-u", "postgres", "--", *cmd], **kw)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rotated(rep, items):
    """The items rotated left by rep: the order of repetition rep, so that no workload always
    runs first or right after the same other one."""
    n = len(items)
    return [items[(i + rep) % n] for i in range(n)]


def tail(path, n=30):
    try:
        with open(path, errors="replace") as f:
            sys.stderr.write("".join(f.readlines()[-n:]))
    except OSError:
        pass


def say(msg):
    print(msg, file=sys.stderr, flush=True)


# --- the knobs -------------------------------------------------------------------------------
SYSBIN = env_nonempty("BENCH_PG_BIN", "/usr/lib/postgresql/15/bin")
PG_CONFIG = os.path.join(SYSBIN, "pg_config")
SECS = int(env_nonempty("BENCH_SECONDS", "8"))
REPS = int(env_nonempty("BENCH_REPS", "3"))
# Section 1's ratios sit within a few percent of their targets on 2 shared cores, where a
# single run strays by 10 %: at least 7 repetitions, whatever BENCH_REPS says.
THROUGHPUT_REPS = int(env_nonempty("BENCH_THROUGHPUT_REPS", str(max(REPS, 7))))
CLIENTS = ints(env_nonempty("BENCH_CLIENTS", "8 32"))
PERCALL_N = int(env_nonempty("BENCH_PERCALL_N", "2000000"))
PERCALL_REPS = int(env_nonempty("BENCH_PERCALL_REPS", "7"))
P99_WINDOW_MS = int(env_nonempty("BENCH_P99_WINDOW_MS", "50"))
P99_CLIENTS = 8
P99_RATE_CLIENTS = 4
P99_RATE = int(env_nonempty("BENCH_P99_RATE", "4000"))
BATCH_CLIENTS = 8
WRITE_CLIENTS = ints(env_nonempty("BENCH_WRITE_CLIENTS", " ".join(map(str, CLIENTS))))
UPDATE_ROWS = int(env_nonempty("BENCH_UPDATE_ROWS", "100000"))
COPY_ROWS = int(env_nonempty("BENCH_COPY_ROWS", "1000000"))
COPY_REPS = int(env_nonempty("BENCH_COPY_REPS", "5"))
CURVE_CLIENTS = ints(env("BENCH_CURVE_CLIENTS", "1 2 4 8 16 32 64 128 256"))
CEIL_CLIENTS = ints(env("BENCH_CEIL_CLIENTS", "1 2 4 8 32 128"))
CEIL_REPS = int(env_nonempty("BENCH_CEIL_REPS", "9"))
CEIL_ONE_REPS = int(env_nonempty("BENCH_CEIL_ONE_REPS", "15"))
CEIL_ONE_SECS = int(env_nonempty("BENCH_CEIL_ONE_SECONDS", "3"))
MEMBER_CLIENTS = ints(env("BENCH_MEMBER_CLIENTS", "1 8 32 128"))
DISTANCE_RTTS = sorted({0.0, *map(float, env_nonempty("BENCH_DISTANCE_RTTS", "0 2 10").split())})
DISTANCE_CLIENTS = ints(env("BENCH_DISTANCE_CLIENTS", "1 8 32"))
LINK = env_nonempty("BENCH_LINK", os.path.join(ROOT, "target", "release", "tso-link"))
SLOT_CLIENTS = ints(env("BENCH_SLOT_CLIENTS", "1 8 32"))
SLOT_PLUGIN = env_nonempty("BENCH_SLOT_PLUGIN", "pgoutput")
ORACLE_MEMBERS = ints(env("BENCH_ORACLE_MEMBERS", "8 64 256 1000"))
ORACLE_K = ints(env_nonempty("BENCH_ORACLE_K", "1 16"))
ORACLE_SECS = int(env_nonempty("BENCH_ORACLE_SECONDS", "5"))
ONLY = env("BENCH_ONLY", "").split()
CURVE_SECS = int(env_nonempty("BENCH_CURVE_SECONDS", "5"))
CURVE_REPS = int(env_nonempty("BENCH_CURVE_REPS", "2"))
CURVE_SAMPLING = env_nonempty("BENCH_CURVE_SAMPLING", "0.2")
PLOT = env("BENCH_PLOT", os.path.join(ROOT, "BENCHMARKS-scaling.png"))
MATPLOTLIB_PIN = "3.10.3"
FLOOR_SO = env("BENCH_FLOOR_SO", "")
# max_connections: 300, or more if the curve asks for more clients (plus the sampler and psql).
MAX_CONN = max([300] + [c + 10 for c in CURVE_CLIENTS + CLIENTS + WRITE_CLIENTS])


def want(section):
    """Run this section (all of them unless BENCH_ONLY names some)."""
    return not ONLY or section in ONLY


def words(xs):
    """A list as the knobs spell it: "1 8 32"."""
    return " ".join(f"{x:g}" if isinstance(x, float) else str(x) for x in xs)


def fmt_ms(rtt):
    """A round trip in ms as a workload's name has it: 2.0 -> "2", 0.5 -> "0.5"."""
    return f"{rtt:g}"


class Psql:
    """psql on one cluster, through the socket in the work directory."""

    def __init__(self, bench, port):
        self.cmd = [bench.psql_exe, "-X", "-q", "-At", "-h", bench.work, "-p", str(port), "-U", "postgres",
                    "-d", "postgres", "-v", "ON_ERROR_STOP=1"]

    def run(self, *args, stdin=None, out=None):
        """psql with these arguments: (exit status, stdout + stderr)."""
        p = subprocess.run(self.cmd + list(args), stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, errors="replace")
        if out:
            with open(out, "w") as f:
                f.write(p.stdout)
        return p.returncode, p.stdout

    def q(self, sql):
        """The output of one command (stripped), or None if it failed."""
        p = subprocess.run(self.cmd + ["-c", sql], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           errors="replace")
        return p.stdout.strip() if p.returncode == 0 else None

    def must(self, sql, what):
        out = self.q(sql)
        if out is None:
            raise Die(f"{what} failed")
        return out

    def wait_serving(self, tries=300):
        state = None
        for _ in range(tries):
            state = self.q("SELECT state FROM tso_status()")
            if state == "serving":
                return True
            time.sleep(0.2)
        return False


class Bench:
    def __init__(self):
        self.procs = []      # background processes to end on exit (samplers, links, pgbench)
        self.datas = []      # (bin, data directory) of every cluster started
        self.work = None

    # --- set-up ------------------------------------------------------------------------------
    def pg_config(self, what):
        p = subprocess.run([PG_CONFIG, what], stdout=subprocess.PIPE, text=True)
        if p.returncode != 0:
            raise Die(f"{PG_CONFIG} {what} failed")
        return p.stdout.strip()

    def check_install(self):
        if os.geteuid() != 0:
            raise Die("run as root (initdb/pg_ctl run as the postgres OS user via runuser)")
        if not os.access(PG_CONFIG, os.X_OK):
            raise Die(f"{PG_CONFIG} not found (BENCH_PG_BIN={SYSBIN}: the bin directory of a PostgreSQL "
                      "installation; for 15: apt-get install postgresql-15)")
        for exe in ("postgres", "pg_ctl", "initdb", "psql", "pgbench"):
            if not os.access(os.path.join(SYSBIN, exe), os.X_OK):
                raise Die(f"{SYSBIN}/{exe} not found")
        self.sys_bindir = self.pg_config("--bindir")
        self.sys_pkglib = self.pg_config("--pkglibdir")
        self.sys_share = self.pg_config("--sharedir")
        if os.path.realpath(self.sys_bindir) != os.path.realpath(SYSBIN):
            raise Die(f"{PG_CONFIG} says its bin directory is {self.sys_bindir}, not {SYSBIN}")
        self.src_so = env_nonempty("BENCH_SO", os.path.join(self.sys_pkglib, "tsoracle.so"))
        self.src_ext = env_nonempty("BENCH_EXT_DIR", os.path.join(self.sys_share, "extension"))
        if not os.path.isfile(self.src_so):
            raise Die(f"{self.src_so} not found (make install; for another installation: "
                      f"scripts/install-ext.sh {PG_CONFIG})")
        if not os.path.isfile(os.path.join(self.src_ext, "tsoracle.control")):
            raise Die(f"{self.src_ext}/tsoracle.control not found (make install)")
        if FLOOR_SO:
            if not os.path.isfile(FLOOR_SO):
                raise Die(f"BENCH_FLOOR_SO={FLOOR_SO}: no such file")
            with open(FLOOR_SO, "rb") as f:
                if b"built with the feature handoff-floor" not in f.read():
                    raise Die(f"BENCH_FLOOR_SO={FLOOR_SO} was not built with the feature handoff-floor")
        if want("distance") and DISTANCE_CLIENTS and not os.access(LINK, os.X_OK):
            raise Die(f"{LINK} not found (cargo build --release -p tsoracle-tests --bin tso-link; "
                      "BENCH_LINK names another; BENCH_DISTANCE_CLIENTS= skips the section)")
        self.psql_exe = os.path.join(SYSBIN, "psql")
        self.pgbench_exe = os.path.join(SYSBIN, "pgbench")

    def plot_deps(self):
        """The curve's plot needs matplotlib: install it now if it is missing (once; pinned), so
        that a machine without it fails here, not after twenty minutes of measuring."""
        if not PLOT or not CURVE_CLIENTS or not want("curve"):
            return
        ok = subprocess.run([sys.executable, "-c", "import matplotlib"], stderr=subprocess.DEVNULL).returncode == 0
        if ok:
            return
        say(f"==> installing matplotlib=={MATPLOTLIB_PIN} for the scaling plot (python3 -m pip)")
        p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                            f"matplotlib=={MATPLOTLIB_PIN}"], stdout=sys.stderr)
        if p.returncode != 0 or subprocess.run([sys.executable, "-c", "import matplotlib"]).returncode != 0:
            raise Die("could not install matplotlib for python3 (BENCH_PLOT= runs without the plot)")

    def snapshot(self):
        """The private snapshot of the server installation (see the top of this file)."""
        self.pgroot = os.path.join(self.work, "root")
        self.bin = self.pgroot + self.sys_bindir
        self.pkglib = self.pgroot + self.sys_pkglib
        share = self.pgroot + self.sys_share
        for d in (self.bin, self.pkglib, share):
            os.makedirs(d, exist_ok=True)
        for exe in ("postgres", "pg_ctl", "initdb"):
            shutil.copy2(os.path.join(SYSBIN, exe), self.bin)
        # Every shared library of pkglibdir but tsoracle's, symbolic links kept (in a
        # single-prefix installation pkglibdir is also libdir: initdb and pg_ctl find libpq.so.5
        # there through their RUNPATH $ORIGIN/../lib).
        for name in sorted(os.listdir(self.sys_pkglib)):
            if (name.endswith(".so") or ".so." in name) and name != "tsoracle.so":
                shutil.copy2(os.path.join(self.sys_pkglib, name), self.pkglib, follow_symlinks=False)
        if subprocess.run(["cp", "-a", self.sys_share + "/.", share + "/"]).returncode != 0:
            raise Die("copying the share directory failed")
        ext = os.path.join(share, "extension")
        for name in os.listdir(ext):
            if name.startswith("tsoracle"):
                os.remove(os.path.join(ext, name))

        def sources():
            return [self.src_so] + sorted(os.path.join(self.src_ext, n) for n in os.listdir(self.src_ext)
                                          if n.startswith("tsoracle"))

        def stamp():
            try:
                return [(os.stat(p).st_mtime, os.stat(p).st_size) for p in sources()]
            except OSError:
                return None

        so = os.path.join(self.pkglib, "tsoracle.so")
        for _ in range(30):
            # Copy, then accept the copy only if the sources were not being rewritten meanwhile.
            before = stamp()
            try:
                shutil.copy(self.src_so, so)
                for p in sources()[1:]:
                    n = os.path.basename(p)
                    if n == "tsoracle.control" or (n.startswith("tsoracle--") and n.endswith(".sql")):
                        shutil.copy(p, ext)
            except OSError:
                pass
            time.sleep(1)
            after = stamp()
            try:
                age = time.time() - os.stat(self.src_so).st_mtime
                same = filecmp.cmp(self.src_so, so, shallow=False)
            except OSError:
                age, same = 0, False
            if before is not None and before == after and age >= 2 and same:
                break
            for n in os.listdir(ext):
                if n.startswith("tsoracle"):
                    os.remove(os.path.join(ext, n))
            if os.path.exists(so):
                os.remove(so)
            time.sleep(1)
        else:
            raise Die(f"{self.src_so} kept changing: could not take a consistent copy")
        subprocess.run(["chmod", "-R", "a+rX", self.pgroot], check=True)
        # The hand-off floor's member runs from a snapshot of its own: the same installation,
        # the same SQL scripts, its tsoracle.so the floor build.
        if FLOOR_SO:
            froot = os.path.join(self.work, "floor-root")
            if subprocess.run(["cp", "-a", self.pgroot, froot]).returncode != 0:
                raise Die("the floor's snapshot failed")
            shutil.copy(FLOOR_SO, froot + self.sys_pkglib + "/tsoracle.so")
            self.fbin = froot + self.sys_bindir

    def init_cluster(self, bin_dir, data, port, log, *settings, admit=False):
        """initdb DATA from BIN_DIR (scripts/init-cluster.sh) and start it; admit: first admit
        it to this cluster's fleet, as a member logging in as postgres (a member nobody
        admitted is refused)."""
        p = subprocess.run([os.path.join(ROOT, "scripts", "init-cluster.sh"), bin_dir, data, str(port), self.work,
                            f"max_connections={MAX_CONN}", "jit=off", *settings])
        if p.returncode != 0:
            raise Die(f"initdb of {data} failed")
        self.datas.append((bin_dir, data))
        if admit:
            ctl = subprocess.run([os.path.join(SYSBIN, "pg_controldata"), "-D", data], stdout=subprocess.PIPE,
                                 text=True, env=dict(os.environ, LC_ALL="C")).stdout
            m = re.search(r"^Database system identifier:\s*(\d+)", ctl, re.M)
            if not m:
                raise Die(f"no system identifier in pg_controldata -D {data}")
            sysid = int(m.group(1))  # unsigned; the member's identity is its bits as a bigint
            sysid = sysid - 2**64 if sysid >= 2**63 else sysid
            self.sql.must(f"SELECT tso_fleet_admit({sysid}, 'postgres')",
                          f"admitting {data} to the fleet")
        self.pg_ctl(bin_dir, data, log, "start")

    def pg_ctl(self, bin_dir, data, log, action, mode=None):
        args = [os.path.join(bin_dir, "pg_ctl"), "-D", data, "-w"]
        if action in ("start", "restart"):
            args += ["-l", log, "-t", "60"]
        if mode:
            args += ["-m", mode]
        p = as_pg(*args, action, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL if action == "stop" else None)
        if p.returncode != 0 and action != "stop":
            tail(log)
            raise Die(f"pg_ctl {action} of {data} failed")

    def setup(self):
        self.check_install()
        self.plot_deps()
        self.work = tempfile.mkdtemp(prefix="tsoracle-bench.", dir="/tmp")
        shutil.chown(self.work, "postgres", "postgres")
        os.chmod(self.work, 0o755)
        self.data = os.path.join(self.work, "pgdata")
        self.log = os.path.join(self.work, "postgresql.log")
        self.res = os.path.join(self.work, "results.tsv")
        self.runs = os.path.join(self.work, "runs")
        os.makedirs(self.runs)
        open(self.res, "w").close()
        self.snapshot()
        self.port = free_port()
        say(f"==> initdb {self.data} (port {self.port})")
        self.init_cluster(self.bin, self.data, self.port, self.log)
        self.sql = Psql(self, self.port)
        pkglibdir = self.sql.q("SELECT setting FROM pg_config WHERE name = 'PKGLIBDIR'") or ""
        if not pkglibdir.startswith(self.pgroot + "/"):
            raise Die(f"the server loads libraries from '{pkglibdir}', not from the snapshot in {self.pgroot}")
        self.sql.must("CREATE EXTENSION tsoracle", "CREATE EXTENSION tsoracle")
        if not self.sql.wait_serving():
            tail(self.log)
            raise Die("tsoracle did not reach 'serving'")
        # A trivial C function of another extension (pg_trgm's show_limit(), from contrib):
        # what PostgreSQL's look-ups of a function that is not built in cost a one-call
        # statement. Skipped where contrib is not installed.
        self.extfn = ["extfn"] if self.sql.q("CREATE EXTENSION pg_trgm") is not None else []
        self.sql.must("CREATE SEQUENCE s; CREATE SEQUENCE s100 INCREMENT BY 100;"
                      " CREATE TABLE counter (id int PRIMARY KEY, v bigint NOT NULL);"
                      " INSERT INTO counter VALUES (1, 0);", "set-up")
        self.sql.must("VACUUM ANALYZE counter", "set-up")
        # The write paths (section 5): three tables alike but for the default of ts (8 bytes
        # each: bigint or timestamptz), each with a b-tree index on ts; three tables alike but
        # for how the version column is stamped. Autovacuum is off for them: the harness
        # truncates (INSERT, COPY) or vacuums (UPDATE) a table and takes a checkpoint before
        # every run instead, so that every run starts from the same state and no run pays for
        # another's checkpoint or vacuum.
        off = "WITH (autovacuum_enabled = off)"
        self.sql.must(f"""CREATE SEQUENCE s_ts;
            CREATE TABLE t_tso   (ts bigint      NOT NULL DEFAULT tso_next(),        v int NOT NULL) {off};
            CREATE TABLE t_clock (ts timestamptz NOT NULL DEFAULT clock_timestamp(), v int NOT NULL) {off};
            CREATE TABLE t_seq   (ts bigint      NOT NULL DEFAULT nextval('s_ts'),   v int NOT NULL) {off};
            CREATE INDEX t_tso_ts ON t_tso (ts);
            CREATE INDEX t_clock_ts ON t_clock (ts);
            CREATE INDEX t_seq_ts ON t_seq (ts);
            CREATE TABLE a_tso   (id int PRIMARY KEY, v int NOT NULL, version bigint      NOT NULL) {off};
            CREATE TABLE a_clock (id int PRIMARY KEY, v int NOT NULL, version timestamptz NOT NULL) {off};
            CREATE TABLE a_inc   (id int PRIMARY KEY, v int NOT NULL, version bigint      NOT NULL) {off};
            INSERT INTO a_tso   SELECT g, 0, tso_next()        FROM generate_series(1, {UPDATE_ROWS}) g;
            INSERT INTO a_clock SELECT g, 0, clock_timestamp() FROM generate_series(1, {UPDATE_ROWS}) g;
            INSERT INTO a_inc   SELECT g, 0, 1                 FROM generate_series(1, {UPDATE_ROWS}) g;""",
                      "set-up of the write tables")
        self.sql.must("VACUUM ANALYZE a_tso, a_clock, a_inc", "set-up of the write tables")
        # UUID keys: tables alike but for the default of their primary key (PostgreSQL 18 has
        # uuidv7()).
        self.sql.must(f"""CREATE TABLE t_uuid (id uuid PRIMARY KEY DEFAULT tso_next_uuid(),   v int NOT NULL) {off};
            CREATE TABLE t_rand (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), v int NOT NULL) {off};""",
                      "set-up of the UUID tables")
        self.uuidv7 = []
        if self.sql.q(f"CREATE TABLE t_uuidv7 (id uuid PRIMARY KEY DEFAULT uuidv7(), v int NOT NULL) {off}") \
                is not None:
            self.uuidv7 = ["ins_uuidv7"]
        self.seq_ok = True
        rc, out = self.sql.run("-c", "SELECT tso_seq('k', 1)")
        if rc != 0:
            self.seq_ok = False
            first = (out.strip().splitlines() or [""])[0]
            self.rec("info", "tso_seq", f"not available: {first}")
            say(f"==> tso_seq: not available ({first})")
        self.machine_info()

    def machine_info(self):
        rec, q = self.rec, self.sql.q
        rec("info", "cpus", NPROC)
        lscpu = subprocess.run(["lscpu"], stdout=subprocess.PIPE, text=True).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name:")), "")
        rec("info", "cpu_model", model)
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        rec("info", "memory", f"{kb // 1024} MiB")
        rec("info", "kernel", os.uname().release)
        rec("info", "server", q("SELECT version()"))
        rec("info", "server_version", q("SHOW server_version"))
        rec("info", "pg_bin", f"{SYSBIN} ({PG_CONFIG}: {self.pg_config('--version')})")
        rec("info", "pgbench", subprocess.run([self.pgbench_exe, "--version"], stdout=subprocess.PIPE,
                                              text=True).stdout.strip())
        so = os.path.join(self.pkglib, "tsoracle.so")
        build = "release"
        sections = subprocess.run(["readelf", "-S", so], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True).stdout
        if ".debug_info" in sections:
            build = ("DEBUG (has .debug_info: probably an unoptimised build, e.g. installed by cargo pgrx test; "
                     "figures are not representative)")
        with open(so, "rb") as f:
            body = f.read()
        if b"built with the feature handoff-floor" in body:
            build = ("HANDOFF-FLOOR (a member answers tso_next() without its oracle: the member rows measure "
                     "the hand-off alone)")
        installed = datetime.datetime.fromtimestamp(os.stat(self.src_so).st_mtime, datetime.timezone.utc)
        rec("info", "extension", f"{self.src_so}: {len(body)} bytes, sha256 {hashlib.sha256(body).hexdigest()[:12]}, "
            f"installed {installed:%Y-%m-%d %H:%M:%S} UTC, build: {build}")
        rec("info", "settings", q("""SELECT string_agg(name || '=' || setting || coalesce(unit, ''), ', ' ORDER BY name)
            FROM pg_settings WHERE name IN ('shared_buffers', 'max_connections', 'fsync', 'synchronous_commit',
              'wal_level', 'tsoracle.window_ahead_ms', 'tsoracle.failover_advance_ms', 'work_mem',
              'data_checksums', 'io_method', 'max_wal_size', 'checkpoint_timeout')"""))
        rec("info", "percall_n", PERCALL_N)
        rec("info", "percall_reps", PERCALL_REPS)
        rec("info", "seconds", SECS)
        rec("info", "bench", f"pgbench -n -M prepared -T {SECS} -c <clients> -j <min(clients, {NPROC})> -f <script>; "
            f"{REPS} repetitions ({THROUGHPUT_REPS} for tso_next() against SELECT 1 and pg_backend_pid()), "
            "order rotated per repetition")
        scripts = []
        for name in sorted(os.listdir(HERE)):
            if name.endswith(".sql"):
                with open(os.path.join(HERE, name)) as f:
                    scripts.append(f"{name[:-4]}: {' '.join(f.read().split(chr(10))).strip()}")
        rec("info", "scripts", "  ".join(scripts))
        self.status_rec("start")

    # --- records -----------------------------------------------------------------------------
    def rec(self, *fields):
        with open(self.res, "a") as f:
            f.write("\t".join(str(x).replace("\t", " ").replace("\n", " ") for x in fields) + "\n")

    def status_rec(self, label, sql=None):
        self.rec("status", label, (sql or self.sql).q("SELECT row_to_json(s) FROM tso_status() s") or "{}")

    # --- helpers -----------------------------------------------------------------------------
    def background(self, cmd, out):
        with open(out, "w") as f:
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.DEVNULL)
        self.procs.append(p)
        return p

    def stop_psql(self, p):
        """Give a sampler 3 s to end by itself, then end it."""
        if p is None:
            return
        try:
            p.wait(timeout=3)
        except subprocess.TimeoutExpired:
            p.terminate()
            p.wait()
        if p in self.procs:
            self.procs.remove(p)

    def start_sampler(self, out, secs, sql=None):
        """Sample the wait events of active client backends and of the tsoracle worker every
        0.25 s, in one session, into out, for about as long as one run (the session ends by
        itself: killing it would log FATALs)."""
        lines = [
            # Renice the sampler (psql and its backend) so that it still gets to run on a
            # saturated machine; it costs a few queries a second.
            "SELECT pg_backend_pid() AS sampler_pid \\gset",
            "\\setenv SAMPLER_PID :sampler_pid",
            "\\! renice -n -5 -p \"$SAMPLER_PID\" \"$PPID\" >/dev/null 2>&1",
        ]
        for _ in range(secs * 4 - 1):
            lines.append("SELECT pg_sleep(0.25) \\g /dev/null")
            lines.append("SELECT CASE WHEN backend_type = 'client backend' THEN '' ELSE 'worker ' END"
                         " || coalesce(wait_event_type || ':' || wait_event, 'CPU') FROM pg_stat_activity"
                         " WHERE pid <> pg_backend_pid() AND ((backend_type = 'client backend' AND state = 'active')"
                         " OR backend_type LIKE 'tsoracle%');")
        with open(out + ".sql", "w") as f:
            f.write("\n".join(lines) + "\n")
        return self.background((sql or self.sql).cmd + ["-f", out + ".sql"], out)

    def start_lag_sampler(self, out, secs):
        """Sample how far the resolved timestamp lags the last issued value
        (tso_resolved_status().lag_ms) every 50 ms, into out, for about as long as one run."""
        lines = []
        for _ in range(secs * 20 - 2):
            lines.append("SELECT pg_sleep(0.05) \\g /dev/null")
            lines.append("SELECT lag_ms FROM tso_resolved_status();")
        with open(out + ".sql", "w") as f:
            f.write("\n".join(lines) + "\n")
        return self.background(self.sql.cmd + ["-f", out + ".sql"], out)

    def busy_pct(self, secs):
        """CPU busy % of the machine over secs seconds while this benchmark is idle between
        runs, minus the CPU its own clusters used meanwhile: what other tenants of the machine
        use (the figures of a run next to a busy gap are suspect)."""
        pids = []
        for _, data in self.datas:
            try:
                with open(os.path.join(data, "postmaster.pid")) as f:
                    pids.append(f.readline().strip())
            except OSError:
                pass  # stopped
        p = subprocess.run([sys.executable, os.path.join(HERE, "foreign_cpu.py"), str(secs), *pids],
                           stdout=subprocess.PIPE, text=True)
        return p.stdout.strip()

    def check_server(self):
        """The server must still be up (a crash restart is waited for; a dead server ends the run)."""
        if self.sql.wait_serving(100):
            return
        say(f"bench: the server is down or tsoracle is not serving; last lines of {self.log}:")
        tail(self.log, 15)
        raise Die("the server is down (if tsoracle.so was reinstalled while the benchmark ran, just rerun)")

    def run_pgbench(self, name, script, clients, rep, *extra, port=None, secs=None, sql=None, host=None):
        """One pgbench run, recorded: its tps, transactions, wait events and the foreign CPU
        in the idle second after it; over the Unix-domain socket unless a host is given.
        Returns its tps or None."""
        secs = secs or SECS
        jobs = min(clients, NPROC)
        tag = f"{name}.c{clients}.r{rep}"
        self.check_server()
        out = os.path.join(self.runs, tag + ".out")
        sampler = self.start_sampler(os.path.join(self.runs, tag + ".waits"), secs, sql)
        lag = None
        if name == "ins_tso":
            lag = self.start_lag_sampler(os.path.join(self.runs, tag + ".lag"), secs)
        with open(out, "w") as f:
            rc = subprocess.run([self.pgbench_exe, "-h", host or self.work, "-p", str(port or self.port), "-U", "postgres",
                                 "-n", "-M", "prepared", "-T", str(secs), "-c", str(clients), "-j", str(jobs),
                                 "-f", os.path.join(HERE, script + ".sql"), *extra, "postgres"],
                                stdout=f, stderr=subprocess.STDOUT).returncode
        self.stop_psql(sampler)
        if lag is not None:
            self.stop_psql(lag)
            self.rec("lag", name, clients, rep, os.path.join(self.runs, tag + ".lag"))
        with open(out, errors="replace") as f:
            text = f.read()
        m = re.search(r"^tps = ([0-9.]+) \(without initial connection time\)", text, re.M)
        tps = None
        if rc != 0 or not m:
            err = next((ln for ln in text.splitlines() if re.search("error|abort|fatal", ln, re.I)), "")
            self.rec("fail", name, clients, rep, err)
            say(f"    {name:16s} c={clients:<3d} rep {rep}: FAILED ({err})")
        else:
            tps = float(m.group(1))
            self.rec("tps", name, clients, rep, m.group(1))
            n = re.search(r"^number of transactions actually processed: (\d+)", text, re.M)
            self.rec("txns", name, clients, rep, n.group(1) if n else "")
            say(f"    {name:16s} c={clients:<3d} rep {rep}: {tps:12.1f} tps")
        self.rec("waits", name, clients, rep, os.path.join(self.runs, tag + ".waits"))
        self.rec("busy", name, clients, rep, self.busy_pct(1))
        return tps

    def interleave(self, clients, rep, workloads, *extra):
        for w in rotated(rep, workloads):
            self.run_pgbench(w, w, clients, rep, *extra)

    def timed_psql(self, sql, args, stdin_path, out):
        """Wall time (ms) of one psql command, its status and output."""
        t0 = time.monotonic_ns()
        if stdin_path:
            with open(stdin_path) as f:
                rc, text = sql.run(*args, stdin=f, out=out)
        else:
            rc, text = sql.run(*args, out=out)
        return (time.monotonic_ns() - t0) / 1e6, rc, text

    def start_member(self, name, bin_dir, oracle_conninfo):
        """initdb WORK/NAME from the installation bin_dir as a member of an oracle, start it and
        wait until it serves: (port, its Psql)."""
        data = os.path.join(self.work, name)
        port = free_port()
        self.init_cluster(bin_dir, data, port, os.path.join(self.work, name + ".log"),
                          f"tsoracle.oracle={oracle_conninfo}", admit=True)
        msql = Psql(self, port)
        msql.must("CREATE EXTENSION tsoracle", f"CREATE EXTENSION on {name}")
        if not msql.wait_serving():
            tail(os.path.join(self.work, name + ".log"))
            raise Die(f"{name} is not serving")
        return port, msql

    # --- the sections ------------------------------------------------------------------------
    def throughput(self):
        """1. tso_next() vs SELECT 1 vs nextval('s') vs clock_timestamp() vs pg_backend_pid().

        SELECT clock_timestamp() shows what calling any function costs a one-call statement
        (against SELECT 1, which calls none); SELECT pg_backend_pid() is a built-in function as
        trivial as one gets. The after_* pair: sessions that called tso_next() (or
        clock_timestamp()) once, then only SELECT 1: what a backend's later transactions pay for
        having once called tsoracle (pgbench -D done=0; each client's first transaction sets
        done)."""
        say(f"==> throughput: tso_next() vs SELECT 1 vs nextval('s') vs clock_timestamp() vs pg_backend_pid() "
            f"(clients: {words(CLIENTS)})")
        for c in CLIENTS:
            self.run_pgbench("warmup", "select1", c, 0, secs=3)  # connections, caches, CPU frequency
            for r in range(1, THROUGHPUT_REPS + 1):
                self.interleave(c, r, ["select1", "tso_next", "nextval", "clock", "pid"] + self.extfn)
                for w in rotated(r, ["after_tso_next", "after_clock"]):
                    self.run_pgbench(w, w, c, r, "-D", "done=0")

    def resolved(self):
        """1b. tso_resolved(): cheap enough to poll. Its SELECT 1 runs are recorded as
        res_select1: section 1's own SELECT 1 runs at the same client count are the baselines its
        tso_next() runs were paired with."""
        say(f"==> throughput: tso_resolved() vs SELECT 1 ({BATCH_CLIENTS} clients)")
        for r in range(1, REPS + 1):
            for w in rotated(r, ["select1", "resolved"]):
                self.run_pgbench("res_" + w, w, BATCH_CLIENTS, r)

    def percall(self):
        """2. per-call cost inside one backend."""
        say(f"==> per-call cost: count(f()) over generate_series(1, {PERCALL_N})")
        labels = ["loop", "clock", "nextval", "tso_next"]
        exprs = ["count(1)", "count(clock_timestamp())", "count(nextval('s'))", "count(tso_next())"]
        lines = ["\\timing on"]
        lines += [f"SELECT {e} FROM generate_series(1, {PERCALL_N});" for e in exprs]  # warm-up
        for r in range(1, PERCALL_REPS + 1):
            for i in range(4):
                j = (i + r) % 4
                lines.append(f"\\echo @@ {labels[j]} {r}")
                lines.append(f"SELECT {exprs[j]} FROM generate_series(1, {PERCALL_N});")
        path = os.path.join(self.work, "percall.sql")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.check_server()
        rc, text = self.sql.run("-f", path, out=os.path.join(self.work, "percall.out"))
        if rc != 0:
            err = next((ln for ln in text.splitlines() if "ERROR" in ln), "")
            self.rec("fail", "percall", 1, 0, err)
            say(f"    per-call runs FAILED: {err}")
            return
        label = None
        for ln in text.splitlines():
            if ln.startswith("@@ "):
                label = ln.split()[1:3]
            elif ln.startswith("Time: ") and label:
                self.rec("ms", label[0], 1, label[1], ln.split()[1])
                say(f"    {label[0]:10s} rep {label[1]}: {ln}")
                label = None
        self.rec("busy", "percall", 1, 0, self.busy_pct(1))

    def batch(self):
        """3. tso_next_batch(1000)."""
        say(f"==> tso_next_batch(1000), {BATCH_CLIENTS} clients")
        for r in range(1, REPS + 1):
            self.run_pgbench("tso_next_batch", "tso_next_batch", BATCH_CLIENTS, r)

    def seq(self):
        """4. tso_seq('k', 100) vs a counter table vs nextval."""
        if not self.seq_ok:
            say("==> tso_seq: not available, skipping its rows")
            return
        say(f"==> tso_seq('k', 100) vs counter-table UPDATE ... RETURNING vs nextval('s100') (clients: {words(CLIENTS)})")
        for c in CLIENTS:
            for r in range(1, REPS + 1):
                for w in rotated(r, ["tso_seq", "counter", "nextval100"]):
                    if w == "tso_seq":
                        self.status_rec(f"seq_before.c{c}.r{r}")
                    self.run_pgbench(w, w, c, r)
                    if w == "tso_seq":
                        self.status_rec(f"seq_after.c{c}.r{r}")

    def ceiling_tables(self):
        self.sql.must("CREATE TABLE IF NOT EXISTS commit_ceiling (v int NOT NULL) WITH (autovacuum_enabled = off)",
                      "set-up of the commit-ceiling table")
        # Eight keys k1..k8 exist before the runs (a key's first block is the worker's).
        self.sql.must("SELECT count(tso_seq('k' || g, 1)) FROM generate_series(1, 8) g", "set-up of the keys k1..k8")

    def ceiling(self):
        """4b. tso_seq against the durable-commit ceiling. Any design that makes each block
        durable before it returns pays at least one flushed commit per call: independent clients
        each committing a one-row INSERT (PostgreSQL's own group commit, no shared row) are that
        ceiling. One client's per-transaction log gives the latency."""
        if not self.seq_ok or not CEIL_CLIENTS:
            return
        say(f"==> tso_seq('k', 100) vs one-row INSERT commits (clients: {words(CEIL_CLIENTS)})")
        self.ceiling_tables()
        for c in CEIL_CLIENTS:
            # Several keys at once (8 keys, each call one at random) from 8 clients up.
            keys = ["tso_seq_keys"] if c >= 8 else []
            # One client: many short pairs, so that the median of their ratios does not move
            # with the disk's drift (each pair runs back to back, the order alternating).
            reps = CEIL_ONE_REPS if c == 1 else CEIL_REPS
            for r in range(1, reps + 1):
                for w in rotated(r, ["tso_seq", "ins_commit"] + keys):
                    if c == 1:
                        prefix = os.path.join(self.runs, f"txlog.ceil_{w}.c{c}.r{r}")
                        self.run_pgbench("ceil_" + w, w, c, r, "-l", f"--log-prefix={prefix}", secs=CEIL_ONE_SECS)
                        self.rec("lat", "ceil_" + w, c, r, prefix)
                    else:
                        self.run_pgbench("ceil_" + w, w, c, r)
            self.sql.q("TRUNCATE commit_ceiling")

    def restart_with(self, setting):
        self.sql.must(setting, setting)
        self.pg_ctl(self.bin, self.data, self.log, "restart")
        if not self.sql.wait_serving():
            raise Die("not serving after the restart for the slot runs")

    def slot(self):
        """4b'. With a logical slot present. A logical slot of the database (pgoutput here, for
        a publication of another table, as a Debezium outbox makes; BENCH_SLOT_PLUGIN=
        test_decoding for another plugin) makes every advance of tsoracle.seq and
        tsoracle.high_water a row version it can decode (at wal_level = logical nothing is
        written in place, slot or not: docs/operations/in-place.md): tso_seq goes through the
        worker's group commit. The cluster restarts with wal_level = logical, the slot exists
        (nothing consumes it), and the same pairs run as without it. Then the slot is dropped
        and wal_level put back."""
        if not self.seq_ok or not SLOT_CLIENTS:
            return
        say(f"==> with a {SLOT_PLUGIN} slot (clients: {words(SLOT_CLIENTS)})")
        self.restart_with("ALTER SYSTEM SET wal_level = logical")
        self.ceiling_tables()
        self.sql.must("CREATE TABLE IF NOT EXISTS bench_outbox (id bigint PRIMARY KEY, body text)",
                      "the publication for the slot")
        self.sql.must("CREATE PUBLICATION bench_pub FOR TABLE bench_outbox", "the publication for the slot")
        self.sql.must(f"SELECT pg_create_logical_replication_slot('bench_slot', '{SLOT_PLUGIN}')",
                      f"the {SLOT_PLUGIN} slot")
        self.rec("info", "slot_plugin", SLOT_PLUGIN)
        for c in SLOT_CLIENTS:
            for r in range(1, REPS + 1):
                for w in rotated(r, ["tso_seq", "ins_commit", "tso_next", "select1"]):
                    self.run_pgbench("slot_" + w, w, c, r)
            self.sql.q("TRUNCATE commit_ceiling")
        self.rec("info", "slot_group_commits", self.sql.q("SELECT group_commits FROM tso_status()"))
        self.sql.q("SELECT pg_drop_replication_slot('bench_slot')")
        self.sql.q("DROP PUBLICATION bench_pub")
        self.restart_with("ALTER SYSTEM RESET wal_level")

    def member_tables(self, msql, what, clock=True):
        off = "WITH (autovacuum_enabled = off)"
        ddl = f"CREATE TABLE t_tso (ts bigint NOT NULL DEFAULT tso_next(), v int NOT NULL) {off}; CREATE INDEX ON t_tso (ts);"
        if clock:
            ddl += (f" CREATE TABLE t_clock (ts timestamptz NOT NULL DEFAULT clock_timestamp(), v int NOT NULL) {off};"
                    " CREATE INDEX ON t_clock (ts);")
        msql.must(ddl, what)

    @staticmethod
    def prep(msql, table):
        """TRUNCATE + CHECKPOINT before a run that writes the table."""
        if msql.q(f"TRUNCATE {table}") is None or msql.q("CHECKPOINT") is None:
            raise Die(f"preparing {table} failed")

    def member(self):
        """4c. A member of a fleet: a second cluster on this machine, a member of the first
        (tsoracle.oracle through its socket): tso_next() on the member against SELECT 1 on the
        member and tso_next() on the oracle; the values the member fetched per round trip
        (tso_member_status()); one client's latency against member SELECT 1 plus a round trip to
        the oracle (SELECT 1 there). Then the member's write paths."""
        if not MEMBER_CLIENTS:
            return
        say(f"==> a member of this cluster (clients: {words(MEMBER_CLIENTS)})")
        conninfo = f"host={self.work} port={self.port} user=postgres dbname=postgres"
        mport, msql = self.start_member("member", self.bin, conninfo)

        def counts():
            return msql.q("SELECT round_trips || ' ' || values_fetched FROM tso_member_status()") or ""

        for c in MEMBER_CLIENTS:
            for r in range(1, REPS + 1):
                for w in rotated(r, ["mem_tso_next", "mem_select1", "orc_tso_next"]):
                    port = mport if w.startswith("mem_") else self.port
                    script = "select1" if w == "mem_select1" else "tso_next"
                    before = counts()
                    if c == 1:
                        prefix = os.path.join(self.runs, f"txlog.{w}.c{c}.r{r}")
                        self.run_pgbench(w, script, c, r, "-l", f"--log-prefix={prefix}", port=port)
                        self.rec("lat", w, c, r, prefix)
                    else:
                        self.run_pgbench(w, script, c, r, port=port)
                    if w == "mem_tso_next":
                        self.rec("member", c, r, before, counts())
                if c == 1:
                    prefix = os.path.join(self.runs, f"txlog.orc_select1.c1.r{r}")
                    self.run_pgbench("orc_select1", "select1", 1, r, "-l", f"--log-prefix={prefix}")
                    self.rec("lat", "orc_select1", 1, r, prefix)
        # The member's write paths, ts DEFAULT tso_next() against DEFAULT clock_timestamp() on
        # the member: one-row INSERTs (WRITE_CLIENTS), a COPY and an INSERT ... SELECT of
        # COPY_ROWS rows (a statement's reservation: docs/fleet.md). TRUNCATE + CHECKPOINT
        # before each run.
        self.member_tables(msql, "the member's write tables")
        inserts = ["tso", "clock"]
        fsql = fport = None
        if FLOOR_SO:
            # The floor's member: the same settings, the same oracle, the same table; stopped
            # once its rows are measured.
            say(f"==> the hand-off floor's member ({FLOOR_SO})")
            fport, fsql = self.start_member("member-floor", self.fbin, conninfo)
            self.member_tables(fsql, "the floor's member's table", clock=False)
            inserts.append("floor")
        say(f"==> member INSERT INTO t(v) VALUES ($1), ts DEFAULT tso_next() vs clock_timestamp()"
            f"{' vs the hand-off floor' if FLOOR_SO else ''} (clients: {words(WRITE_CLIENTS)})")
        for c in WRITE_CLIENTS:
            for r in range(1, REPS + 1):
                for x in rotated(r, inserts):
                    if x == "floor":
                        self.prep(fsql, "t_tso")
                        self.run_pgbench("mem_ins_floor", "ins_tso", c, r, port=fport)
                    else:
                        self.prep(msql, "t_" + x)
                        self.run_pgbench("mem_ins_" + x, "ins_" + x, c, r, port=mport)
        if FLOOR_SO:
            flog = os.path.join(self.work, "member-floor.log")
            with open(flog, errors="replace") as f:
                bad = [ln.strip() for ln in f if re.search("PANIC|terminated by signal", ln)]
            for ln in bad[:3]:
                self.rec("fail", "mem_ins_floor", 1, 1, ln)
            # A floor whose proxy connected again meanwhile measured reconnections, not the
            # hand-off.
            connects = fsql.q("SELECT connects FROM tso_member_status()")
            if connects != "1":
                self.rec("fail", "mem_ins_floor", 1, 1,
                         f"the floor's member connected to the oracle {connects} times, not once")
            self.pg_ctl(self.fbin, os.path.join(self.work, "member-floor"), flog, "stop", "fast")
        say(f"==> member COPY and INSERT ... SELECT of {COPY_ROWS} rows, ts DEFAULT tso_next() vs clock_timestamp(), "
            f"{COPY_REPS} repetitions")
        data = os.path.join(self.work, "copy.data")
        with open(data, "w") as f:
            f.write("".join(f"{i}\n" for i in range(1, COPY_ROWS + 1)))
        for r in range(1, COPY_REPS + 1):
            for wx in rotated(r, ["copy_tso", "copy_clock", "insel_tso", "insel_clock"]):
                x = wx.split("_", 1)[1]
                self.prep(msql, "t_" + x)
                out = os.path.join(self.runs, f"mem_{wx}.r{r}.out")
                if wx.startswith("copy_"):
                    took, rc, text = self.timed_psql(msql, ["-c", f"COPY t_{x} (v) FROM STDIN"], data, out)
                else:
                    took, rc, text = self.timed_psql(
                        msql, ["-c", f"INSERT INTO t_{x} (v) SELECT g FROM generate_series(1, {COPY_ROWS}) g"],
                        None, out)
                n = msql.q(f"SELECT count(*) FROM t_{x}")
                if rc != 0 or n != str(COPY_ROWS):
                    self.rec("fail", "mem_" + wx, 1, r, f"{(text.splitlines() or [''])[0]} (rows: {n})")
                else:
                    self.rec("copy", "mem_" + wx, COPY_ROWS, r, f"{took:.3f}")
                    say(f"    {'mem_' + wx:16s} rep {r}: {took:10.0f} ms")
                self.rec("busy", "mem_" + wx, 1, r, self.busy_pct(1))
        msql.must("TRUNCATE t_tso, t_clock", "clean-up of the member's write tables")
        self.pg_ctl(self.bin, os.path.join(self.work, "member"), os.path.join(self.work, "member.log"), "stop", "fast")

    def distance(self):
        """4d. A member a network away. A member of this cluster through a link of
        BENCH_DISTANCE_RTTS ms round trip (tso-link, tests/src/link.rs: a TCP forwarder on
        loopback that delays each direction by half the round trip, however many bytes are on
        their way). Per repetition and client count, in an order rotated each repetition: one-row
        INSERTs ts DEFAULT tso_next() with the link at each round trip, and DEFAULT
        clock_timestamp() on the same member; one client's SELECT tso_next() latency at each
        round trip, and one client's SELECT 1 on this cluster through the same link at each
        round trip (what the link itself adds: its threads sleep and wake twice a round trip).
        report.py sets each round trip's INSERTs against the distance floor
        c / (c / tps_0 + RTT), tps_0 the same member's rate through the same link with no delay
        in the same repetition, and one client's p50 beyond its p50 at 0 ms against the
        link's own round trip so measured (and against the RTT it was set to)."""
        if not DISTANCE_CLIENTS:
            return
        say(f"==> a member a network away: round trips {words(DISTANCE_RTTS)} ms, clients {words(DISTANCE_CLIENTS)}")
        log = os.path.join(self.work, "link.log")
        with open(log, "w") as f:
            link = subprocess.Popen([LINK, "0", str(self.port), "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=f, text=True)
        self.procs.append(link)
        line = link.stdout.readline().strip()
        if not line.isdigit():
            tail(log)
            raise Die(f"{LINK} did not start")
        lport = int(line)

        def set_rtt(rtt):
            link.stdin.write(f"{rtt / 2:g}\n")
            link.stdin.flush()
            answer = link.stdout.readline().strip()
            if not answer.startswith("ok "):
                tail(log)
                raise Die(f"{LINK} did not take a one-way delay of {rtt / 2:g} ms ({answer or 'no answer'})")

        conninfo = f"host=127.0.0.1 port={lport} user=postgres dbname=postgres"
        fport, fsql = self.start_member("member-far", self.bin, conninfo)
        self.member_tables(fsql, "the far member's tables")
        self.rec("info", "distance", f"a member of this cluster through {os.path.basename(LINK)} (tests/src/link.rs) "
                 f"on loopback, half the round trip each way; one-row INSERTs: {words(DISTANCE_CLIENTS)} clients, "
                 f"{REPS} repetitions, order rotated, TRUNCATE + CHECKPOINT before each run; one client's "
                 "SELECT tso_next() latency, and one client's SELECT 1 on the oracle through the link, from "
                 "per-transaction logs")
        for c in DISTANCE_CLIENTS:
            for r in range(1, REPS + 1):
                for w in rotated(r, [f"far_ins_rtt{fmt_ms(x)}" for x in DISTANCE_RTTS] + ["far_ins_clock"]):
                    if w == "far_ins_clock":
                        self.prep(fsql, "t_clock")
                        self.run_pgbench(w, "ins_clock", c, r, port=fport, sql=fsql)
                        continue
                    set_rtt(float(w[len("far_ins_rtt"):]))
                    self.prep(fsql, "t_tso")
                    self.run_pgbench(w, "ins_tso", c, r, port=fport, sql=fsql)
                if c == 1:
                    # One client's SELECT tso_next() on the member, and SELECT 1 on the oracle
                    # through the same link: what a round trip through it costs a client.
                    for x in rotated(r, DISTANCE_RTTS):
                        set_rtt(x)
                        w = f"far_lat_rtt{fmt_ms(x)}"
                        prefix = os.path.join(self.runs, f"txlog.{w}.c1.r{r}")
                        self.run_pgbench(w, "lat_tso_next", 1, r, "-l", f"--log-prefix={prefix}", port=fport,
                                         sql=fsql)
                        self.rec("lat", w, 1, r, prefix)
                        w = f"link_lat_rtt{fmt_ms(x)}"
                        prefix = os.path.join(self.runs, f"txlog.{w}.c1.r{r}")
                        self.run_pgbench(w, "lat_select1", 1, r, "-l", f"--log-prefix={prefix}", port=lport,
                                         host="127.0.0.1")
                        self.rec("lat", w, 1, r, prefix)
        connects = fsql.q("SELECT connects FROM tso_member_status()")
        self.rec("info", "distance_connects", connects)
        if link.poll() is not None:
            self.rec("fail", "far_link", 1, 1, f"{LINK} ended (status {link.returncode})")
        mlog = os.path.join(self.work, "member-far.log")
        with open(mlog, errors="replace") as f:
            for ln in [ln.strip() for ln in f if re.search("PANIC|terminated by signal", ln)][:3]:
                self.rec("fail", "far_member", 1, 1, ln)
        fsql.q("TRUNCATE t_tso, t_clock")
        self.pg_ctl(self.bin, os.path.join(self.work, "member-far"), mlog, "stop", "fast")
        link.kill()
        link.wait()
        self.procs.remove(link)

    def writes(self):
        """5. The write paths users run: INSERT with a default, COPY, UPDATE of a version stamp.
        Before every run: TRUNCATE (INSERT) or VACUUM (UPDATE) of the table about to be written,
        then CHECKPOINT, so that each run starts from the same state and pays for no other
        run's dirt."""
        def prep(w):
            kind, x = w.split("_", 1)
            ok = self.sql.q(f"TRUNCATE t_{x}" if kind == "ins" else f"VACUUM a_{x}") is not None
            if not ok or self.sql.q("CHECKPOINT") is None:
                raise Die(f"preparing {w} failed")

        def rows(c, workloads, *extra):
            for r in range(1, REPS + 1):
                for w in rotated(r, workloads):
                    self.check_server()
                    prep(w)
                    self.run_pgbench(w, w, c, r, *extra)

        self.rec("info", "update_rows", UPDATE_ROWS)
        say(f"==> INSERT INTO t(v) VALUES ($1), ts DEFAULT tso_next() vs clock_timestamp() vs nextval('s_ts') "
            f"(clients: {words(WRITE_CLIENTS)})")
        for c in WRITE_CLIENTS:
            rows(c, ["ins_tso", "ins_clock", "ins_seq"])
        say(f"==> INSERT INTO t(v) VALUES ($1), id uuid PRIMARY KEY DEFAULT tso_next_uuid() vs gen_random_uuid()"
            f"{' vs uuidv7()' if self.uuidv7 else ''} (clients: {words(WRITE_CLIENTS)})")
        for c in WRITE_CLIENTS:
            rows(c, ["ins_uuid", "ins_rand"] + self.uuidv7)
        say(f"==> UPDATE ... SET version = tso_next() vs clock_timestamp() vs version + 1, random id of {UPDATE_ROWS} "
            f"(clients: {words(WRITE_CLIENTS)})")
        for c in WRITE_CLIENTS:
            rows(c, ["upd_tso", "upd_clock", "upd_inc"], "-D", f"rows={UPDATE_ROWS}")
        say(f"==> COPY t(v) FROM STDIN, {COPY_ROWS} rows, ts DEFAULT tso_next() vs clock_timestamp() vs "
            f"nextval('s_ts'), {COPY_REPS} repetitions")
        data = os.path.join(self.work, "copy.data")
        with open(data, "w") as f:
            f.write("".join(f"{i}\n" for i in range(1, COPY_ROWS + 1)))
        self.rec("info", "copy_rows", COPY_ROWS)
        self.rec("info", "copy_reps", COPY_REPS)
        for r in range(1, COPY_REPS + 1):
            for x in rotated(r, ["tso", "clock", "seq"]):
                self.check_server()
                prep("ins_" + x)
                out = os.path.join(self.runs, f"copy_{x}.r{r}.out")
                took, rc, text = self.timed_psql(self.sql, ["-c", f"COPY t_{x} (v) FROM STDIN"], data, out)
                n = self.sql.q(f"SELECT count(*) FROM t_{x}")
                if rc != 0 or n != str(COPY_ROWS):
                    first = (text.splitlines() or [""])[0]
                    self.rec("fail", "copy_" + x, 1, r, f"{first} (rows: {n})")
                    say(f"    {'copy_' + x:16s} rep {r}: FAILED ({first})")
                else:
                    self.rec("copy", "copy_" + x, COPY_ROWS, r, f"{took:.3f}")
                    say(f"    {'copy_' + x:16s} rep {r}: {took:10.3f} ms")
                self.rec("busy", "copy_" + x, 1, r, self.busy_pct(1))
        self.sql.must("TRUNCATE t_tso, t_clock, t_seq", "clean-up of the write tables")
        self.sql.must("CHECKPOINT", "clean-up of the write tables")

    def p99(self):
        """6. p99 latency across window extensions. Latency scripts end with a \\set: pgbench
        caches its clock within one pass of a client's state machine, so without a meta-command
        after the query a reply that is already there when pgbench looks gets latency 0 (common
        on 2 oversubscribed cores); the \\set makes it read the clock after the reply. Two
        shapes: closed loop (P99_CLIENTS clients as fast as they can: the machine is saturated,
        tails are mostly run-queue waits) and open loop (P99_RATE_CLIENTS clients at -R P99_RATE
        in total: tails show stalls of the call itself; latency = pgbench's latency minus its
        schedule lag)."""
        say(f"==> p99 latency, tsoracle.window_ahead_ms = {P99_WINDOW_MS}: closed loop ({P99_CLIENTS} clients), "
            f"open loop ({P99_RATE_CLIENTS} clients, -R {P99_RATE})")
        self.sql.q(f"ALTER SYSTEM SET tsoracle.window_ahead_ms = {P99_WINDOW_MS}")
        self.sql.q("SELECT pg_reload_conf()")
        # The worker extends only when less than half of the window is left: wait until the
        # window committed under the old setting has drained and extensions come at the new pace.
        for _ in range(100):
            left = self.sql.q("SELECT window_left_ms FROM tso_status()")
            if left and left.lstrip("-").isdigit() and int(left) <= 2 * P99_WINDOW_MS:
                break
            time.sleep(0.1)
        time.sleep(0.5)
        self.rec("info", "p99_window", self.sql.q("SHOW tsoracle.window_ahead_ms"))
        self.rec("info", "p99_rate", P99_RATE)
        self.status_rec("p99_start")
        for r in range(1, REPS + 1):
            for shape in ("closed", "open"):
                for w in rotated(r, ["select1", "tso_next"]):
                    if shape == "closed":
                        name, c, extra = f"p99_{w}", P99_CLIENTS, []
                    else:
                        name, c, extra = f"p99r_{w}", P99_RATE_CLIENTS, ["-R", str(P99_RATE)]
                    prefix = os.path.join(self.runs, f"{name}.r{r}")
                    self.status_rec(f"before.{name}.r{r}")
                    self.run_pgbench(name, "lat_" + w, c, r, *extra, "-l", f"--log-prefix={prefix}",
                                     f"--sampling-rate={'0.25' if shape == 'closed' else '1'}")
                    self.status_rec(f"after.{name}.r{r}")
                    self.rec("lat", name, c, r, prefix)
        self.status_rec("p99_end")
        self.sql.q("ALTER SYSTEM RESET tsoracle.window_ahead_ms")
        self.sql.q("SELECT pg_reload_conf()")

    def curve(self):
        """7. The scaling curve: tso_next() and SELECT 1 from 1 to 256 clients. Closed loop,
        the latency scripts (see section 6), per-transaction logs sampled at CURVE_SAMPLING;
        throughput from pgbench, p50/p99 from the logs (report.py)."""
        if not CURVE_CLIENTS:
            return
        say(f"==> scaling curve: SELECT tso_next() and SELECT 1, clients: {words(CURVE_CLIENTS)} "
            f"({CURVE_SECS} s runs, {CURVE_REPS} repetitions)")
        self.rec("info", "curve", f"pgbench -n -M prepared -T <{CURVE_SECS} + 1 per 64 clients, for connecting> "
                 f"-c <clients> -j <min(clients, {NPROC})> -f lat_<workload>.sql -l "
                 f"--sampling-rate={CURVE_SAMPLING}; {CURVE_REPS} repetitions, order rotated")
        self.rec("info", "curve_seconds", CURVE_SECS)
        self.rec("info", "curve_reps", CURVE_REPS)
        self.run_pgbench("warmup", "lat_select1", CURVE_CLIENTS[-1], 0, secs=3)
        for c in CURVE_CLIENTS:
            for r in range(1, CURVE_REPS + 1):
                for w in rotated(r, ["select1", "tso_next"]):
                    # pgbench's -T clock includes connecting (a few seconds for 256 clients on a
                    # loaded machine): one more second per 64 clients; the report flags runs
                    # that still measured less than the intended time (transactions / tps).
                    prefix = os.path.join(self.runs, f"txlog.curve_{w}.c{c}.r{r}")
                    self.run_pgbench("curve_" + w, "lat_" + w, c, r, "-l", f"--log-prefix={prefix}",
                                     f"--sampling-rate={CURVE_SAMPLING}", secs=CURVE_SECS + (c + 63) // 64)
                    self.rec("lat", "curve_" + w, c, r, prefix)

    def oracle(self):
        """An oracle serving simulated members (issue 55), on a cluster of its own sized for the
        largest point: each pgbench client is a member, through the real protocol (a hello,
        then tsoracle.member_next(k, session) round trips as a member of this version sends them
        (its hello names the session, as a member's does); its first member_next is tried again while
        the oracle answers 57P03, its registration not durable yet, as a member's worker does:
        bench_first_next). Per point (report.py): round trips/s and values/s once every member
        has said hello (per-transaction logs), p50/p99 of a round trip (the hellos excluded),
        the cores the oracle's processes used (/proc/PID/schedstat) over half of
        BENCH_ORACLE_SECONDS once every member said hello, and the Pss of the member backends
        (/proc/PID/smaps_rollup) then. Before the members, per size, three references from as many
        sessions: prepared SELECT 1, the members' statement on sessions no hello named (answered
        NULL, having done nothing) and pg_trgm's show_limit()."""
        if not ORACLE_MEMBERS:
            return
        most = max(ORACLE_MEMBERS)
        odata = os.path.join(self.work, "oracle")
        olog = os.path.join(self.work, "oracle.log")
        oport = free_port()
        say(f"==> an oracle of its own (port {oport}; members: {words(ORACLE_MEMBERS)}; k: {words(ORACLE_K)})")
        p = subprocess.run([os.path.join(ROOT, "scripts", "init-cluster.sh"), self.bin, odata, str(oport), self.work,
                            f"max_connections={most + 10}", "jit=off", f"tsoracle.max_members={most}"])
        if p.returncode != 0:
            raise Die("initdb of the oracle failed")
        self.datas.append((self.bin, odata))
        self.pg_ctl(self.bin, odata, olog, "start")
        osql = Psql(self, oport)
        osql.must("CREATE EXTENSION tsoracle", "CREATE EXTENSION on the oracle")
        # The references beside SELECT 1 (below): any extension's trivial C function, if contrib
        # is there.
        extfn = osql.q("CREATE EXTENSION pg_trgm") is not None
        if not extfn:
            self.rec("info", "oracle_extfn", "no pg_trgm (contrib) on the oracle: no show_limit() reference")
        osql.must("""CREATE ROLE bench_member LOGIN; GRANT tsoracle_member TO bench_member;
            CREATE FUNCTION bench_first_next() RETURNS void LANGUAGE plpgsql AS $$
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
            END $$""", "set-up of the oracle")
        # Each simulated member's identity (oracle_member.sql: 1000000 + its client id),
        # admitted for bench_member, as a superuser admits real members.
        osql.must(f"SELECT count(tso_fleet_admit(1000000 + g, 'bench_member')) FROM generate_series(0, {most - 1}) g",
                  "admitting the simulated members")
        if not osql.wait_serving():
            tail(olog)
            raise Die("the oracle is not serving")
        over = osql.q("SELECT extversion FROM pg_extension WHERE extname = 'tsoracle'")
        with open(os.path.join(odata, "postmaster.pid")) as f:
            opm = f.readline().strip()
        with open("/proc/loadavg") as f:
            load = " ".join(f.read().split()[:3])
        self.rec("info", "oracle_load", f"load average before the section: {load} on {NPROC} cores")
        self.rec("info", "oracle_bench", f"one pgbench client per member: -n -M prepared -T <{ORACLE_SECS} s + 3 s + "
                 f"1 s per 50 members> -c <members> -j {NPROC} -f oracle_member.sql -D k=<k> -D sess=bench, pgbench on the same "
                 f"cores; an oracle of its own, max_connections={most + 10}, tsoracle.max_members={most}, "
                 f"shared_buffers={osql.q('SHOW shared_buffers')}; per size, before the members, as many sessions' "
                 f"SELECT 1 (select1.sql), the members' statement on sessions no hello named (oracle_call.sql -D "
                 f"sess=none) and show_limit() (extfn.sql)")

        def procs(what):
            """The oracle's processes: CPU time of all (µs), Pss of the members' (oracle_procs.py)."""
            return subprocess.run([sys.executable, os.path.join(HERE, "oracle_procs.py"), opm, what],
                                  stdout=subprocess.PIPE, text=True).stdout.strip()

        def gone():
            """Wait until the previous point's sessions have ended (a hello for a member whose
            session lives is refused)."""
            for _ in range(100):
                if procs("pss") == "0 0":
                    return
                time.sleep(0.1)

        def failed(tag, m, out):
            with open(out, errors="replace") as f:
                err = next((ln.strip() for ln in f if re.search("error|abort|fatal", ln, re.I)), "")
            self.rec("fail", tag, m, 1, err)
            say(f"    {tag:16s}: FAILED ({err})")

        def pgbench(m, tag, *args):
            out = os.path.join(self.runs, tag + ".out")
            prefix = os.path.join(self.runs, "txlog." + tag)
            # Connections and hellos take about 1 s per 200 members on 2 idle cores, several
            # times that on busy ones: measured once every member has said hello on a live
            # session (or after `ramp` seconds), for half of BENCH_ORACLE_SECONDS.
            secs = ORACLE_SECS + m // 50 + 3
            cmd = [self.pgbench_exe, "-h", self.work, "-p", str(oport), "-U", "bench_member", "-n", "-M", "prepared",
                   "-T", str(secs), "-c", str(m), "-j", str(min(m, NPROC)), *args, "-l", f"--log-prefix={prefix}",
                   "postgres"]
            f = open(out, "w")
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
            f.close()
            self.procs.append(proc)
            return proc, out, prefix

        def finished(proc, out):
            rc = proc.wait()
            self.procs.remove(proc)
            with open(out, errors="replace") as f:
                return rc == 0 and re.search(r"^tps = ", f.read(), re.M) is not None

        for m in ORACLE_MEMBERS:
            ramp = m // 50 + 3
            # The baseline: as many sessions of the same role making prepared SELECT 1 round
            # trips, no hello: what any round trip to this server costs with m backends sharing
            # the cores (report.py: the rate after every client's first, as for the members).
            gone()
            tag = f"oracle.m{m}.select1"
            proc, out, prefix = pgbench(m, tag, "-f", os.path.join(HERE, "select1.sql"))
            if finished(proc, out):
                self.rec("oracle_base", m, prefix)
            else:
                failed(tag, m, out)
            # Two references: what PostgreSQL charges a statement for calling a function that
            # does nothing, tsoracle's or another extension's. The member's statement on sessions
            # no hello named: member_next answers NULL before doing anything (the statement's
            # parameters, the call, the check of the session); pg_trgm's show_limit().
            refs = [("call", ["-D", f"k={min(ORACLE_K)}", "-D", "sess=none", "-f",
                              os.path.join(HERE, "oracle_call.sql")])]
            if extfn:
                refs.append(("extfn", ["-f", os.path.join(HERE, "extfn.sql")]))
            for ref, args in refs:
                gone()
                tag = f"oracle.m{m}.{ref}"
                proc, out, prefix = pgbench(m, tag, *args)
                if finished(proc, out):
                    self.rec("oracle_ref", m, ref, prefix)
                else:
                    failed(tag, m, out)
            for k in ORACLE_K:
                gone()
                tag = f"oracle.m{m}.k{k}"
                proc, out, prefix = pgbench(m, tag, "-D", "hello=0", "-D", f"k={k}", "-D", f"ver={over}",
                                            "-D", "sess=bench", "-f", os.path.join(HERE, "oracle_member.sql"))
                for _ in range(ramp * 5):
                    time.sleep(0.2)
                    if osql.q("SELECT count(*) FROM tso_fleet_status() f JOIN pg_stat_activity a "
                              "ON a.pid = f.session_pid") == str(m):
                        break
                time.sleep(0.5)
                s0, t0 = time.time(), procs("cpu")
                time.sleep(max(0.0, s0 + (ORACLE_SECS + 1) // 2 - time.time()))
                s1, t1 = time.time(), procs("cpu")
                # Ticks of processes that ended are lost: no figure if the run ended before.
                alive = proc.poll() is None
                pss, backends = (procs("pss").split() + ["0", "0"])[:2]
                if not finished(proc, out):
                    failed(tag, m, out)
                    continue
                cores = f"{(int(t1) - int(t0)) / 1e6 / (s1 - s0):.3f}" if alive and t0 and t1 else "-1"
                self.rec("oracle", m, k, prefix, pss, backends, cores)
                say(f"    {tag:16s}: {backends} member backends, {pss} kB Pss, {cores} cores")
        self.pg_ctl(self.bin, odata, olog, "stop", "fast")

    # --- the run -----------------------------------------------------------------------------
    def run(self):
        self.setup()
        self.rec("info", "busy_before", self.busy_pct(3))
        for section in ("throughput", "resolved", "percall", "batch", "seq", "ceiling", "slot", "member",
                        "distance", "writes", "p99", "curve", "oracle"):
            if want(section):
                getattr(self, section)()
        self.check_server()
        self.status_rec("end")
        # A backend or the worker that died would show up here.
        crash = re.compile("PANIC|terminated by signal|was terminated|all server processes terminated")
        with open(self.log, errors="replace") as f:
            bad = [ln.strip() for ln in f if crash.search(ln)]
        self.rec("info", "server_log_problems", len(bad))
        for ln in bad[:5]:
            self.rec("info", "server_log", ln)
        say("")
        args = [sys.executable, os.path.join(HERE, "report.py"), self.res]
        if PLOT and CURVE_CLIENTS and want("curve"):
            args += ["--plot", PLOT]
        p = subprocess.run(args, stdout=subprocess.PIPE, text=True)
        if p.returncode != 0:
            raise Die(f"the report failed (results: {self.res}; BENCH_KEEP=1 keeps them)")
        sys.stdout.write(p.stdout)
        sys.stdout.flush()
        if os.environ.get("BENCH_REPORT"):
            with open(os.environ["BENCH_REPORT"], "w") as f:
                f.write(p.stdout)
            say(f"bench: report written to {os.environ['BENCH_REPORT']}")
        # Slowness never fails the benchmark; a crash or a failed run does.
        with open(self.res) as f:
            problems = sum(1 for ln in f if ln.startswith("fail\t"))
        if problems or bad:
            raise Die(f"{problems} failed run(s), {len(bad)} crash line(s) in the server log (see above)")

    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for bin_dir, data in reversed(self.datas):
            if os.path.exists(os.path.join(data, "postmaster.pid")):
                as_pg(os.path.join(bin_dir, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop",
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if self.work:
            if os.environ.get("BENCH_KEEP") == "1":
                say(f"bench: kept {self.work}")
            else:
                shutil.rmtree(self.work, ignore_errors=True)


def main():
    def interrupted(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    bench = Bench()
    try:
        bench.run()
    except Die as e:
        say(f"bench: {e}")
        return 1
    finally:
        bench.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
