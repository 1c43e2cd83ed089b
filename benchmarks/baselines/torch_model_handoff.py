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
import queue
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_common as mc  # noqa: E402


def consumer(method, src, ack, dev_spec, parent_pid):
    """The fresh process: ready -> receive -> rebuild -> touch -> report."""
    import torch

    dev = torch.device(*dev_spec) if dev_spec[1] is not None else torch.device(dev_spec[0])
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        torch.zeros(1, device=dev).item()  # the CUDA context, before the clock starts
    ack.put(("ready", 0, 0, 0))
    while True:
        try:
            if method == "queue":
                item = src.get(timeout=5)
            else:
                if not src.poll(5):
                    raise queue.Empty
                item = src.recv_bytes()
        except queue.Empty:
            if not mc.parent_alive(parent_pid):
                return
            continue
        except EOFError:
            return
        if item is None or item == b"":
            return
        t_recv0 = mc.now_ns()
        if method == "queue":
            sd = item  # get() already rebuilt (and mapped) every tensor
        else:
            reduced = pickle.loads(item)
            sd = {name: fn(*args) for name, (fn, args) in reduced.items()}
        tensors = list(sd.values())
        values = mc.touch_all(torch, tensors, dev)
        t1 = mc.now_ns()
        wrong = mc.check_values(values, range(len(tensors)))
        if len(tensors) != mc.FULL_TENSORS:
            wrong += abs(mc.FULL_TENSORS - len(tensors))
        del sd, tensors, item
        if method != "queue":
            del reduced
        ack.put(("done", t1, wrong, t1 - t_recv0))


def main():
    ap = mc.parser(__doc__.split("\n\n")[0])
    ap.add_argument("--method", choices=("queue", "pickle", "both"), default="both")
    args = ap.parse_args()
    kind, ordinal = mc.parse_device(args)
    out = mc.Out("torch_model_handoff", "_cpu" if kind == "cpu" else "")
    methods = ["queue", "pickle"] if args.method == "both" else [args.method]
    row_names = {"queue": "torch_queue_handoff", "pickle": "torch_reduce_pickle"}
    torch = mc.need_torch(out, [row_names[m] for m in methods], kind == "cuda", ordinal or 0)
    import torch.multiprocessing as mp
    from multiprocessing.reduction import ForkingPickler
    from torch.multiprocessing.reductions import reduce_tensor

    scale = mc.resolve_scale(args)
    shapes = mc.state_dict_shapes(scale)
    elements = mc.check_shapes(shapes, scale)
    dev = torch.device(kind, ordinal) if kind == "cuda" else torch.device("cpu")
    if kind == "cuda":
        torch.cuda.set_device(dev)
    out.log(f"torch {torch.__version__}, device {dev}"
            f"{' (' + torch.cuda.get_device_name(dev) + ')' if kind == 'cuda' else ''}, "
            f"{len(shapes)} bf16 tensors, {elements * 2 / 1e9:.3f} GB (scale {scale})")
    sd = mc.make_state_dict(torch, shapes, dev)
    ctx = mp.get_context("spawn")  # CUDA cannot be used in a forked child
    dev_spec = (kind, ordinal)

    rc = 0
    for method in methods:
        samples, consumer_side, wrong_total = [], [], 0
        try:
            for rep in range(args.warmup + args.reps):
                ack = ctx.Queue()
                if method == "queue":
                    q = ctx.Queue()
                    src, sink = q, None
                else:
                    src, sink = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=consumer, args=(method, src, ack, dev_spec, os.getpid()), daemon=True)
                proc.start()

                def wait_ack(what):
                    deadline = mc.now_ns() + int(args.timeout * 1e9)
                    while True:
                        try:
                            return ack.get(timeout=1)
                        except queue.Empty:
                            if not proc.is_alive():
                                raise RuntimeError(f"the consumer exited (code {proc.exitcode}) before {what}")
                            if mc.now_ns() > deadline:
                                raise RuntimeError(f"no {what} from the consumer within {args.timeout} s")

                wait_ack("ready")
                t0 = mc.now_ns()
                if method == "queue":
                    q.put(sd)
                else:
                    payload = ForkingPickler.dumps({name: reduce_tensor(t) for name, t in sd.items()})
                    sink.send_bytes(bytes(payload))
                _, t1, wrong, inside = wait_ack("done")
                if method == "queue":
                    q.put(None)
                else:
                    sink.send_bytes(b"")
                proc.join(timeout=60)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
                wrong_total += wrong
                if rep >= args.warmup:
                    samples.append(mc.ms(t1 - t0))
                    consumer_side.append(mc.ms(inside))
        except RuntimeError as e:
            out.log(f"{row_names[method]}: {e}")
            out.skip(row_names[method], f"failed: {e}")
            rc = 1
            continue
        if wrong_total:
            out.log(f"{row_names[method]}: {wrong_total} wrong value(s) read by consumers")
            rc = 1
        extra = {"consumer_ms": f"{mc.statistics.median(consumer_side):.3f}" if consumer_side else "-",
                 "tensors": len(shapes), "bytes": elements * 2, "wrong": wrong_total}
        out.row(row_names[method], samples, **extra)
    return rc


if __name__ == "__main__":
    sys.exit(main())
