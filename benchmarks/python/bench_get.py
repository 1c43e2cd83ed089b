#!/usr/bin/env python3
"""A Python `Registry.get` against the torch.multiprocessing Queue handoff of
one tensor, side by side in one run.

Rows (p50 and p99 over --repeat iterations, after --warmup):
  memcuda_get_mapped      a consumer process's Registry.get (+ release) of a
                          tensor it already holds, so mapped in the process
  memcuda_get_fresh       a consumer's Registry.get of a tensor it never
                          opened (the producer creates a new one each time)
  memcuda_handoff_mapped  producer's stamp -> the consumer got the mapped
                          tensor by name (the name sent over a pipe), made it
                          a torch tensor (torch.from_dlpack) and read element 0
  memcuda_handoff_fresh   the same with a new tensor each time
  torch_queue_handoff     producer's stamp -> the consumer's Queue.get()
                          rebuilt a new tensor and it read element 0
                          (benchmarks/baselines/torch_handoff.py's way)
  torch_queue_handoff_same  the same tensor again (the consumer keeps the
                          previous one, so torch finds its storage cached)
The consumers are fresh Python processes, ready (torch imported, CUDA
context made, registry open) before any clock starts. CLOCK_MONOTONIC is one
clock for every process of the machine. Each memcuda row's ratio is to the
torch row of the same kind (fresh or already mapped).

usage: bench_get.py [--device cuda|cpu] [--bytes 1048576] [--repeat 200]
                    [--warmup 20] [--url redis://...]
Exit 77 (every row a `skip`) without torch, memcuda, redis-server or (cuda) a GPU.
"""
from __future__ import annotations

import os
import queue
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402
from bench_common import mc  # noqa: E402

ROWS = ("memcuda_get_mapped", "memcuda_get_fresh", "memcuda_handoff_mapped", "memcuda_handoff_fresh",
        "torch_queue_handoff", "torch_queue_handoff_same")
BASELINES = {"memcuda_get_mapped": ["torch_queue_handoff_same"], "memcuda_handoff_mapped": ["torch_queue_handoff_same"],
             "memcuda_get_fresh": ["torch_queue_handoff"], "memcuda_handoff_fresh": ["torch_queue_handoff"]}


def memcuda_consumer(args):
    """`get NAME VALUE`: get + from_dlpack + read, answering `t1_ns get_ns ok`;
    `hold NAME`: keep a handle (the tensor stays mapped); `getonly NAME`: a
    timed get + release, answering its ns."""
    import torch
    import memcuda

    dev = bc.torch_device(torch, args.device)
    if dev.type == "cuda":
        torch.zeros(1, device=dev).item()
    reg = memcuda.Registry(args.url, args.ns, control_thread=False)
    held = {}

    def get(name, value):
        t0 = mc.now_ns()
        t = reg.get(name)
        tg = mc.now_ns()
        got = torch.from_dlpack(t).view(-1)[0].item()
        t1 = mc.now_ns()
        return f"{t1} {tg - t0} {int(got == float(value))}"

    def hold(name):
        held[name] = reg.get(name)
        return "held"

    def getonly(name):
        t0 = mc.now_ns()
        reg.get(name).release()
        return str(mc.now_ns() - t0)

    return bc.serve({"get": get, "hold": hold, "getonly": getonly})


def torch_consumer(q, ack, device, parent_pid):
    import torch

    dev = bc.torch_device(torch, device)
    if dev.type == "cuda":
        torch.zeros(1, device=dev).item()
    ack.put(("ready", 0, True))
    held = None
    while True:
        try:
            item = q.get(timeout=5)
        except queue.Empty:
            if not mc.parent_alive(parent_pid):
                return
            continue
        if item is None:
            return
        keep, value, x = item
        ok = x.view(-1)[0].item() == value
        t1 = mc.now_ns()
        held = x if keep else None  # "same": keep it, so the next rebuild finds it cached
        del x, item
        ack.put(("done", t1, ok))
    del held


def fill(torch, view, value, dev):
    view.fill_(value)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def bench_memcuda(rows, args, torch, memcuda, dev, url, ns):
    n = max(1, args.bytes // 4)
    reg = memcuda.Registry(url, ns, default_backend="cuda" if dev.type == "cuda" else "host")
    script = os.path.abspath(__file__)
    con = bc.Consumer(script, "--url", url, "--ns", ns, "--device", args.device)
    try:
        mapped = reg.create("get.mapped", (n,), "f32")
        mview = torch.from_dlpack(mapped)
        con.ask("hold get.mapped")
        get_m, get_f, hand_m, hand_f, wrong = [], [], [], [], 0
        for i in range(args.warmup + args.repeat):
            timed = i >= args.warmup
            value = float(i % 7 + 1)
            fill(torch, mview, value, dev)
            t0 = mc.now_ns()
            t1, g, ok = con.ask(f"get get.mapped {value}")
            wrong += ok != "1"
            ns_only = int(con.ask("getonly get.mapped")[0])
            fresh = reg.create(f"get.fresh.{i}", (n,), "f32")
            fill(torch, torch.from_dlpack(fresh), value, dev)
            t0f = mc.now_ns()
            t1f, gf, okf = con.ask(f"get get.fresh.{i} {value}")
            wrong += okf != "1"
            fresh.release()
            if timed:
                hand_m.append(mc.ms(int(t1) - t0))
                get_m.append(mc.ms(ns_only))
                hand_f.append(mc.ms(int(t1f) - t0f))
                get_f.append(mc.ms(int(gf)))
        extra = {"bytes": n * 4, "wrong": wrong}
        rows.add("memcuda_get_mapped", get_m, **extra)
        rows.add("memcuda_get_fresh", get_f, **extra)
        rows.add("memcuda_handoff_mapped", hand_m, **extra)
        rows.add("memcuda_handoff_fresh", hand_f, **extra)
        return wrong
    finally:
        con.close()
        reg.close()


def bench_torch(rows, args, torch, dev):
    import torch.multiprocessing as mp

    n = max(1, args.bytes // 4)
    ctx = mp.get_context("spawn")  # CUDA cannot be used in a forked child
    q, ack = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=torch_consumer, args=(q, ack, args.device, os.getpid()), daemon=True)
    proc.start()
    wrong = 0
    try:
        mc.wait_acks(ack, [proc], 1, 300, "ready")
        same = torch.empty(n, dtype=torch.float32, device=dev)
        for keep, row in ((False, "torch_queue_handoff"), (True, "torch_queue_handoff_same")):
            samples = []
            for i in range(args.warmup + args.repeat):
                value = float(i % 7 + 1)
                x = same if keep else torch.empty(n, dtype=torch.float32, device=dev)
                fill(torch, x, value, dev)
                t0 = mc.now_ns()
                q.put((keep, value, x))
                _, t1, ok = mc.wait_acks(ack, [proc], 1, 60, "done")[0]
                wrong += not ok
                del x
                if i >= args.warmup:
                    samples.append(mc.ms(t1 - t0))
            rows.add(row, samples, bytes=n * 4, wrong=wrong)
    finally:
        q.put(None)
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    return wrong


def main():
    ap = bc.parser(__doc__, repeat=200, warmup=20)
    ap.add_argument("--bytes", type=int, default=1 << 20)
    args = ap.parse_args()
    if args.consumer:
        return memcuda_consumer(args)
    rows, torch, memcuda, dev = bc.setup("bench_get", args, ROWS)
    try:
        with bc.redis_url(args.url) as url:
            rows.log(f"torch {torch.__version__}, memcuda {memcuda.__version__}, device {dev}, "
                     f"{args.bytes} bytes, {args.repeat} iterations after {args.warmup}")
            wrong = bench_memcuda(rows, args, torch, memcuda, dev, url, bc.namespace())
            wrong += bench_torch(rows, args, torch, dev)
    except LookupError as e:  # no redis-server
        for r in ROWS:
            rows.skip(r, str(e))
        rows.print()
        return bc.SKIP
    rows.print(BASELINES)
    if wrong:
        rows.log(f"{wrong} wrong value(s) read by the consumers")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
