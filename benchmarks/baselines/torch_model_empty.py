#!/usr/bin/env python3
"""PyTorch baseline for memcuda_bench_model's "published from scratch by the
allocator of record" row: allocate the Llama-2-7B-shaped bf16 state dict
(291 tensors, 13.5 GB) with torch.empty in one process, no data fill.

Rows (medians over --reps, after --warmup untimed repetitions):
  torch_empty_cold          torch.cuda.empty_cache() first (untimed), so the
                            caching allocator asks the driver for every
                            segment (cudaMalloc): allocation from scratch.
  torch_empty_reduce_cold   the same, then reduce_tensor on each tensor
                            (cudaIpcGetMemHandle per segment): what a PyTorch
                            producer pays before another process can open it.
  torch_empty_cached        the dict freed and allocated again without
                            emptying the cache: the caching allocator's
                            steady state, no driver call.
Each timing ends with torch.cuda.synchronize().

usage: torch_model_empty.py [--small | --scale N] [--reps 5] [--warmup 1] [--device 0|cpu]
Prints `row ...` lines (see model_common.py); exit 77 without torch or CUDA.
"""
import gc
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_common as mc  # noqa: E402

ROWS = ("torch_empty_cold", "torch_empty_reduce_cold", "torch_empty_cached")


def main():
    args = mc.parser(__doc__.split("\n\n")[0]).parse_args()
    run = mc.start("torch_model_empty", args, ROWS)
    torch, out, dev, shapes, elements = run.torch, run.out, run.dev, run.shapes, run.elements
    from torch.multiprocessing.reductions import reduce_tensor

    cuda = run.kind == "cuda"
    if cuda:
        torch.zeros(1, device=dev).item()  # the CUDA context

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    def empty_cache():
        gc.collect()
        if cuda:
            torch.cuda.synchronize(dev)
            torch.cuda.empty_cache()

    def allocate():
        return [torch.empty(shape, dtype=torch.bfloat16, device=dev) for _, shape in shapes]

    results = {r: [] for r in ROWS}
    for rep in range(args.warmup + args.reps):
        timed = rep >= args.warmup
        # cold: every segment from the driver
        empty_cache()
        t0 = mc.now_ns()
        ts = allocate()
        sync()
        t1 = mc.now_ns()
        if timed:
            results["torch_empty_cold"].append(mc.ms(t1 - t0))
        # cached: the same blocks again from the caching allocator
        del ts
        t0 = mc.now_ns()
        ts = allocate()
        sync()
        t1 = mc.now_ns()
        if timed:
            results["torch_empty_cached"].append(mc.ms(t1 - t0))
        del ts
        # cold again, plus the IPC export a sharing producer needs
        empty_cache()
        t0 = mc.now_ns()
        ts = allocate()
        handles = [reduce_tensor(t) for t in ts]
        sync()
        t1 = mc.now_ns()
        if timed:
            results["torch_empty_reduce_cold"].append(mc.ms(t1 - t0))
        if len(handles) != len(shapes):
            raise AssertionError("reduce_tensor returned fewer handles than tensors")
        del ts, handles
    empty_cache()
    for r in ROWS:
        out.row(r, results[r], tensors=len(shapes), bytes=elements * 2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
