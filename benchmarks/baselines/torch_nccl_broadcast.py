#!/usr/bin/env python3
"""The NCCL baseline of bench_replicas: torch.distributed broadcasts the
Llama-2-7B-shaped state dict (model_common) from the first device to the
others, one process per GPU, as vLLM and checkpoint-engine do inside a node.

    torch_nccl_broadcast.py --devices 0,1,2,3 [--scale 1 | --small] [--reps 5] [--warmup 1]
                            [--sockets] [--bytes N]

Two ways, each timed from a barrier until every rank has synchronised its
device and met the next barrier (rank 0's clock):
    per_tensor  291 dist.broadcast calls, one per tensor
    flat        one dist.broadcast of a single buffer of all the bytes
                (checkpoint-engine's bucketing at its best: one bucket)
Every receiver checks one value per tensor afterwards (a wrong value: exit 1).

--sockets: every rank a fake node (its own NCCL_HOSTID), NCCL forced
through its socket transport on the loopback (no P2P, no shared memory):
the path mem-cuda's fleet pulls take between fake nodes (bench_fleet).
A device may then carry several ranks. --bytes N: one tensor of N bytes
instead of the dict (a two-rank broadcast is a send/recv).

stdout: one JSON object {"per_tensor_ms": [...], "flat_ms": [...], "bytes": N,
"devices": [...], "torch": "...", "nccl": "..."}; exit 77 (a `skip` line on
stdout) without torch, CUDA, NCCL or enough devices. NCCL_NVLS_ENABLE defaults
to 0 here: NVLink multicast is not what the other rows use.
"""
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_common as mc  # noqa: E402


def worker(rank, devices, scale, reps, warmup, init_file, out_file, sockets=False, nbytes=0):
    if sockets:
        os.environ.update(NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1", NCCL_NET="Socket",
                          NCCL_SOCKET_IFNAME="lo", NCCL_HOSTID=f"memcuda-fake-node-{rank}")
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(devices[rank])
    dist.init_process_group("nccl", init_method="file://" + init_file, rank=rank, world_size=len(devices),
                            device_id=torch.device("cuda", devices[rank]))
    shapes = [("flat", (nbytes // 2,))] if nbytes else mc.state_dict_shapes(scale)
    tensors = [torch.empty(s, dtype=torch.bfloat16, device="cuda") for _, s in shapes]
    total = sum(t.numel() for t in tensors)
    flat = torch.empty(total, dtype=torch.bfloat16, device="cuda")

    def fill(step):
        for i, t in enumerate(tensors):
            t.view(-1)[0] = float((i + step) % 97 + 1) if rank == 0 else 0.0
        flat[0] = float(step % 97 + 1) if rank == 0 else 0.0
        torch.cuda.synchronize()

    def timed(body):
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        body()
        torch.cuda.synchronize()
        dist.barrier()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3

    out = {"per_tensor_ms": [], "flat_ms": []}
    wrong = 0
    for r in range(warmup + reps):
        fill(r)
        ms = timed(lambda: [dist.broadcast(t, src=0) for t in tensors])
        wrong += sum(float(t.view(-1)[0]) != float((i + r) % 97 + 1) for i, t in enumerate(tensors))
        ms_flat = timed(lambda: dist.broadcast(flat, src=0))
        wrong += float(flat[0]) != float(r % 97 + 1)
        if r >= warmup:
            out["per_tensor_ms"].append(ms)
            out["flat_ms"].append(ms_flat)
    if wrong:
        print(f"torch_nccl_broadcast: rank {rank}: {wrong} wrong values", file=sys.stderr)
    bad = torch.tensor([wrong], device="cuda")
    dist.all_reduce(bad)
    if rank == 0:
        out.update(bytes=total * 2, devices=devices, torch=torch.__version__,
                   nccl=".".join(map(str, torch.cuda.nccl.version())), wrong=int(bad.item()))
        with open(out_file, "w") as f:
            json.dump(out, f)
    dist.destroy_process_group()


def main():
    p = mc.parser(__doc__)
    p.add_argument("--devices", default="0,1")
    p.add_argument("--sockets", action="store_true", help="ranks as fake nodes, NCCL over loopback sockets")
    p.add_argument("--bytes", type=int, default=0, help="one tensor of N bytes instead of the dict")
    args = p.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    try:
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"skip nccl_broadcast no torch ({e})")
        return mc.SKIP
    devices = [int(d) for d in args.devices.split(",")]
    if (not torch.cuda.is_available() or torch.cuda.device_count() <= max(devices) or len(devices) < 2
            or (len(set(devices)) < len(devices) and not args.sockets)):
        print(f"skip nccl_broadcast needs devices {devices} ({torch.cuda.device_count()} visible)")
        return mc.SKIP
    if not dist.is_nccl_available():
        print("skip nccl_broadcast torch has no NCCL")
        return mc.SKIP
    scale = mc.resolve_scale(args)
    with tempfile.TemporaryDirectory() as d:
        init, out = os.path.join(d, "init"), os.path.join(d, "out.json")
        mp.spawn(worker, args=(devices, scale, args.reps, args.warmup, init, out, args.sockets, args.bytes),
                 nprocs=len(devices))
        with open(out) as f:
            doc = json.load(f)
    print(json.dumps(doc))
    return 1 if doc["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
