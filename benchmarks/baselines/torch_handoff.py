#!/usr/bin/env python3
"""PyTorch baseline for memcuda_bench: hand a CUDA tensor to another process
through a torch.multiprocessing queue, the way a PyTorch user shares GPU
tensors without mem-cuda, and time it until the consumer holds the tensor.

Each iteration the producer allocates a fresh tensor and fills it (outside
the timing, synchronised), takes a CLOCK_MONOTONIC stamp and puts the tensor
on the queue. The consumer's get() returns a tensor mapped from the
producer's memory (torch opens the CUDA IPC handle while unpickling):
"handoff" is stamp -> get() returned. The consumer then reads the tensor
("read" is stamp -> value on the host; --read item reads one element, --read
sum reduces it), checks the value, drops the tensor and acknowledges, so
iterations never overlap. CLOCK_MONOTONIC is one clock for every process of
the machine, so the two stamps compare.

Prints one JSON document on stdout (the last line); progress on stderr.

usage: torch_handoff.py [--sizes 4096,1048576,67108864] [--iters 200]
                        [--warmup 20] [--device 0] [--read item|sum]
"""
import argparse
import json
import math
import os
import queue
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_common as mc  # noqa: E402  (installed beside this script)


def percentile_us(sorted_ns, q):
    """Nearest-rank percentile, as memcuda_bench computes it."""
    if not sorted_ns:
        return 0.0
    rank = min(max(math.ceil(q * len(sorted_ns)), 1), len(sorted_ns))
    return sorted_ns[rank - 1] / 1e3


def summary(prefix, samples):
    s = sorted(samples)
    return {
        prefix + "_p50_us": percentile_us(s, 0.50),
        prefix + "_p99_us": percentile_us(s, 0.99),
        prefix + "_p999_us": percentile_us(s, 0.999),
        prefix + "_mean_us": (sum(s) / len(s) / 1e3) if s else 0.0,
        prefix + "_min_us": (s[0] / 1e3) if s else 0.0,
        prefix + "_max_us": (s[-1] / 1e3) if s else 0.0,
    }


def consumer(q, ack, device, read_mode, parent_pid):
    import torch

    torch.cuda.set_device(device)
    torch.zeros(1, device="cuda").item()  # CUDA context before the first handoff
    ack.put(("ready", 0, 0, True))
    while True:
        try:
            item = q.get(timeout=5)
        except queue.Empty:  # is the producer still there?
            if os.getppid() != parent_pid:
                return
            continue
        if item is None:
            return
        t0, value, x = item
        t1 = time.monotonic_ns()  # the tensor is mapped: get() rebuilt it
        if read_mode == "sum":
            got = x.sum().item()
            ok = abs(got - value * x.numel()) <= 1e-3 * value * x.numel()
        else:
            got = x.view(-1)[0].item()
            ok = got == value
        t2 = time.monotonic_ns()
        del x, item
        ack.put(("done", t1 - t0, t2 - t0, ok))


def parse_sizes(text):
    out = []
    for item in text.split(","):
        item = item.strip().lower()
        if not item:
            continue
        mul = 1
        for suffix, m in (("kib", 1 << 10), ("mib", 1 << 20), ("gib", 1 << 30), ("k", 1 << 10), ("m", 1 << 20),
                          ("g", 1 << 30)):
            if item.endswith(suffix):
                item, mul = item[: -len(suffix)], m
                break
        out.append(int(item) * mul)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="4096,65536,1048576,16777216,67108864")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--read", choices=("item", "sum"), default="item")
    args = ap.parse_args()

    import torch
    import torch.multiprocessing as mp

    if not torch.cuda.is_available():
        print("torch_handoff: no CUDA device visible to PyTorch", file=sys.stderr)
        return 3
    torch.cuda.set_device(args.device)
    ctx = mp.get_context("spawn")  # CUDA cannot be used in a forked child
    q, ack = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=consumer, args=(q, ack, args.device, args.read, os.getpid()), daemon=True)
    proc.start()

    def wait_ack(timeout):
        """The consumer's next message; raises if it died or stayed silent."""
        return mc.wait_acks(ack, [proc], 1, timeout, "an answer")[0]

    try:
        wait_ack(300)  # "ready": torch imported, CUDA context made
    except RuntimeError as e:
        print(f"torch_handoff: {e}", file=sys.stderr)
        return 1

    results = []
    failures = 0
    for size in parse_sizes(args.sizes):
        n = max(1, size // 4)
        handoff, read = [], []
        for i in range(args.warmup + args.iters):
            value = float(i % 7 + 1)
            x = torch.empty(n, dtype=torch.float32, device="cuda")
            x.fill_(value)
            torch.cuda.synchronize()
            t0 = time.monotonic_ns()
            q.put((t0, value, x))
            try:
                kind, h, r, ok = wait_ack(60)
            except RuntimeError as e:
                print(f"torch_handoff: {e}", file=sys.stderr)
                return 1
            del x
            if not ok:
                failures += 1
            if i >= args.warmup:
                handoff.append(h)
                read.append(r)
        row = {"size": n * 4, "n": len(handoff)}
        row.update(summary("handoff", handoff))
        row.update(summary("read", read))
        results.append(row)
        print(f"torch_handoff: {n * 4} B: handoff p50 {row['handoff_p50_us']:.1f} us, "
              f"p99 {row['handoff_p99_us']:.1f} us; +read p50 {row['read_p50_us']:.1f} us", file=sys.stderr)
    q.put(None)
    proc.join(timeout=30)

    doc = {
        "tool": "torch_handoff",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(args.device),
        "read": args.read,
        "iters": args.iters,
        "warmup": args.warmup,
        "wrong_values": failures,
        "results": results,
    }
    print(json.dumps(doc))
    return 0 if failures == 0 else 4


if __name__ == "__main__":
    sys.exit(main())
