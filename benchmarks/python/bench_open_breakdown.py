#!/usr/bin/env python3
"""Where the Python binding's time goes in one
``Registry.get_state_dict(prefix, framework="torch")`` of the 291-tensor
Llama-2-7B-shaped dict: the C open alone against the whole Python call,
and the Python call's parts. What counts is the number of tensors, not their
bytes, so the host backend and small shapes measure it on any machine.

Each repetition opens the dict through its state-dict record (the producer
put it with ``put_state_dict(..., persistent=True)``) from a consumer
Registry of this process, then drops it and waits for the release:

  c_open            memcuda_open_state_dict alone (one ctypes call: the
                    record's script, the blob's decode, the handles)
  whole_call        Registry.get_state_dict(prefix, framework="torch")
  binding_share     whole_call - c_open (p50s): what the binding adds
and the parts of one get_state_dict, timed one after the other as it runs
them (the sum differs from whole_call by the clock's own cost):
  open              the C open (the same call as c_open)
  views             _torch_open.torch_views_of_handles: one memcuda_tensors_fields,
                    per allocation a span export, a DLPack import, a view per tensor
  release           the handles released (the views hold their own shares)
  keys              the result dict (keys without the prefix)
(a package without memcuda/_torch_open.py prints c_open and whole_call only).

usage: bench_open_breakdown.py [--scale 64] [--repeat 200] [--warmup 20] [--profile]
  --profile: also prints cProfile's top functions of --repeat whole calls.
Prints `row <name> <p50_ms> <p99_ms> n=<samples> min=<ms>` lines; exit 77 without
torch, memcuda or redis-server.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402
from bench_common import mc  # noqa: E402

PREFIX = "llama/"
ROWS = ("c_open", "whole_call", "open", "views", "release", "keys")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=int, default=64, help="divides every dimension (default 64: about 3.3 MB)")
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--url", default=None)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    rows = bc.Rows("bench_open_breakdown", "_host")
    torch, memcuda = bc.need_imports(rows, ROWS, "cpu")
    from memcuda import tensor as mt
    from memcuda._lib import lib
    from memcuda.errors import check
    shapes = mc.state_dict_shapes(args.scale)
    try:
        url_cm = bc.redis_url(args.url)
        url = url_cm.__enter__()
    except LookupError as e:
        for r in ROWS:
            rows.skip(r, str(e))
        rows.print()
        return bc.SKIP
    ns = bc.namespace()
    prod = memcuda.Registry(url, ns, default_backend="host")
    cons = memcuda.Registry(url, ns, control_thread=False)
    try:
        sd = {n: torch.zeros(shape, dtype=torch.bfloat16) for n, shape in shapes}
        for h in prod.put_state_dict(PREFIX, sd, persistent=True).values():
            h.release()
        del sd
        rows.log(f"{len(shapes)} tensors under {PREFIX!r}, host backend, scale 1/{args.scale}, "
                 f"{memcuda.library_path}")

        def settle() -> None:
            gc.collect()
            cons.flush()

        def c_open() -> float:
            arr = ctypes.POINTER(ctypes.c_void_p)()
            n = ctypes.c_size_t()
            t0 = time.perf_counter_ns()
            check(lib.memcuda_open_state_dict(cons._handle(), PREFIX.encode(), ctypes.byref(arr), ctypes.byref(n)))
            t1 = time.perf_counter_ns()
            assert n.value == len(shapes), n.value
            for i in range(n.value):
                lib.memcuda_tensor_release(arr[i])
            lib.memcuda_free_tensor_array(arr)
            return (t1 - t0) / 1e6

        def whole() -> float:
            t0 = time.perf_counter_ns()
            got = cons.get_state_dict(PREFIX, framework="torch")
            t1 = time.perf_counter_ns()
            assert len(got) == len(shapes)
            return (t1 - t0) / 1e6

        try:
            from memcuda import _torch_open as fast
        except ImportError:  # a package older than the direct path: whole_call and c_open only
            fast = None

        def parts() -> list:
            # get_state_dict(framework="torch")'s steps, as _models.py runs them.
            t = [time.perf_counter_ns()]
            arr = ctypes.POINTER(ctypes.c_void_p)()
            n = ctypes.c_size_t()
            check(lib.memcuda_open_state_dict(cons._handle(), PREFIX.encode(), ctypes.byref(arr), ctypes.byref(n)))
            t.append(time.perf_counter_ns())
            names, views = fast.torch_views_of_handles(arr, n.value)
            t.append(time.perf_counter_ns())
            fast.release_handles(arr, n.value)
            t.append(time.perf_counter_ns())
            out = {name[len(PREFIX):]: v for name, v in zip(names, views)}
            t.append(time.perf_counter_ns())
            assert len(out) == len(shapes)
            return [(b - a) / 1e6 for a, b in zip(t, t[1:])]

        samples = {r: [] for r in ROWS}
        for i in range(args.warmup + args.repeat):
            a = c_open()
            settle()
            b = whole()
            settle()
            p = parts() if fast else []
            settle()
            if i >= args.warmup:
                samples["c_open"].append(a)
                samples["whole_call"].append(b)
                for name, v in zip(ROWS[2:], p):
                    samples[name].append(v)
        for r in ROWS:
            if samples[r]:
                rows.add(r, samples[r], min=f"{min(samples[r]):.4f}")  # min: the least disturbed run
        rows.print()
        for what, f in (("p50", rows.p50), ("min", lambda r: min(samples[r]))):
            share = f("whole_call") - f("c_open")
            print(f"# binding share (whole_call {what} - c_open {what}): {share:.4f} ms for {len(shapes)} tensors",
                  flush=True)
        if args.profile:
            import cProfile
            import pstats
            pr = cProfile.Profile()
            for _ in range(args.repeat):
                pr.enable()
                got = cons.get_state_dict(PREFIX, framework="torch")
                del got
                pr.disable()
                settle()
            pstats.Stats(pr).sort_stats("tottime").print_stats(15)
    finally:
        cons.close()
        prod.close()
        url_cm.__exit__(None, None, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
