#!/usr/bin/env python3
"""PyTorch baseline for the in-place update row: a trainer overwrites the
Llama-2-7B-shaped bf16 state dict (291 tensors, 13.5 GB) in place and
re-shares it to 8 consumers that already hold the previous version, as
PyTorch users do in RL weight sync; timed until all 8 have observed it.

Rows (medians over --reps updates, after --warmup untimed ones):
  torch_reshare_queue   the producer puts the dict on each consumer's
                        torch.multiprocessing Queue (one pickling per consumer).
  torch_reshare_pickle  the producer reduce_tensor()s every tensor and
                        pickles the dict once (ForkingPickler), then writes
                        the same bytes to each consumer's pipe.
Setup (untimed): 8 consumers are spawned, each receives the dict once and
touches it, so every IPC handle is already open in every consumer; torch's
rebuild then finds the storage in its cache, the best case for the baseline.
Each update (untimed) writes a new value into element 0 of every tensor and
synchronises. The time runs from the producer's stamp just before it
re-shares to the latest of the 8 consumers' stamps after each rebuilt the
dict, read element 0 of every tensor (a copy kernel per tensor, one
synchronising copy to the host) and found the new values.

usage: torch_model_reshare.py [--method queue|pickle|both] [--consumers 8]
                              [--small | --scale N] [--reps 5] [--warmup 1] [--device 0|cpu]
Prints `row ...` lines (see model_common.py); exit 77 without torch or CUDA.
"""
import os
import pickle
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_common as mc  # noqa: E402


def consumer(method, src, ack, dev_spec, parent_pid):
    import torch

    dev = mc.consumer_device(torch, dev_spec)
    ack.put(("ready", 0, 0))
    held = None  # the version this consumer holds (and so keeps mapped)
    while True:
        item = mc.receive(method, src, parent_pid)
        if item is None:
            return
        if method == "queue":
            version, sd = item
        else:
            version, reduced = pickle.loads(item)
            sd = {name: fn(*args) for name, (fn, args) in reduced.items()}
            del reduced
        tensors = list(sd.values())
        values = mc.touch_all(torch, tensors, dev)
        t1 = mc.now_ns()
        wrong = mc.check_values(values, [i + version for i in range(len(tensors))])
        held = sd  # the new version replaces the old one
        del item, tensors, sd
        ack.put(("done", t1, wrong))
    del held


def main():
    ap = mc.parser(__doc__.split("\n\n")[0])
    ap.add_argument("--method", choices=("queue", "pickle", "both"), default="both")
    ap.add_argument("--consumers", type=int, default=8)
    args = ap.parse_args()
    methods = ["queue", "pickle"] if args.method == "both" else [args.method]
    row_names = {"queue": "torch_reshare_queue", "pickle": "torch_reshare_pickle"}
    run = mc.start("torch_model_reshare", args, [row_names[m] for m in methods], f", {args.consumers} consumers")
    torch, out, kind, dev, shapes, elements = run.torch, run.out, run.kind, run.dev, run.shapes, run.elements
    import torch.multiprocessing as mp
    from multiprocessing.reduction import ForkingPickler
    from torch.multiprocessing.reductions import reduce_tensor

    sd = mc.make_state_dict(torch, shapes, dev)  # version 0: touch_value(i)
    ctx = mp.get_context("spawn")
    dev_spec = run.dev_spec
    version = 0

    def update(v):
        """In place: element 0 of tensor i becomes touch_value(i + v)."""
        with torch.no_grad():
            for i, t in enumerate(sd.values()):
                t.view(-1)[0] = mc.touch_value(i + v)
        if kind == "cuda":
            torch.cuda.synchronize(dev)

    rc = 0
    for method in methods:
        procs, sinks, ack = [], [], ctx.Queue()
        samples, wrong_total, failed = [], 0, False
        try:
            for _ in range(args.consumers):
                p, sink = mc.spawn_consumer(ctx, consumer, method, ack, dev_spec)
                procs.append(p)
                sinks.append(sink)

            def wait_acks(what, n):
                return mc.wait_acks(ack, procs, n, args.timeout, what)

            def share(v):
                if method == "queue":
                    for s in sinks:
                        s.put((v, sd))
                elif kind == "cuda":  # a CUDA IPC handle is plain bytes: one payload for all
                    payload = bytes(ForkingPickler.dumps((v, {n: reduce_tensor(t) for n, t in sd.items()})))
                    for s in sinks:
                        s.send_bytes(payload)
                else:  # a CPU storage travels as an fd that can be taken once: one payload each
                    for s in sinks:
                        s.send_bytes(bytes(ForkingPickler.dumps((v, {n: reduce_tensor(t) for n, t in sd.items()}))))

            wait_acks("ready", args.consumers)
            share(version)  # untimed: every consumer opens every handle once
            wrong_total += sum(m[2] for m in wait_acks("first handoff", args.consumers))
            for rep in range(args.warmup + args.reps):
                version += 1
                update(version)
                t0 = mc.now_ns()
                share(version)
                msgs = wait_acks(f"update {version}", args.consumers)
                t_last = max(m[1] for m in msgs)
                wrong_total += sum(m[2] for m in msgs)
                if rep >= args.warmup:
                    samples.append(mc.ms(t_last - t0))
        except RuntimeError as e:
            out.log(f"{row_names[method]}: {e}")
            out.skip(row_names[method], f"failed: {e}")
            rc, failed = 1, True
        finally:
            for s in sinks:
                try:
                    mc.send_end(method, s)
                except Exception:
                    pass
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
                    p.join()
        if failed:
            continue
        if wrong_total:
            out.log(f"{row_names[method]}: {wrong_total} stale or wrong value(s) read by consumers")
            rc = 1
        out.row(row_names[method], samples, consumers=args.consumers, tensors=len(shapes),
                bytes=elements * 2, wrong=wrong_total)
    return rc


if __name__ == "__main__":
    sys.exit(main())
