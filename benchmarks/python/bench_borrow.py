#!/usr/bin/env python3
"""Sharing a loaded model: the Llama-2-7B-shaped bf16 state dict (291 tensors,
13.5 GB) that a producer already holds in PyTorch memory, shared by name
without a copy (Registry.share of each tensor: borrowed) against copied into
registry memory (Registry.put_state_dict), in one run. Measures the device
memory each way costs above the model itself, and the producer's time.

Rows (p50 and p99 over --repeat rounds, each after --warmup ones):
  memcuda_share_dict   Registry.share_state_dict of the 291 tensors (one Redis
                       round trip; no device memory); extra: peak_above_model_gb, the device
                       memory in use above the model's own at the peak of the
                       share and of a fresh consumer's open (cudaMemGetInfo,
                       sampled every millisecond by a thread, the consumer's
                       CUDA context taken out: it is measured before its open).
  memcuda_put_dict     put_state_dict of the same tensors (the copy the borrow
                       saves); extra: the same peak.
The consumer (a fresh process) opens the names with get_state_dict(prefix,
framework="torch") and reads element 0 of every tensor; `wrong` counts wrong
values. ratio = put's p50 / share's p50. Copy's peak_above_model_gb is the
model's size; the borrow's is about 0.

usage: bench_borrow.py [--device cuda|cpu] [--scale F] [--repeat 3] [--warmup 1] [--url redis://...]
Exit 77 (every row a `skip`) without torch, memcuda, redis-server or (cuda) a GPU.
"""
from __future__ import annotations

import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402
from bench_common import mc  # noqa: E402
from bench_state_dict import divisor  # noqa: E402

ROWS = ("memcuda_share_dict", "memcuda_put_dict")


def consumer(args):
    """`open PREFIX`: get_state_dict + touch of every tensor; answers the wrong count."""
    import torch
    import memcuda

    dev = bc.torch_device(torch, args.device)
    if dev.type == "cuda":
        torch.zeros(1, device=dev).item()
    reg = memcuda.Registry(args.url, args.ns, control_thread=False)
    names = [n for n, _ in mc.state_dict_shapes(divisor(args.scale))]
    held = []

    def open_all(prefix):
        sd = reg.get_state_dict(prefix, framework="torch")
        values = mc.touch_all(torch, [sd[n] for n in names if n in sd], dev)
        held.append(sd)  # kept open until `drop`: the peak is sampled meanwhile
        return str(mc.check_values(values, range(len(names))) + abs(len(sd) - len(names)))

    def drop():
        held.clear()
        return "0"

    return bc.serve({"open": open_all, "drop": drop})


class Peak:
    """The highest device memory in use (total - free) while it runs."""

    def __init__(self, torch, dev):
        self.torch, self.dev, self.peak, self.stop = torch, dev, 0, False
        self.thread = threading.Thread(target=self._run, daemon=True)

    def used(self):
        if self.dev.type != "cuda":
            return 0
        free, total = self.torch.cuda.mem_get_info(self.dev)
        return total - free

    def _run(self):
        while not self.stop:
            self.peak = max(self.peak, self.used())
            time.sleep(0.001)

    def __enter__(self):
        self.peak = self.used()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop = True
        self.thread.join()
        self.peak = max(self.peak, self.used())


def one_round(rows_data, args, torch, memcuda, reg, model, dev, url, ns, rnd):
    """Shares, then copies, the model under fresh prefixes; a consumer opens each."""
    con = bc.Consumer(os.path.abspath(__file__), "--url", url, "--ns", ns, "--device", args.device,
                      "--scale", repr(args.scale))
    wrong = 0
    try:
        for row in ROWS:
            prefix = f"{row}/{rnd}/"
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            with Peak(torch, dev) as pk:
                base = pk.used()  # the model and the consumer's context are in already
                t0 = time.perf_counter_ns()
                if row == "memcuda_share_dict":
                    handles = reg.share_state_dict(prefix, model)
                else:
                    handles = reg.put_state_dict(prefix, model)
                    if dev.type == "cuda":
                        torch.cuda.synchronize(dev)
                t1 = time.perf_counter_ns()
                wrong += int(con.ask(f"open {prefix}")[0])
            rows_data[row].append((mc.ms(t1 - t0), (pk.peak - base) / 1e9))
            con.ask("drop")
            names = [h.name for h in handles.values()]
            del handles
            for n in names:
                try:
                    reg.remove(n)
                except memcuda.NotFound:
                    pass  # a borrowed record already went with its last reference
            reg.flush()
    finally:
        con.close()
    return wrong


def main():
    ap = bc.parser(__doc__, repeat=3, warmup=1)
    ap.add_argument("--scale", type=float, default=1.0)
    args = ap.parse_args()
    if args.consumer:
        return consumer(args)
    rows, torch, memcuda, dev = bc.setup("bench_borrow", args, ROWS)
    div = divisor(args.scale)
    shapes = mc.state_dict_shapes(div)
    nbytes = mc.check_shapes(shapes, div) * 2
    if dev.type != "cuda":
        rows.log("device cpu: a functional check (host tensors from shareable_empty; memory is not sampled)")
    rows.log(f"torch {torch.__version__}, memcuda {memcuda.__version__}, device {dev}, {len(shapes)} bf16 tensors, "
             f"{nbytes / 1e9:.3f} GB (each dimension / {div})")
    if dev.type == "cuda":
        model = mc.make_state_dict(torch, shapes, dev)
    else:  # host memory can only be lent from a memfd mapping
        model = {}
        for i, (n, shape) in enumerate(shapes):
            model[n] = memcuda.shareable_empty(shape, "bf16")
            model[n].view(-1)[0] = mc.touch_value(i)
    data = {r: [] for r in ROWS}
    wrong = 0
    try:
        with bc.redis_url(args.url) as url:
            ns = bc.namespace()
            reg = memcuda.Registry(url, ns, default_backend="cuda" if dev.type == "cuda" else "host")
            try:
                for rnd in range(args.warmup + args.repeat):
                    got = {r: [] for r in ROWS}
                    wrong += one_round(got, args, torch, memcuda, reg, model, dev, url, ns, rnd)
                    if rnd >= args.warmup:
                        for r in ROWS:
                            data[r] += got[r]
            finally:
                reg.close()
    except LookupError as e:  # no redis-server
        for r in ROWS:
            rows.skip(r, str(e))
        rows.print()
        return bc.SKIP
    for r in ROWS:
        peaks = [p for _, p in data[r]]
        rows.add(r, [t for t, _ in data[r]], peak_above_model_gb=f"{max(peaks):.3f}" if dev.type == "cuda" else "n/a",
                 model_gb=f"{nbytes / 1e9:.3f}", tensors=len(shapes), wrong=wrong)
    rows.print({"memcuda_share_dict": ["memcuda_put_dict"]})
    if wrong:
        rows.log(f"{wrong} wrong value(s)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
