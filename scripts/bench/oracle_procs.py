"""The oracle's processes as make bench's oracle section measures them (scripts/bench/bench.py).

oracle_procs.py POSTMASTER_PID cpu: the CPU time of every child of that postmaster, in
microseconds, summed (/proc/PID/schedstat: per-process utime and stime come in whole 10 ms
ticks, which 1,000 backends with a few ms each would round away). oracle_procs.py POSTMASTER_PID pss: the Pss (kB) of its children that
serve the simulated members (role bench_member), summed, and how many there are.
"""
import os
import sys

ppid, what = sys.argv[1], sys.argv[2]
cpu_us = pss = n = 0
for d in os.listdir("/proc"):
    if not d.isdigit():
        continue
    try:
        with open(f"/proc/{d}/stat") as f:
            stat = f.read()
        # After the process name (in brackets, which may hold spaces): state, ppid, ...
        rest = stat[stat.rindex(")") + 2:].split()
        if rest[1] != ppid:
            continue
        if what == "cpu":
            with open(f"/proc/{d}/schedstat") as f:
                cpu_us += int(f.read().split()[0]) // 1000
            continue
        with open(f"/proc/{d}/cmdline", "rb") as f:
            if b"bench_member" not in f.read():
                continue
        with open(f"/proc/{d}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss += int(line.split()[1])
        n += 1
    except (OSError, ValueError, IndexError):
        continue  # a process that ended meanwhile
print(cpu_us if what == "cpu" else f"{pss} {n}")
