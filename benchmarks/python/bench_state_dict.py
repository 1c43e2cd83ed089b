#!/usr/bin/env python3
"""The Llama-2-7B-shaped bf16 state dict (291 tensors, 13.5 GB) opened by a
FRESH Python process until every tensor is usable, mem-cuda against PyTorch's
Queue handoff and reduce_tensor + pickle, side by side in one run (goal: at
least 10x faster than PyTorch).

Rows (p50 and p99 over --repeat fresh consumers, each after --warmup ones):
  memcuda_state_dict_fresh  the producer published the dict with one
                        persistent create_many and linked a state-dict
                        record over it (what put_state_dict(persistent=True)
                        does); a fresh consumer (torch imported, CUDA context
                        made, Registry open: untimed) gets the go, calls
                        Registry.get_state_dict(prefix, framework="torch")
                        (one O(1) script and ONE reference for the dict, then
                        one DLPack import per allocation, a packed dict's
                        one, and a view per tensor) and touches every tensor.
  memcuda_state_dict_fresh_per_name  the same before the record is linked:
                        one batch script taking a reference per tensor.
  torch_queue_handoff   benchmarks/baselines/torch_model_handoff.py: the dict
                        on a torch.multiprocessing Queue.
  torch_reduce_pickle   the same script: reduce_tensor of each, pickled.
With MEMCUDA_BENCH_WARM_TOUCH=1 every consumer of every row runs the touch
once on tensors of its own before the clock (model_common.warm_touch), so
torch's first launch of those kernels in a new process counts in no row.
Every row runs from the producer's stamp to the consumer's stamp after it
read element 0 of every tensor (model_common.touch_all: a copy kernel per
tensor into one buffer, one synchronising copy to the host) and checked the
values. memcuda's ratio is to the faster baseline.

usage: bench_state_dict.py [--device cuda|cpu] [--scale F] [--repeat 5] [--warmup 1] [--url redis://...]
  --scale F: the fraction of the full 13.5 GB (0 < F <= 1; each dimension is
  divided by round(1/sqrt(F)), keeping the 291 tensors); e.g. 0.0003 (about
  4 MB) for a functional check on a CPU.
Exit 77 (every row a `skip`) without torch, memcuda, redis-server or (cuda) a GPU.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402
from bench_common import mc  # noqa: E402

PREFIX = "llama/"
ROWS = ("memcuda_state_dict_fresh", "memcuda_state_dict_fresh_per_name", "torch_queue_handoff", "torch_reduce_pickle")


def divisor(fraction):
    if not 0 < fraction <= 1:
        raise SystemExit("--scale must be a fraction in (0, 1]")
    return max(1, round(fraction ** -0.5))


def memcuda_consumer(args):
    """`open`: get_state_dict + touch, answering `t1_ns wrong consumer_ns`."""
    import torch
    import memcuda

    dev = bc.torch_device(torch, args.device)
    if dev.type == "cuda":
        torch.zeros(1, device=dev).item()
    mc.warm_touch(torch, dev)  # MEMCUDA_BENCH_WARM_TOUCH=1: as every baseline consumer
    reg = memcuda.Registry(args.url, args.ns, control_thread=False)
    names = [n for n, _ in mc.state_dict_shapes(divisor(args.scale))]

    def open_all():
        t0 = mc.now_ns()
        sd = reg.get_state_dict(PREFIX, framework="torch")
        t_open = mc.now_ns()
        values = mc.touch_all(torch, [sd[n] for n in names if n in sd], dev)
        t1 = mc.now_ns()
        wrong = mc.check_values(values, range(len(names))) + abs(len(sd) - len(names))
        del sd
        return f"{t1} {wrong} {t1 - t0} {t_open - t0}"

    return bc.serve({"open": open_all})


def publish(reg, torch, shapes, dev):
    """The dict in the registry (one create_many, persistent), element 0 of
    tensor i set to touch_value(i). Returns the creator's handles."""
    made = reg.create_many([(PREFIX + n, shape, "bf16") for n, shape in shapes], persistent=True)
    for i, t in enumerate(made):
        torch.from_dlpack(t).view(-1)[0] = mc.touch_value(i)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return made


def bench_memcuda(rows, args, torch, memcuda, dev, url, ns, shapes, nbytes):
    """Fresh consumers of the dict opened name by name (a reference per
    tensor), then, once a state-dict record is linked over it, through the
    record (one reference): the second is what put_state_dict(persistent=
    True) gives every consumer."""
    reg = memcuda.Registry(url, ns, default_backend="cuda" if dev.type == "cuda" else "host")
    made = publish(reg, torch, shapes, dev)
    wrong = 0

    def consumers(row):
        nonlocal wrong
        samples, inside, opens = [], [], []
        for rep in range(args.warmup + args.repeat):
            con = bc.Consumer(os.path.abspath(__file__), "--url", url, "--ns", ns, "--device", args.device,
                              "--scale", repr(args.scale))
            try:
                t0 = mc.now_ns()
                t1, w, ins, op = con.ask("open")
            finally:
                con.close()
            wrong += int(w)
            if rep >= args.warmup:
                samples.append(mc.ms(int(t1) - t0))
                inside.append(mc.ms(int(ins)))
                opens.append(mc.ms(int(op)))
        # open_ms: get_state_dict alone; the rest of consumer_ms is the touch.
        rows.add(row, samples, consumer_ms=f"{bc.percentile(inside, 0.5):.3f}",
                 open_ms=f"{bc.percentile(opens, 0.5):.3f}", tensors=len(shapes), bytes=nbytes, wrong=wrong)

    try:
        consumers("memcuda_state_dict_fresh_per_name")
        if not reg.link_state_dict(PREFIX, made):
            raise SystemExit("bench_state_dict: the state-dict record was not linked")
        consumers("memcuda_state_dict_fresh")
    finally:
        names = [t.name for t in made]
        del made
        for n in names:
            reg.remove(n)
        reg.close()
    return wrong


def bench_torch(rows, args, torch, dev, shapes, nbytes):
    import torch_model_handoff as tmh

    sd = mc.make_state_dict(torch, shapes, dev)
    dev_spec = (dev.type, dev.index)
    wrong = 0
    for method in ("queue", "pickle"):
        row = tmh.ROW_NAMES[method]
        try:
            samples, inside, w = tmh.measure(method, sd, dev_spec, args.repeat, args.warmup, 300)
        except RuntimeError as e:
            rows.skip(row, f"failed: {e}")
            wrong += 1
            continue
        wrong += w
        rows.add(row, samples, consumer_ms=f"{bc.percentile(inside, 0.5):.3f}", tensors=len(shapes),
                 bytes=nbytes, wrong=w)
    return wrong


def main():
    ap = bc.parser(__doc__, repeat=5, warmup=1)
    ap.add_argument("--scale", type=float, default=1.0)
    args = ap.parse_args()
    if args.consumer:
        return memcuda_consumer(args)
    rows, torch, memcuda, dev = bc.setup("bench_state_dict", args, ROWS)
    div = divisor(args.scale)
    shapes = mc.state_dict_shapes(div)
    nbytes = mc.check_shapes(shapes, div) * 2
    rows.log(f"torch {torch.__version__}, memcuda {memcuda.__version__}, device {dev}, {len(shapes)} bf16 "
             f"tensors, {nbytes / 1e9:.3f} GB (each dimension / {div}), {args.repeat} fresh consumers "
             f"after {args.warmup}")
    try:
        with bc.redis_url(args.url) as url:
            wrong = bench_memcuda(rows, args, torch, memcuda, dev, url, bc.namespace(), shapes, nbytes)
    except LookupError as e:  # no redis-server
        rows.skip("memcuda_state_dict_fresh", str(e))
        wrong = 0
    except RuntimeError as e:
        rows.skip("memcuda_state_dict_fresh", f"failed: {e}")
        wrong = 1
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    wrong += bench_torch(rows, args, torch, dev, shapes, nbytes)
    rows.print({"memcuda_state_dict_fresh": ["torch_queue_handoff", "torch_reduce_pickle"],
                "memcuda_state_dict_fresh_per_name": ["torch_queue_handoff", "torch_reduce_pickle"]})
    if wrong:
        rows.log(f"{wrong} wrong value(s) or failed row(s)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
