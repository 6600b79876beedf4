#!/usr/bin/env python3
"""What waking a thread costs on this machine: two processes pass a byte back and forth
through two pipes, N round trips, and the CPU time and wall time per round trip are printed.

Three cases: the two processes on different CPUs with the machine otherwise idle (each
wake-up finds the other CPU idle), the same with both CPUs kept busy by low-priority
spinners (`nice 19`), and both processes pinned to one CPU. On a nested guest whose idle
vCPUs halt, the first case costs tens of microseconds of CPU per wake-up (BENCHMARKS.md,
issue 5, session 18). Linux only (sched_setaffinity); needs two CPUs.

usage: scripts/bench/wakeup_cost.py [ROUND_TRIPS]   (default 20000)
"""
import os
import resource
import sys
import time

ALL_CPUS = os.sched_getaffinity(0)


def ping_pong(n, cpus=None):
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    start = time.monotonic()
    child = os.fork()
    if child == 0:
        if cpus:
            os.sched_setaffinity(0, {cpus[1]})
        for _ in range(n):
            os.read(a_r, 1)
            os.write(b_w, b"x")
        os._exit(0)
    if cpus:
        os.sched_setaffinity(0, {cpus[0]})
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(n):
        os.write(a_w, b"x")
        os.read(b_r, 1)
    kids_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    os.waitpid(child, 0)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    cpu += (kids.ru_utime - kids_before.ru_utime) + (kids.ru_stime - kids_before.ru_stime)
    for fd in (a_r, a_w, b_r, b_w):
        os.close(fd)
    if cpus:
        os.sched_setaffinity(0, ALL_CPUS)
    return wall / n * 1e6, cpu / n * 1e6


def spinner(cpu):
    pid = os.fork()
    if pid == 0:
        os.sched_setaffinity(0, {cpu})
        os.nice(19)
        while True:
            pass
    return pid


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        sys.exit("needs two CPUs")
    pair = (cpus[0], cpus[1])
    results = [("two CPUs, otherwise idle", ping_pong(n, pair))]
    spinners = [spinner(cpu) for cpu in pair]
    try:
        time.sleep(0.2)
        results.append(("two CPUs, both busy (nice 19 spinners)", ping_pong(n, pair)))
    finally:
        for pid in spinners:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    results.append(("one CPU", ping_pong(n, (cpus[0], cpus[0]))))
    for name, (wall, cpu) in results:
        print(f"{name}: {wall:.1f} us wall, {cpu:.1f} us CPU per round trip")


if __name__ == "__main__":
    main()
