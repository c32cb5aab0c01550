#!/usr/bin/env python3
"""Turn the results.tsv written by scripts/bench/bench.py (make bench) into the benchmark report.

Rows of results.tsv (tab-separated):
  info    KEY VALUE
  tps     WORKLOAD CLIENTS REP TPS
  ms      QUERY 1 REP MILLISECONDS           (per-call rows, psql \\timing)
  copy    WORKLOAD ROWS REP MILLISECONDS     (wall time of one COPY ... FROM STDIN through psql)
  lat     WORKLOAD CLIENTS REP LOG_PREFIX    (pgbench -l per-transaction logs)
  txns    WORKLOAD CLIENTS REP TRANSACTIONS  (pgbench's count, for the tso_seq group size)
  waits   WORKLOAD CLIENTS REP FILE          (sampled wait events: client backends, the worker)
  busy    WORKLOAD CLIENTS REP PERCENT       (machine CPU busy in the idle second after the run)
  status  LABEL JSON                         (a row of tso_status())
  fail    WORKLOAD CLIENTS REP MESSAGE

Figures are medians over the repetitions; a ratio is the median of the per-repetition
ratios (candidate run i / baseline run i, the two run back to back), not the ratio of the
medians, so a slow phase of a shared machine hits both sides of a ratio alike.

Usage: report.py RESULTS.TSV [--plot PNG]
  --plot PNG  also draw the scaling curve (throughput, p50 and p99 latency against the number of
              clients, tso_next() and SELECT 1) into PNG, with matplotlib.
Run it again on a results.tsv kept by BENCH_KEEP=1 to regenerate the report and the plot.
"""
import argparse
import collections
import glob
import json
import os
import statistics
import sys

info = collections.OrderedDict()
tps = collections.defaultdict(dict)      # (workload, clients) -> {rep: tps}
ms = collections.defaultdict(dict)       # query -> {rep: ms}
copy_ms = collections.defaultdict(dict)  # workload -> {rep: ms}
copy_rows = {}                           # workload -> rows per COPY
lat = collections.defaultdict(dict)      # (workload, clients) -> {rep: log prefix}
txns = collections.defaultdict(dict)     # (workload, clients) -> {rep: transactions}
busy = collections.defaultdict(dict)     # (workload, clients) -> {rep: CPU busy % just after the run}
waits = collections.defaultdict(list)    # (workload, clients) -> [files]
lags = collections.defaultdict(list)     # (workload, clients) -> [files of lag_ms samples]
status = {}
fails = []
member_rt = collections.defaultdict(dict)  # clients -> {rep: (round trips, values) during the run}
oracle_pts = []  # (members, k, log prefix, Pss kB of the member backends, backends, cores)
oracle_base = {}  # members -> log prefix of as many sessions' prepared SELECT 1 (the baseline)
oracle_ref = collections.defaultdict(dict)  # members -> reference ("call", "extfn") -> log prefix

ap = argparse.ArgumentParser(description="the tsoracle benchmark report")
ap.add_argument("results")
ap.add_argument("--plot", help="draw the scaling curve into this PNG")
args = ap.parse_args()

with open(args.results) as f:
    for line in f:
        parts = line.rstrip("\n").split("\t")
        kind = parts[0]
        if kind == "info":
            info.setdefault(parts[1], []).append(parts[2] if len(parts) > 2 else "")
        elif kind == "tps":
            tps[(parts[1], int(parts[2]))][int(parts[3])] = float(parts[4])
        elif kind == "txns":
            if len(parts) > 4 and parts[4].isdigit():
                txns[(parts[1], int(parts[2]))][int(parts[3])] = int(parts[4])
        elif kind == "busy":
            if len(parts) > 4 and parts[4].isdigit():
                busy[(parts[1], int(parts[2]))][int(parts[3])] = int(parts[4])
        elif kind == "ms":
            ms[parts[1]][int(parts[3])] = float(parts[4])
        elif kind == "copy":
            copy_ms[parts[1]][int(parts[3])] = float(parts[4])
            copy_rows[parts[1]] = int(parts[2])
        elif kind == "lat":
            lat[(parts[1], int(parts[2]))][int(parts[3])] = parts[4]
        elif kind == "waits":
            waits[(parts[1], int(parts[2]))].append(parts[4])
        elif kind == "lag":
            lags[(parts[1], int(parts[2]))].append(parts[4])
        elif kind == "status":
            try:
                status[parts[1]] = json.loads(parts[2])
            except (ValueError, IndexError):
                status[parts[1]] = {}
        elif kind == "fail":
            fails.append(parts[1:])
        elif kind == "oracle":
            try:
                oracle_pts.append((int(parts[1]), int(parts[2]), parts[3],
                                   int(parts[4]), int(parts[5]), float(parts[6])))
            except (ValueError, IndexError):
                pass
        elif kind == "oracle_ref":
            try:
                oracle_ref[int(parts[1])][parts[2]] = parts[3]
            except (ValueError, IndexError):
                pass
        elif kind == "oracle_base":
            try:
                oracle_base[int(parts[1])] = parts[2]
            except (ValueError, IndexError):
                pass
        elif kind == "member":
            try:
                b, a = [list(map(int, x.split())) for x in parts[3:5]]
                member_rt[int(parts[1])][int(parts[2])] = (a[0] - b[0], a[1] - b[1])
            except (ValueError, IndexError):
                pass


def first(key, default="?"):
    """The first value recorded for an info key."""
    return info.get(key, [default])[0]


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def paired_ratios(cand, base):
    """The per-repetition ratios cand[r] / base[r]."""
    return [cand[r] / base[r] for r in sorted(set(cand) & set(base)) if base[r]]


def paired_ratio(cand, base):
    """Median of per-repetition ratios cand[r] / base[r]."""
    return med(paired_ratios(cand, base))


def fmt_spread(cand, base):
    """The median ratio with its spread over the repetitions: "0.96 (0.91-0.99)"."""
    rs = paired_ratios(cand, base)
    if not rs:
        return "-"
    if len(rs) == 1:
        return f"{rs[0]:.2f}"
    return f"{med(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})"


def delta(before, after, col):
    a, b = status.get(after, {}), status.get(before, {})
    if a.get(col) is None or b.get(col) is None:
        return None
    return a[col] - b[col]


def percentiles(prefix, skip_first=False):
    """p50, p99, p99.9, max (ms) and count from pgbench -l logs (one file per thread).

    Columns: client, transaction, latency_us, script, epoch_s, epoch_us[, schedule_lag_us].
    Under -R the latency counts from the scheduled start: the lag is subtracted, so the
    figure is the time from sending the query to reading the reply (plus client overhead).
    """
    values = []
    for path in glob.glob(glob.escape(prefix) + ".*"):
        # pgbench names them PREFIX.PID (the first thread) and PREFIX.PID.N: nothing else.
        if not path[len(prefix) + 1:].replace(".", "").isdigit():
            continue
        with open(path) as f:
            for line in f:
                cols = line.split()
                if len(cols) >= 3 and cols[2].isdigit():
                    if skip_first and cols[1] == "1":
                        continue  # a client's first transaction (oracle_member.sql: its hello)
                    v = int(cols[2])
                    if len(cols) >= 7 and cols[6].lstrip("-").isdigit():
                        v -= int(cols[6])
                    values.append(v)
    if not values:
        return None
    values.sort()
    n = len(values)

    def pct(p):  # nearest rank
        return values[min(n - 1, max(0, int(-(-p * n // 100)) - 1))] / 1000.0

    return {"min": values[0] / 1000.0, "p50": pct(50), "p99": pct(99), "p999": pct(99.9),
            "max": values[-1] / 1000.0, "n": n}


def fmt_tps(v):
    return "-" if v is None else f"{v:,.0f} tps"


def fmt_ms(v):
    return "-" if v is None else f"{v:,.1f} ms"


def fmt_lat(v):
    return "-" if v is None else f"{v:.3f} ms"


def fmt_ratio(v):
    return "-" if v is None else f"{v:.2f}"


def verdict(ok):
    return "-" if ok is None else ("MET" if ok else "NOT MET")


NOISY_BUSY = 25      # % CPU used by others in the idle gap after a run
NOISY_SPREAD = 0.25  # max/min - 1 over the repetitions of one workload
noisy_rows = []


def noisy(*series, busy_keys=()):
    """Why the figures of a row are suspect, or None: a busy gap or a wide spread."""
    why = []
    worst = max((v for k in busy_keys for v in busy.get(k, {}).values()), default=0)
    if worst > NOISY_BUSY:
        why.append(f"other load up to {worst}% between runs")
    for runs in series:
        vals = [v for v in runs.values() if v]
        if len(vals) > 1 and max(vals) / min(vals) - 1 > NOISY_SPREAD:
            why.append(f"runs spread {100 * (max(vals) / min(vals) - 1):.0f}%")
            break
    return "; ".join(why) or None


def flag(row, why):
    if why:
        row[-1] = row[-1] + " *" if row[-1] != "-" else "*"
        noisy_rows.append((row[0], row[1], row[3], why))
    rows.append(row)


SECS = float(first("seconds", "0") or 0) or float("nan")
rows = []  # workload, clients, result, baseline, baseline result, ratio, target, verdict
clients_list = sorted({c for (w, c) in tps if w in ("tso_next", "select1", "nextval", "clock")})
seq_available = not first("tso_seq", "").startswith("not available")

# 1. tso_next() vs SELECT 1, and against nextval('s')
for c in clients_list:
    cand, base = tps.get(("tso_next", c), {}), tps.get(("select1", c), {})
    r = paired_ratio(cand, base)
    flag(["SELECT tso_next()", c, fmt_tps(med(cand.values())), "SELECT 1", fmt_tps(med(base.values())),
          fmt_ratio(r), ">= 0.95", verdict(None if r is None else r >= 0.95)],
         noisy(cand, base, busy_keys=[("tso_next", c), ("select1", c)]))
for c in clients_list:
    cand, nv = tps.get(("tso_next", c), {}), tps.get(("nextval", c), {})
    r = paired_ratio(cand, nv)
    rows.append(["SELECT tso_next()", c, fmt_tps(med(cand.values())), "SELECT nextval('s')",
                 fmt_tps(med(nv.values())), fmt_ratio(r), "report", "-"])
for c in clients_list:
    nv, base = tps.get(("nextval", c), {}), tps.get(("select1", c), {})
    r = paired_ratio(nv, base)
    rows.append(["SELECT nextval('s')", c, fmt_tps(med(nv.values())), "SELECT 1", fmt_tps(med(base.values())),
                 fmt_ratio(r), "report (~0.6)", "-"])
for c in clients_list:
    ck, base = tps.get(("clock", c), {}), tps.get(("select1", c), {})
    if ck:
        r = paired_ratio(ck, base)
        rows.append(["SELECT clock_timestamp()", c, fmt_tps(med(ck.values())), "SELECT 1",
                     fmt_tps(med(base.values())), fmt_ratio(r), "report", "-"])
    tn = tps.get(("tso_next", c), {})
    if ck and tn:
        r = paired_ratio(tn, ck)
        rows.append(["SELECT tso_next()", c, fmt_tps(med(tn.values())), "SELECT clock_timestamp()",
                     fmt_tps(med(ck.values())), fmt_ratio(r), "report", "-"])

# 2. per-call cost inside one backend
tso_q, clock_q, nv_q, empty_q = "tso_next", "clock", "nextval", "loop"
EXPR = {"tso_next": "count(tso_next())", "clock": "count(clock_timestamp())", "nextval": "count(nextval('s'))",
        "loop": "count(1)"}
if ms:
    r = paired_ratio(ms.get(tso_q, {}), ms.get(clock_q, {}))
    flag([f"per call: {EXPR[tso_q]} x {first('percall_n')}", 1, fmt_ms(med(ms.get(tso_q, {}).values())),
          EXPR[clock_q], fmt_ms(med(ms.get(clock_q, {}).values())), fmt_ratio(r), "<= 1.3",
          verdict(None if r is None else r <= 1.3)],
         noisy(ms.get(tso_q, {}), ms.get(clock_q, {}), busy_keys=[("percall", 1)]))
    r = paired_ratio(ms.get(tso_q, {}), ms.get(nv_q, {}))
    rows.append([f"per call: {EXPR[tso_q]} x {first('percall_n')}", 1, fmt_ms(med(ms.get(tso_q, {}).values())),
                 EXPR[nv_q], fmt_ms(med(ms.get(nv_q, {}).values())), fmt_ratio(r), "report", "-"])

# 3. tso_next_batch(1000)
batch = {k: v for k, v in tps.items() if k[0] == "tso_next_batch"}
for (w, c), runs in sorted(batch.items()):
    t = med(runs.values())
    tsps = None if t is None else t * 1000
    flag(["SELECT tso_next_batch(1000)", c, "-" if tsps is None else f"{tsps / 1e6:,.1f} M ts/s", "-", "-", "-",
          ">= 10 M ts/s", verdict(None if tsps is None else tsps >= 1e7)],
         noisy(runs, busy_keys=[(w, c)]))

# 4. tso_seq('k', 100)
if not seq_available:
    rows.append(["SELECT tso_seq('k', 100)", "-", "tso_seq: not available", "counter table", "-", "-", ">= 10", "-"])
else:
    seq_clients = sorted({c for (w, c) in tps if w in ("tso_seq", "counter", "nextval100")})
    for c in seq_clients:
        cand, ctr, nv = tps.get(("tso_seq", c), {}), tps.get(("counter", c), {}), tps.get(("nextval100", c), {})
        r = paired_ratio(cand, ctr)
        flag(["SELECT tso_seq('k', 100)", c, fmt_tps(med(cand.values())), "counter UPDATE ... RETURNING",
              fmt_tps(med(ctr.values())), fmt_ratio(r), ">= 10", verdict(None if r is None else r >= 10)],
             noisy(cand, ctr, busy_keys=[("tso_seq", c), ("counter", c)]))
        r = paired_ratio(cand, nv)
        rows.append(["SELECT tso_seq('k', 100)", c, fmt_tps(med(cand.values())), "nextval('s100')",
                     fmt_tps(med(nv.values())), fmt_ratio(r), "report", "-"])

# One row of tps / tps (target None: reported only).
def tps_row(label, cw, blabel, bw, c, target=None):
    cand, base = tps.get((cw, c), {}), tps.get((bw, c), {})
    if not cand and not base:
        return
    r = paired_ratio(cand, base)
    row = [label, c, fmt_tps(med(cand.values())), blabel, fmt_tps(med(base.values())), fmt_spread(cand, base)]
    if target is None:
        rows.append(row + ["report", "-"])
    else:
        flag(row + [f">= {target:.2f}", verdict(None if r is None else r >= target)],
             noisy(cand, base, busy_keys=[(cw, c), (bw, c)]))


# 1'. tso_next() against a built-in trivial function; what later transactions of a session
# that once called tsoracle pay.
for c in clients_list:
    tps_row("SELECT tso_next()", "tso_next", "SELECT pg_backend_pid()", "pid", c, 0.97)
for c in clients_list:
    tps_row("SELECT show_limit() (pg_trgm: a trivial C function of an extension)", "extfn",
            "SELECT 1", "select1", c)
    tps_row("SELECT tso_next()", "tso_next", "SELECT show_limit()", "extfn", c)
for c in clients_list:
    tps_row("SELECT 1, after one tso_next() in the session", "after_tso_next",
            "SELECT 1, after one clock_timestamp()", "after_clock", c, 0.99)

# 4b. tso_seq against the durable-commit ceiling (one-row INSERT commits)
for c in sorted({c for (w, c) in tps if w == "ceil_tso_seq"}):
    tps_row("SELECT tso_seq('k', 100)", "ceil_tso_seq", "one-row INSERT commits", "ceil_ins_commit", c, 0.90)
for c in sorted({c for (w, c) in tps if w == "ceil_tso_seq_keys"}):
    tps_row("SELECT tso_seq('k' || random(1, 8), 100)", "ceil_tso_seq_keys", "one-row INSERT commits",
            "ceil_ins_commit", c, 0.90)
# 4b'. with a logical slot present (every advance is then a row version, through the worker's
# group commit: docs/group-commit.md; at wal_level = logical, slot or not: docs/operations/in-place.md)
slot_plugin = first("slot_plugin", "test_decoding")
for c in sorted({c for (w, c) in tps if w == "slot_tso_seq"}):
    tps_row(f"SELECT tso_seq('k', 100), {slot_plugin} slot", "slot_tso_seq", "one-row INSERT commits",
            "slot_ins_commit", c, 0.90)
for c in sorted({c for (w, c) in tps if w == "slot_tso_next"}):
    tps_row(f"SELECT tso_next(), {slot_plugin} slot", "slot_tso_next", "SELECT 1", "slot_select1", c)
for c in sorted({c for (w, c) in lat if w == "ceil_tso_seq"}):
    # Each per-transaction log read once; p50 and p99 from the same figures.
    stats = {w: {rep: v for rep, pre in lat.get((w, c), {}).items() if (v := percentiles(pre))}
             for w in ("ceil_tso_seq", "ceil_ins_commit")}
    for p in ("p50", "p99"):
        cand = {rep: v[p] for rep, v in stats["ceil_tso_seq"].items()}
        base = {rep: v[p] for rep, v in stats["ceil_ins_commit"].items()}
        r = paired_ratio(cand, base)
        flag([f"{p} latency, SELECT tso_seq('k', 100)", c, fmt_lat(med(cand.values())),
              f"{p} of a one-row INSERT commit", fmt_lat(med(base.values())), fmt_spread(cand, base), "<= 1.15",
              verdict(None if r is None else r <= 1.15)],
             noisy(busy_keys=[("ceil_tso_seq", c), ("ceil_ins_commit", c)]))

# 4c. a member of a fleet: tso_next() there against its SELECT 1 and the oracle's tso_next()
for c in sorted({c for (w, c) in tps if w == "mem_tso_next"}):
    tps_row("member SELECT tso_next()", "mem_tso_next", "member SELECT 1", "mem_select1", c)
    tps_row("member SELECT tso_next()", "mem_tso_next", "oracle SELECT tso_next()", "orc_tso_next", c)
    per = [v / t for (t, v) in member_rt.get(c, {}).values() if t > 0]
    if per:
        rows.append(["values per round trip, member tso_next()", c, f"{med(per):.1f}", "-", "-", "-",
                     "report", "-"])
if ("mem_tso_next", 1) in lat:
    stats = {w: {rep: v for rep, pre in lat.get((w, 1), {}).items() if (v := percentiles(pre))}
             for w in ("mem_tso_next", "mem_select1", "orc_select1")}
    for p in ("p50", "p99"):
        cand = {rep: v[p] for rep, v in stats["mem_tso_next"].items()}
        base = {rep: v[p] + stats["orc_select1"][rep][p] for rep, v in stats["mem_select1"].items()
                if rep in stats["orc_select1"]}
        r = paired_ratio(cand, base)
        target = "<= 1.50" if p == "p50" else "report"
        flag([f"{p} latency, member SELECT tso_next()", 1, fmt_lat(med(cand.values())),
              f"{p} of member SELECT 1 + oracle SELECT 1", fmt_lat(med(base.values())), fmt_spread(cand, base),
              target, verdict(None if r is None or p != "p50" else r <= 1.50)],
             noisy(busy_keys=[("mem_tso_next", 1), ("mem_select1", 1)]))

for c in sorted({c for (w, c) in tps if w == "mem_ins_tso"}):
    tps_row("member INSERT, ts DEFAULT tso_next()", "mem_ins_tso", "member ts DEFAULT clock_timestamp()",
            "mem_ins_clock", c, 0.85)
for c in sorted({c for (w, c) in tps if w == "mem_ins_floor"}):
    # BENCH_FLOOR_SO: a second member, built with handoff-floor, its INSERTs interleaved.
    tps_row("member INSERT, ts DEFAULT tso_next()", "mem_ins_tso", "the same on the hand-off floor's member",
            "mem_ins_floor", c, 0.90)
    tps_row("hand-off floor's member INSERT", "mem_ins_floor", "member ts DEFAULT clock_timestamp()",
            "mem_ins_clock", c)

# 4d. a member a network away: one-row INSERTs through a link of RTT ms against the distance
# floor c / (c / tps_0 + RTT), tps_0 the same member through the same link with no delay in
# the same repetition (the rate if distance cost each statement one round trip and nothing
# else); tps_0 against DEFAULT clock_timestamp(); one client's added p50 against the RTT.
far_rtts = sorted({float(w[len("far_ins_rtt"):]) for (w, c) in tps if w.startswith("far_ins_rtt")})
for c in sorted({c for (w, c) in tps if w.startswith("far_ins_rtt")}):
    tps0 = tps.get(("far_ins_rtt0", c), {})
    for rtt in far_rtts:
        if rtt == 0:
            continue
        cand = tps.get((f"far_ins_rtt{rtt:g}", c), {})
        floor = {rep: c / (c / t0 + rtt / 1000.0) for rep, t0 in tps0.items() if t0}
        r = paired_ratio(cand, floor)
        row = [f"member INSERT, ts DEFAULT tso_next(), {rtt:g} ms RTT", c, fmt_tps(med(cand.values())),
               f"distance floor c / (c / tps_0 + {rtt:g} ms)", fmt_tps(med(floor.values())), fmt_spread(cand, floor)]
        if c < 8:
            rows.append(row + ["report", "-"])
        else:
            flag(row + [">= 0.90", verdict(None if r is None else r >= 0.90)],
                 noisy(cand, tps0, busy_keys=[(f"far_ins_rtt{rtt:g}", c), ("far_ins_rtt0", c)]))
    tps_row("member INSERT, ts DEFAULT tso_next(), through the link at 0 ms (tps_0)", "far_ins_rtt0",
            "member ts DEFAULT clock_timestamp()", "far_ins_clock", c)
def added_p50(prefix):
    """One client's p50 at each RTT beyond its p50 at 0 ms, per repetition: {rtt: {rep: ms}}."""
    p50 = {float(w[len(prefix):]): {rep: v["p50"] for rep, pre in reps.items() if (v := percentiles(pre))}
           for (w, c), reps in lat.items() if w.startswith(prefix) and c == 1}
    return {rtt: {rep: v - p50[0.0][rep] for rep, v in p50[rtt].items() if rep in p50[0.0]}
            for rtt in p50 if rtt != 0 and 0.0 in p50}


# The member's added p50 against the link's own round trip (one client's SELECT 1 on the
# oracle through the same link, in the same repetition: the round trip a client of that
# network pays, which is the link's delay plus its threads' sleeps and wake-ups), and, for
# the record, against the RTT the link was set to.
far_added, link_added = added_p50("far_lat_rtt"), added_p50("link_lat_rtt")
for rtt in sorted(far_added):
    added = far_added[rtt]
    link = link_added.get(rtt, {})
    r = paired_ratio(added, link)
    flag([f"one client's added p50, member SELECT tso_next(), {rtt:g} ms RTT", 1, fmt_lat(med(added.values())),
          "the link's round trip (oracle SELECT 1 through it; p50 at 0 ms taken off from both)",
          fmt_lat(med(link.values())), fmt_spread(added, link), "<= 1.10",
          verdict(None if r is None else r <= 1.10)],
         noisy(busy_keys=[(f"far_lat_rtt{rtt:g}", 1), ("far_lat_rtt0", 1), (f"link_lat_rtt{rtt:g}", 1),
                         ("link_lat_rtt0", 1)]))
    nominal = {rep: rtt for rep in added}
    rows.append([f"one client's added p50, member SELECT tso_next(), {rtt:g} ms RTT", 1,
                 fmt_lat(med(added.values())), "the RTT the link is set to", fmt_lat(rtt),
                 fmt_spread(added, nominal), "report", "-"])


def copy_rate(wl):
    """rows/s of each COPY run of a workload: {rep: rows per second}."""
    n = copy_rows.get(wl)
    return {rep: n / (v / 1000.0) for rep, v in copy_ms.get(wl, {}).items() if n and v}


def fmt_rows(v):
    return "-" if v is None else f"{v:,.0f} rows/s"


for what, cw, bw in (("COPY", "mem_copy_tso", "mem_copy_clock"),
                     ("INSERT ... SELECT", "mem_insel_tso", "mem_insel_clock")):
    cand, base = copy_rate(cw), copy_rate(bw)
    if cand or base:
        r = paired_ratio(cand, base)
        flag([f"member {what} {copy_rows.get(cw, 0):,} rows, ts DEFAULT tso_next()", 1,
              fmt_rows(med(cand.values())), "member ts DEFAULT clock_timestamp()", fmt_rows(med(base.values())),
              fmt_ratio(r), ">= 0.50", verdict(None if r is None else r >= 0.50)],
             noisy(cand, base, busy_keys=[(cw, 1), (bw, 1)]))

# 5. p99 latency across window extensions
p99 = {}
for (w, c), reps in sorted(lat.items()):
    for rep, prefix in reps.items():
        p99[(w, c, rep)] = percentiles(prefix)
ext_runs = []
for shape, prefix, label in (("closed", "p99_", "closed loop"), ("open", "p99r_", f"open loop, -R {first('p99_rate')}")):
    cs = sorted({c for (w, c) in lat if w.startswith(prefix)})
    for c in cs:
        cand = {rep: p["p99"] for (w, cc, rep), p in p99.items() if w == prefix + "tso_next" and cc == c and p}
        base = {rep: p["p99"] for (w, cc, rep), p in p99.items() if w == prefix + "select1" and cc == c and p}
        r = paired_ratio(cand, base)
        flag([f"p99 latency, SELECT tso_next() ({label})", c, fmt_lat(med(cand.values())),
              "p99 of SELECT 1", fmt_lat(med(base.values())), fmt_ratio(r), "<= 1.2",
              verdict(None if r is None else r <= 1.2)],
             noisy(busy_keys=[(prefix + "tso_next", c), (prefix + "select1", c)]))
        for rep in sorted(cand):
            ext_runs.append(delta(f"before.{prefix}tso_next.r{rep}", f"after.{prefix}tso_next.r{rep}",
                                  "window_extensions"))
if ext_runs:
    known = [e for e in ext_runs if e is not None]
    least = min(known) if known else None
    rows.append([f"window extensions per p99 tso_next() run (window_ahead_ms={first('p99_window')})",
                 "-", "-" if least is None else f"min {least}",
                 "-", "-", "-", ">= 5", verdict(None if least is None else least >= 5)])

# 6. the write paths users run: INSERT with a default, UPDATE of a version stamp, COPY
for c in sorted({c for (w, c) in tps if w == "res_resolved"}):
    tps_row("SELECT tso_resolved()", "res_resolved", "SELECT 1", "res_select1", c)

write_clients = sorted({c for (w, c) in tps if w.startswith(("ins_", "upd_"))})
for c in write_clients:
    tps_row("INSERT, ts DEFAULT tso_next()", "ins_tso", "ts DEFAULT clock_timestamp()", "ins_clock", c, 0.95)
for c in write_clients:
    tps_row("INSERT, ts DEFAULT tso_next()", "ins_tso", "ts DEFAULT nextval('s_ts')", "ins_seq", c)
for c in write_clients:
    tps_row("INSERT, id uuid DEFAULT tso_next_uuid()", "ins_uuid", "id DEFAULT gen_random_uuid()", "ins_rand", c, 0.95)
for c in write_clients if any(w == "ins_uuidv7" for (w, _) in tps) else []:
    tps_row("INSERT, id uuid DEFAULT tso_next_uuid()", "ins_uuid", "id DEFAULT uuidv7() (PostgreSQL 18)", "ins_uuidv7", c, 0.95)
for (wl, c), files in sorted(lags.items()):
    samples = []
    for f in files:
        try:
            with open(f) as fh:
                samples += [int(line) for line in (l.strip() for l in fh) if line.lstrip("-").isdigit()]
        except OSError:
            pass
    if samples:
        samples.sort()
        lag_p50 = samples[len(samples) // 2]
        lag_p99 = samples[min(len(samples) - 1, (len(samples) * 99) // 100)]
        rows.append(["lag of tso_resolved() behind the last issued, INSERT DEFAULT tso_next()", c,
                     f"p50 {lag_p50} ms, p99 {lag_p99} ms", f"{len(samples)} samples", "-", "-", "report", "-"])
for c in write_clients:
    tps_row("UPDATE SET version = tso_next()", "upd_tso", "version = clock_timestamp()", "upd_clock", c, 0.95)
for c in write_clients:
    tps_row("UPDATE SET version = tso_next()", "upd_tso", "version = version + 1", "upd_inc", c)


if "copy_tso" in copy_ms:
    n_rows = copy_rows["copy_tso"]
    cand = copy_rate("copy_tso")
    for bw, blabel, target in (("copy_clock", "ts DEFAULT clock_timestamp()", 0.95),
                               ("copy_seq", "ts DEFAULT nextval('s_ts')", None)):
        base = copy_rate(bw)
        r = paired_ratio(cand, base)
        row = [f"COPY {n_rows:,} rows, ts DEFAULT tso_next()", 1, fmt_rows(med(cand.values())), blabel,
               fmt_rows(med(base.values())), fmt_ratio(r)]
        if target is None:
            rows.append(row + ["report", "-"])
        else:
            flag(row + [f">= {target:.2f}", verdict(None if r is None else r >= target)],
                 noisy(cand, base, busy_keys=[("copy_tso", 1), (bw, 1)]))

# 7. the scaling curve: SELECT 1 and tso_next() from 1 to 256 clients (closed loop)
curve = {}   # (workload, clients) -> {"tps", "p50", "p99", "ratio", "busy"}
for (wl, c) in sorted({(w[len("curve_"):], c) for (w, c) in tps if w.startswith("curve_")}):
    runs = tps.get(("curve_" + wl, c), {})
    pcts = {rep: p for (w, cc, rep), p in p99.items() if w == "curve_" + wl and cc == c and p}
    curve[(wl, c)] = {
        "tps": med(runs.values()),
        "p50": med([p["p50"] for p in pcts.values()]),
        "p99": med([p["p99"] for p in pcts.values()]),
        "n": sum(p["n"] for p in pcts.values()),
        "busy": max(busy.get(("curve_" + wl, c), {}).values(), default=None),
        # seconds actually measured after connecting (pgbench's -T counts connecting too)
        "window": min((txns.get(("curve_" + wl, c), {}).get(rep, 0) / t for rep, t in runs.items() if t),
                      default=None),
    }
curve_clients = sorted({c for (_, c) in curve})

# ---------------------------------------------------------------------------------------------
out = []
w = out.append
title = f"tsoracle benchmark on PostgreSQL {first('server_version')}"
w(title)
w("=" * len(title))
w(f"machine : {first('cpus')} CPUs ({first('cpu_model')}), {first('memory')}, Linux {first('kernel')}")
w(f"server  : {first('server')}")
w(f"          from {first('pg_bin')}")
w(f"tsoracle: {first('extension')}")
w(f"load    : the machine was {first('busy_before')}% busy (other processes) in the 3 s before the run")
gaps = [v for runs in busy.values() for v in runs.values()]
if gaps:
    gaps.sort()
    p90 = gaps[min(len(gaps) - 1, int(0.9 * len(gaps)))]
    w(f"noise   : foreign CPU (the machine's busy time minus this run's clusters') in the 1 s gap after each run: "
      f"median {statistics.median(gaps):.0f}%, 90th percentile {p90}%, max {gaps[-1]}% "
      f"({len(gaps)} gaps, {sum(1 for g in gaps if g > NOISY_BUSY)} above {NOISY_BUSY}%)")
w(f"settings: {first('settings')}")
w(f"pgbench : {first('pgbench')}")
w(f"          {first('bench')}")
w(f"scripts : {first('scripts').strip()}")
w(f"per call: psql \\timing of SELECT count(f()) FROM generate_series(1, {first('percall_n')}) in one session, "
  f"{first('percall_reps')} repetitions, order rotated")
if copy_ms:
    w(f"copy    : COPY t_<x> (v) FROM STDIN of {first('copy_rows')} rows through psql, wall time; "
      f"{first('copy_reps')} repetitions, order rotated; TRUNCATE + CHECKPOINT before each")
if write_clients:
    w(f"writes  : INSERT and UPDATE runs as above, -D rows={first('update_rows')}; TRUNCATE (INSERT) or VACUUM "
      "(UPDATE) + CHECKPOINT before each run")
if curve:
    w(f"curve   : {first('curve')}")
if "distance" in info:
    w(f"distance: {first('distance')}; the far member's proxy connected {first('distance_connects')} time(s)")
w("")

headers = ["workload", "clients", "result", "baseline", "baseline result", "ratio", "target", "verdict"]
cells = [[str(x) for x in row] for row in rows]
widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
w("| " + " | ".join(h.ljust(widths[i]) for i, h in enumerate(headers)) + " |")
w("|" + "|".join("-" * (widths[i] + 2) for i in range(len(headers))) + "|")
for r in cells:
    w("| " + " | ".join(r[i].ljust(widths[i]) for i in range(len(headers))) + " |")
w("")
if noisy_rows:
    w(f"* suspect figures (other tenants of the machine: CPU busy > {NOISY_BUSY}% in the 1 s gap after a run,")
    w(f"  or runs of one workload more than {100 * NOISY_SPREAD:.0f}% apart); rerun on a quieter machine:")
    for name, c, base, why in noisy_rows:
        w(f"    {name} (c={c}) vs {base}: {why}")
    w("")
w("ratio = median over the repetitions of (candidate run / baseline run), the two run back to back;")
w("in brackets beside a ratio: the lowest and highest of those per-repetition ratios.")
w("result and baseline result = medians of the runs. For latencies and per-call times lower is better.")
w("")

# Oracle counters
w("oracle counters (tso_status() deltas)")
for label, (a, b) in [("whole run", ("start", "end")), ("p99 phase", ("p99_start", "p99_end"))]:
    ext, com = delta(a, b, "window_extensions"), delta(a, b, "worker_commits")
    iss = delta(a, b, "timestamps_issued")
    w(f"  {label:10s}: window_extensions {ext}, worker_commits {com}, timestamps_issued {iss}")
if ext_runs:
    w(f"  window extensions in each p99 tso_next() run (closed loop runs, then open loop runs): {ext_runs}")
end = status.get("end", {})
if seq_available:
    req = com = 0
    have = "grouped_requests" in end and "group_commits" in end
    for label in status:
        if label.startswith("seq_before."):
            after = "seq_after." + label[len("seq_before."):]
            dr, dc = delta(label, after, "grouped_requests"), delta(label, after, "group_commits")
            req += dr or 0
            com += dc or 0
    if have:
        w(f"  tso_seq runs: grouped_requests {req}, group_commits {com}, mean group size "
          f"{(req / com) if com else float('nan'):.1f} requests per commit")
    else:
        w("  tso_seq runs: tso_status() has no grouped_requests/group_commits columns; derived instead:")
    # Also derived from pgbench's transaction counts and the worker's commits that were not
    # window extensions, per client count.
    for (wl, c), runs in sorted(txns.items()):
        if wl != "tso_seq":
            continue
        calls = commits = 0
        for rep, n in runs.items():
            dc = delta(f"seq_before.c{c}.r{rep}", f"seq_after.c{c}.r{rep}", "worker_commits")
            de = delta(f"seq_before.c{c}.r{rep}", f"seq_after.c{c}.r{rep}", "window_extensions")
            if dc is not None and de is not None:
                calls += n
                commits += dc - de
        if commits:
            w(f"    c={c:<3d}: {calls} tso_seq calls, {commits} worker commits other than window extensions: "
              f"mean group size ~{calls / commits:.1f} calls per commit ({commits / (len(runs) * SECS):,.0f} commits/s)")
else:
    w(f"  tso_seq: not available ({first('tso_seq')})")
w("")

# the scaling curve
if curve:
    w("scaling curve (closed loop, latency scripts; median over the repetitions; latency from the sampled")
    w("per-transaction logs, in ms; ratio = tso_next() tps / SELECT 1 tps, paired as above)")
    w("")
    CURVE_SECS = float(first("curve_seconds", "0") or 0)
    curve_short = []
    hdr = ["clients", "SELECT 1 tps", "p50", "p99", "tso_next() tps", "p50", "p99", "ratio"]
    body = []
    for c in curve_clients:
        a, b = curve.get(("select1", c), {}), curve.get(("tso_next", c), {})
        r = paired_ratio(tps.get(("curve_tso_next", c), {}), tps.get(("curve_select1", c), {}))
        suspect = max([x for x in (a.get("busy"), b.get("busy")) if x is not None], default=0) > NOISY_BUSY
        short = [x for x in (a.get("window"), b.get("window")) if x is not None and x < 0.8 * CURVE_SECS]
        if short:
            curve_short.append((c, min(short)))
        body.append([str(c), fmt_tps(a.get("tps")).replace(" tps", ""), fmt_lat(a.get("p50")), fmt_lat(a.get("p99")),
                     fmt_tps(b.get("tps")).replace(" tps", ""), fmt_lat(b.get("p50")), fmt_lat(b.get("p99")),
                     fmt_ratio(r) + (" *" if suspect else "")])
    cw = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(hdr)]
    w("| " + " | ".join(h.ljust(cw[i]) for i, h in enumerate(hdr)) + " |")
    w("|" + "|".join("-" * (cw[i] + 1) + ":" for i in range(len(hdr))) + "|")
    for r in body:
        w("| " + " | ".join(r[i].rjust(cw[i]) for i in range(len(hdr))) + " |")
    w("")
    if any(r[-1].endswith("*") for r in body):
        w(f"* more than {NOISY_BUSY}% foreign CPU in a gap next to one of the runs of that row")
        w("")
    for c, x in curve_short:
        w(f"! c={c}: a run measured only {x:.1f} s after its clients had connected (intended {CURVE_SECS:.0f} s): "
          "connecting ate into its -T; its figures are suspect")
    if curve_short:
        w("")

# p99 detail
if p99:
    w("latency detail (per-transaction logs; ms; p99_ = closed loop, p99r_ = open loop)")
    for (wl, c, rep), p in sorted(p99.items()):
        if p and not wl.startswith("curve_"):
            w(f"  {wl:14s} c={c:<3d} rep {rep}: min {p['min']:.3f}  p50 {p['p50']:.3f}  p99 {p['p99']:.3f}  p99.9 {p['p999']:.3f}  "
              f"max {p['max']:.3f}  ({p['n']} transactions)")
    w("")

# raw runs
w("all runs (tps; per-call in ms; [CPU busy % of the machine in the 1 s gap after the run])")
for (wl, c), runs in sorted(tps.items()):
    if wl == "warmup":
        continue
    b = busy.get((wl, c), {})
    w(f"  {wl:16s} c={c:<3d}: " + "  ".join(f"{runs[r]:,.0f}" + (f" [{b[r]}%]" if r in b else "")
                                            for r in sorted(runs)))
for q, runs in sorted(ms.items()):
    w(f"  {EXPR.get(q, q):28s}: " + "  ".join(f"{runs[r]:,.1f}" for r in sorted(runs)))
for wl, runs in sorted(copy_ms.items()):
    b = busy.get((wl, 1), {})
    w(f"  {wl + ' (ms)':28s}: " + "  ".join(f"{runs[r]:,.0f}" + (f" [{b[r]}%]" if r in b else "")
                                           for r in sorted(runs)))
if ms.get(empty_q):
    base = med(ms[empty_q].values())
    n = int(first("percall_n", "0")) or None
    w(f"  net per-call cost (median minus the {EXPR[empty_q]} loop):")
    for q in (clock_q, nv_q, tso_q):
        m = med(ms.get(q, {}).values())
        if m is not None:
            per = f", {(m - base) * 1e6 / n:,.0f} ns per call" if n else ""
            w(f"    {EXPR[q]:28s}: {m - base:,.1f} ms net{per}")
w("")

# the oracle serving simulated members
def rate_col(v, width):
    """A rate in a column of `width`, or ? for none."""
    return f"{v:{width},.0f}" if v else "?".rjust(width)


def steady_rate(prefix):
    """Round trips per second once every client has said hello: the transactions that ended
    after the last client's first one (its hello), over that span, from pgbench -l logs."""
    firsts, ends = [], []
    for path in glob.glob(glob.escape(prefix) + ".*"):
        if not path[len(prefix) + 1:].replace(".", "").isdigit():
            continue
        with open(path) as f:
            for line in f:
                cols = line.split()
                if len(cols) >= 6 and cols[1].isdigit() and cols[4].isdigit():
                    t = int(cols[4]) + int(cols[5]) / 1e6
                    (firsts if cols[1] == "1" else ends).append(t)
    if not firsts or not ends:
        return None
    start = max(firsts)
    after = [t for t in ends if t > start]
    if len(after) < 2 or max(after) <= start:
        return None
    return len(after) / (max(after) - start)


if oracle_pts:
    w("an oracle serving simulated members (one pgbench client each: a hello, then tsoracle.member_next(k, session) round trips)")
    w(f"  {'members':>7s} {'k':>3s} {'round trips/s':>14s} {'values/s':>12s} {'p50':>9s} {'p99':>9s} "
      f"{'backends':>8s} {'their Pss':>10s} {'per member':>10s} {'oracle cores':>12s} "
      f"{'SELECT 1/s':>11s} {'ratio':>6s}")
    # Each run's logs read once: the references' table below uses the same rates.
    base_rate = {m: steady_rate(prefix) for m, prefix in oracle_base.items()}
    point_rate = {(m, k): steady_rate(prefix) for m, k, prefix, *_ in oracle_pts}
    for m, k, prefix, pss, backends, cores in sorted(oracle_pts):
        p = percentiles(prefix, skip_first=True) or {}
        rate = point_rate[(m, k)]
        base = base_rate.get(m)
        per = f"{pss / backends / 1024:.1f} MiB" if backends else "?"
        rt = f"{rate:14,.0f}" if rate else f"{'?':>14s}"
        vals = f"{rate * k:12,.0f}" if rate else f"{'?':>12s}"
        b = f"{base:11,.0f}" if base else f"{'?':>11s}"
        ratio = fmt_ratio(rate / base if rate and base else None)
        w(f"  {m:7d} {k:3d} {rt} {vals} {fmt_lat(p.get('p50')):>9s} {fmt_lat(p.get('p99')):>9s} "
          f"{backends:8d} {pss / 1024:6.0f} MiB {per:>10s} {(f'{cores:.2f}' if cores >= 0 else '?'):>12s} "
          f"{b} {ratio:>6s}")
    w("  SELECT 1/s: as many sessions of the same role making prepared SELECT 1 round trips on the")
    w("  oracle, in the same run; ratio: round trips/s against it (k values per round trip, so")
    w("  SELECT 1/s x k is what values/s at k would be if a round trip cost no more than SELECT 1)")
    if oracle_ref:
        w("  what a statement calling a function that does nothing reaches, as many sessions, in the same run:")
        w(f"  {'members':>7s} {'SELECT 1/s':>11s} {'call/s':>11s} {'ratio':>6s} {'show_limit()/s':>14s} {'ratio':>6s}   "
          f"member_next against the call, by k")
        for m in sorted(oracle_ref):
            base = base_rate.get(m)
            call = steady_rate(oracle_ref[m]["call"]) if "call" in oracle_ref[m] else None
            ext = steady_rate(oracle_ref[m]["extfn"]) if "extfn" in oracle_ref[m] else None
            against = " ".join(f"k={k}: {fmt_ratio(r / call if r and call else None)}"
                               for (mm, k), r in sorted(point_rate.items()) if mm == m)
            w(f"  {m:7d} {rate_col(base, 11)} {rate_col(call, 11)} "
              f"{fmt_ratio(call / base if call and base else None):>6s} {rate_col(ext, 14)} "
              f"{fmt_ratio(ext / base if ext and base else None):>6s}   {against}")
        w("  call: the member's statement, tsoracle.member_next($1, $2), on sessions no hello named: it")
        w("  answers NULL having done nothing (its parameters, PostgreSQL's call, the session's check);")
        w("  show_limit(): pg_trgm's, a C function of another extension that returns a setting")
        if "oracle_extfn" in info:
            w("  " + first("oracle_extfn"))
    w("  " + first("oracle_bench"))
    w("  " + first("oracle_load"))
    w("")

# wait events
if waits:
    w("wait events, sampled every 0.25 s: active client backends, and the tsoracle worker (CPU = not waiting)")
    for (wl, c), files in sorted(waits.items()):
        if wl == "warmup":
            continue
        clients, worker = collections.Counter(), collections.Counter()
        for path in files:
            if os.path.exists(path):
                with open(path) as f:
                    for x in f:
                        x = x.strip()
                        if x.startswith("worker "):
                            worker[x[len("worker "):]] += 1
                        elif x:
                            clients[x] += 1
        for who, counter in (("clients", clients), ("worker", worker)):
            total = sum(counter.values())
            if total:
                top = ", ".join(f"{k} {100.0 * v / total:.0f}%" for k, v in counter.most_common(4))
                w(f"  {wl:16s} c={c:<3d} {who:7s}: {top}  ({total} samples)")
    w("")

if fails:
    w("FAILED runs:")
    for f in fails:
        w("  " + " ".join(f))
    w("")
problems = first("server_log_problems", "0")
if problems not in ("0", "?"):
    w(f"server log: {problems} FATAL/PANIC/termination lines, e.g.: " + "; ".join(info.get("server_log", [])))

print("\n".join(out))


def draw_curve(path):
    """Throughput and p50/p99 latency against clients, both workloads, into the PNG at path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8), dpi=100)
    styles = {"select1": ("SELECT 1", "tab:gray", "s"), "tso_next": ("SELECT tso_next()", "tab:blue", "o")}
    for wl, (label, color, marker) in styles.items():
        cs = [c for c in curve_clients if curve.get((wl, c), {}).get("tps") is not None]
        ax1.plot(cs, [curve[(wl, c)]["tps"] / 1000.0 for c in cs], marker=marker, color=color, label=label)
        cs = [c for c in curve_clients if curve.get((wl, c), {}).get("p50") is not None]
        ax2.plot(cs, [curve[(wl, c)]["p50"] for c in cs], marker=marker, color=color, label=f"{label}, p50")
        ax2.plot(cs, [curve[(wl, c)]["p99"] for c in cs], marker=marker, color=color, linestyle="--",
                 label=f"{label}, p99")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(curve_clients)
        ax.set_xticklabels([str(c) for c in curve_clients])
        ax.set_xlabel("clients (pgbench, closed loop)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax1.set_ylabel("throughput (thousand transactions/s)")
    ax1.set_ylim(bottom=0)
    ax1.set_title("throughput")
    ax2.set_yscale("log")
    ax2.set_ylabel("latency (ms, log scale)")
    ax2.set_title("latency: p50 (solid), p99 (dashed)")
    fig.suptitle(f"tsoracle: SELECT tso_next() and SELECT 1 against the number of clients\n"
                 f"PostgreSQL {first('server_version').split()[0]}, {first('cpus')} CPUs ({first('cpu_model')}), "
                 f"pgbench -M prepared, {first('curve_seconds')} s runs, median of {first('curve_reps')}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if args.plot:
    if not curve:
        print(f"report: no scaling-curve runs in {args.results}: {args.plot} not drawn", file=sys.stderr)
    else:
        tmp = args.plot + ".tmp.png"
        draw_curve(tmp)
        os.replace(tmp, args.plot)
        print(f"report: scaling curve drawn into {args.plot}", file=sys.stderr)
