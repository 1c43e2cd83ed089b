#!/usr/bin/env python3
"""PyTorch baseline for memcuda_bench_model's "opened by a fresh consumer"
row: hand the Llama-2-7B-shaped bf16 state dict (291 tensors, 13.5 GB) to a
FRESH consumer process, the way PyTorch users do it without mem-cuda, and
time it until the consumer has touched every tensor.

Rows (medians over --reps fresh consumers, each after --warmup untimed ones):
  torch_queue_handoff   the producer puts the whole dict on a
                        torch.multiprocessing Queue; the consumer's get()
                        rebuilds every tensor (opening its CUDA IPC handle).
  torch_reduce_pickle   the producer calls
                        torch.multiprocessing.reductions.reduce_tensor on each
                        tensor, pickles the dict (ForkingPickler, as SGLang's
                        MultiprocessingSerializer does) and writes the bytes to
                        a pipe; the consumer unpickles and calls each
                        rebuild function.
Each consumer is spawned, imports torch and creates its CUDA context, then
says ready: none of that is timed. The time runs from the producer's stamp
just before it shares (put / reduce) to the consumer's stamp after it read
element 0 of every tensor (a copy kernel per tensor into one buffer, then one
synchronising copy to the host) and checked the values; CLOCK_MONOTONIC is
one clock for every process of the machine. The producer keeps the tensors
alive throughout (torch requires it).

usage: torch_model_handoff.py [--method queue|pickle|both] [--small | --scale N]
                              [--reps 5] [--warmup 1] [--device 0|cpu]
Prints `row ...` lines (see model_common.py); exit 77 without torch or CUDA.
"""
import os
import pickle
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_common as mc  # noqa: E402


def consumer(method, src, ack, dev_spec, parent_pid):
    """The fresh process: ready -> receive -> rebuild -> touch -> report."""
    import torch

    dev = mc.consumer_device(torch, dev_spec)  # the CUDA context, before the clock starts
    ack.put(("ready", 0, 0, 0))
    while True:
        item = mc.receive(method, src, parent_pid)
        if item is None:
            return
        t_recv0 = mc.now_ns()
        if method == "queue":
            sd = item  # get() already rebuilt (and mapped) every tensor
        else:
            reduced = pickle.loads(item)
            sd = {name: fn(*args) for name, (fn, args) in reduced.items()}
            del reduced
        tensors = list(sd.values())
        values = mc.touch_all(torch, tensors, dev)
        t1 = mc.now_ns()
        wrong = mc.check_values(values, range(len(tensors)))
        if len(tensors) != mc.FULL_TENSORS:
            wrong += abs(mc.FULL_TENSORS - len(tensors))
        del sd, tensors, item
        ack.put(("done", t1, wrong, t1 - t_recv0))


ROW_NAMES = {"queue": "torch_queue_handoff", "pickle": "torch_reduce_pickle"}


def measure(method, sd, dev_spec, reps, warmup, timeout):
    """--warmup + --reps fresh consumers, each handed `sd` once by `method`.
    Returns (ms from the producer's stamp to the consumer's touch of the last
    tensor, ms of the consumer's side alone, wrong values); RuntimeError when a
    consumer died or stayed silent."""
    import torch.multiprocessing as mp
    from multiprocessing.reduction import ForkingPickler
    from torch.multiprocessing.reductions import reduce_tensor

    ctx = mp.get_context("spawn")  # CUDA cannot be used in a forked child
    samples, consumer_side, wrong_total = [], [], 0
    for rep in range(warmup + reps):
        ack = ctx.Queue()
        proc, sink = mc.spawn_consumer(ctx, consumer, method, ack, dev_spec)
        mc.wait_acks(ack, [proc], 1, timeout, "ready")
        t0 = mc.now_ns()
        if method == "queue":
            sink.put(sd)
        else:
            payload = ForkingPickler.dumps({name: reduce_tensor(t) for name, t in sd.items()})
            sink.send_bytes(bytes(payload))
        _, t1, wrong, inside = mc.wait_acks(ack, [proc], 1, timeout, "done")[0]
        mc.send_end(method, sink)
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
            proc.join()
        wrong_total += wrong
        if rep >= warmup:
            samples.append(mc.ms(t1 - t0))
            consumer_side.append(mc.ms(inside))
    return samples, consumer_side, wrong_total


def main():
    ap = mc.parser(__doc__.split("\n\n")[0])
    ap.add_argument("--method", choices=("queue", "pickle", "both"), default="both")
    args = ap.parse_args()
    methods = ["queue", "pickle"] if args.method == "both" else [args.method]
    run = mc.start("torch_model_handoff", args, [ROW_NAMES[m] for m in methods])
    sd = mc.make_state_dict(run.torch, run.shapes, run.dev)
    rc = 0
    for method in methods:
        try:
            samples, consumer_side, wrong_total = measure(method, sd, run.dev_spec, args.reps, args.warmup,
                                                          args.timeout)
        except RuntimeError as e:
            run.out.log(f"{ROW_NAMES[method]}: {e}")
            run.out.skip(ROW_NAMES[method], f"failed: {e}")
            rc = 1
            continue
        if wrong_total:
            run.out.log(f"{ROW_NAMES[method]}: {wrong_total} wrong value(s) read by consumers")
            rc = 1
        extra = {"consumer_ms": f"{mc.statistics.median(consumer_side):.3f}" if consumer_side else "-",
                 "tensors": len(run.shapes), "bytes": run.elements * 2, "wrong": wrong_total}
        run.out.row(ROW_NAMES[method], samples, **extra)
    return rc


if __name__ == "__main__":
    sys.exit(main())
