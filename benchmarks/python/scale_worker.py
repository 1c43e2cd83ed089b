#!/usr/bin/env python3
"""The Python client's worker of memcuda_bench_scale (benchmarks/bench_scale.cpp
starts it as it starts its C++ workers; bench_scale_workers.hpp).

A client Registry like the C++ workers': control thread off, no reference
sharing (MEMCUDA_SHARE_REFERENCES=0, which the C ABI's options read: every
get is a Redis acquire), host backend, 60 s command and request timeouts; namespace --ns,
Redis from MEMCUDA_REDIS_URL. It talks to the parent in lines on stdin/stdout:

  probe   says READY <python version> <memcuda version> <libmemcuda_c.so path>
  get     says READY once set up; on GO <end_ns>: 20 untimed, then --gets gets
          of random names among the first --count (each release flushed to
          Redis before the next get) until end_ns; says
          DONE <get_ns> <pair_ns> ... (the get call; get + release + flush)
  tput    says READY after 20 untimed pairs; on GO <start_ns> <end_ns>:
          get+release pairs from start to end; says OPS <pairs done by end>

Any role says SKIP <reason> instead of READY when the memcuda package or
libmemcuda_c.so cannot be loaded, and exits 0. Times are CLOCK_MONOTONIC ns,
the parent's clock (std::chrono::steady_clock).
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time

COMMAND_TIMEOUT_S = 60.0  # as bench_scale_workers.hpp's kCommandTimeout


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def next_line() -> str:
    line = sys.stdin.readline()
    if not line:
        raise RuntimeError("the parent closed stdin")
    return line.strip()


def name(i: int) -> str:
    return "t/%07d" % i  # bench_scale_support.hpp's tensor_name


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", required=True, choices=("probe", "get", "tput"))
    ap.add_argument("--ns", default="")
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--gets", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    os.environ["MEMCUDA_SHARE_REFERENCES"] = "0"  # read when the Registry is opened
    try:
        import memcuda
    except Exception as e:  # ImportError, or OSError from a broken .so
        say("SKIP " + " ".join(f"{type(e).__name__}: {e}".split()))
        return 0
    if a.role == "probe":
        v = sys.version_info
        say(f"READY {v.major}.{v.minor}.{v.micro} {memcuda.__version__} {memcuda.library_path}")
        return 0
    reg = memcuda.Registry(None, a.ns or None, control_thread=False, default_backend="host",
                           command_timeout=COMMAND_TIMEOUT_S, request_timeout=COMMAND_TIMEOUT_S)
    rng = random.Random(a.seed)
    count = a.count
    get, flush = reg.get, reg.flush

    def pair() -> None:
        get(name(rng.randrange(count))).release()
        flush()  # a pair is done when its release is in Redis

    if a.role == "get":
        return role_get(get, flush, rng, count, a.gets, pair)
    for _ in range(20):
        pair()
    say("READY")
    go = next_line().split()
    if len(go) != 3 or go[0] != "GO":
        return 3
    start, end = int(go[1]), int(go[2])
    while now_ns() < start:
        time.sleep(0.0001)
    ops = 0
    while now_ns() < end:
        pair()
        if now_ns() <= end:
            ops += 1
    say(f"OPS {ops}")
    return 0


def role_get(get, flush, rng, count, gets, pair) -> int:
    for _ in range(20):
        pair()
    say("READY")
    go = next_line().split()
    if len(go) != 2 or go[0] != "GO":
        return 3
    end = int(go[1])
    out = []
    for _ in range(gets):
        if now_ns() >= end:
            break
        n = name(rng.randrange(count))
        t0 = now_ns()
        t = get(n)
        t1 = now_ns()
        t.release()
        flush()
        t2 = now_ns()
        out.append(f"{t1 - t0} {t2 - t0}")
    say("DONE " + " ".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
