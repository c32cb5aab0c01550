#!/usr/bin/env python3
"""Print how busy the machine's CPUs were, in %, over SECONDS, leaving out the benchmark's own
clusters: the CPU time of each postmaster POSTMASTER_PID and of its children (backends, the
tsoracle worker, checkpointer, WAL writer, ...) is subtracted from the machine's busy time, so
what remains is what other tenants of the machine used (compiles, other tests).

Usage: foreign_cpu.py SECONDS [POSTMASTER_PID ...]
"""
import os
import sys
import time


def machine():
    with open("/proc/stat") as f:
        cols = [int(x) for x in f.readline().split()[1:]]
    total = sum(cols[:8])           # user nice system idle iowait irq softirq steal
    idle = cols[3] + cols[4]        # idle + iowait
    return total, total - idle


def cluster(pms):
    """{pid: utime + stime} of the postmasters and their children, in clock ticks (as /proc/stat)."""
    out = {}
    if not pms:
        return out
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        rest = stat[stat.rindex(")") + 2:].split()   # fields after "pid (comm)"
        ppid, utime, stime = int(rest[1]), int(rest[11]), int(rest[12])
        if int(name) in pms or ppid in pms:
            out[int(name)] = utime + stime
    return out


secs = float(sys.argv[1])
pm = {int(a) for a in sys.argv[2:] if a.isdigit()}
t0, b0 = machine()
c0 = cluster(pm)
time.sleep(secs)
t1, b1 = machine()
c1 = cluster(pm)
ours = sum(v - c0.get(pid, 0) for pid, v in c1.items() if v >= c0.get(pid, 0))
total = (t1 - t0) or 1
print(max(0, round(100.0 * ((b1 - b0) - ours) / total)))
