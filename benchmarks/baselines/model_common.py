"""What the model baselines share: the Llama-2-7B-shaped state dict, the
`row` output format, timing helpers and the exit-77 convention.

The state dict is the one the model rows measure: 32 layers of (q, k, v, o:
4096x4096; gate, up: 11008x4096; down: 4096x11008; two RMS norms: 4096),
the embedding and the LM head (32000x4096 each) and the final norm (4096):
291 bf16 tensors, 6,738,415,616 elements, 13,476,831,232 bytes. `scale`
divides every dimension (rounded up), keeping the 291 tensors and their
mix of sizes: scale 64 is about 3.3 MB (`--small`). benchmarks/bench_model.cpp
builds the same list; keep the two in step.

Output (stdout), one line each, read by benchmarks/run_model.sh:
    row <name> <median> <min> n=<runs> [key=value ...]   (times in ms)
    skip <name> <reason...>
Progress and errors go to stderr. A script that cannot run here (no torch,
no CUDA device) prints `skip` lines and exits 77; a wrong value read by a
consumer makes it exit 1.

Standard library and torch only: the GPU hosts have nothing from PyPI.
"""
import argparse
import math
import os
import queue
import statistics
import sys
import time

SKIP = 77  # CTest's and run_model.sh's "skipped"

FULL_TENSORS = 291
FULL_ELEMENTS = 6_738_415_616
FULL_BYTES = FULL_ELEMENTS * 2  # bf16: 13,476,831,232 bytes (13.5 GB)
SMALL_SCALE = 64


def _div(n, scale):
    return max(1, -(-n // scale))  # ceil


def state_dict_shapes(scale=1):
    """[(name, shape)] of the Llama-2-7B-shaped state dict, HF naming, in
    the order a checkpoint lists them. Every dimension divided by `scale`."""
    h, inter, vocab = _div(4096, scale), _div(11008, scale), _div(32000, scale)
    out = [("model.embed_tokens.weight", (vocab, h))]
    for i in range(32):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", (h, h)),
            (p + "self_attn.k_proj.weight", (h, h)),
            (p + "self_attn.v_proj.weight", (h, h)),
            (p + "self_attn.o_proj.weight", (h, h)),
            (p + "mlp.gate_proj.weight", (inter, h)),
            (p + "mlp.up_proj.weight", (inter, h)),
            (p + "mlp.down_proj.weight", (h, inter)),
            (p + "input_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
        ]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (vocab, h))]
    return out


def numel(shape):
    return math.prod(shape)


def check_shapes(shapes, scale):
    """The list must be the issue's state dict: 291 tensors and, unscaled,
    exactly 13,476,831,232 bf16 bytes. Raises on a mismatch."""
    if len(shapes) != FULL_TENSORS:
        raise AssertionError(f"state dict has {len(shapes)} tensors, expected {FULL_TENSORS}")
    if len({n for n, _ in shapes}) != len(shapes):
        raise AssertionError("state dict has duplicate names")
    total = sum(numel(s) for _, s in shapes)
    if scale == 1 and total != FULL_ELEMENTS:
        raise AssertionError(f"state dict has {total} elements, expected {FULL_ELEMENTS}")
    return total


def touch_value(i):
    """The value element 0 of tensor i holds: a small integer, exact in bf16."""
    return float(i % 97 + 1)


def parser(description):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--small", action="store_true",
                    help=f"scale every dimension down {SMALL_SCALE}x (about 3.3 MB, same 291 tensors)")
    ap.add_argument("--scale", type=int, default=None, help="divide every dimension by N (default 1)")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions (default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed repetitions first (default 1)")
    ap.add_argument("--device", default="0",
                    help="CUDA device ordinal (default 0), or 'cpu' for a functional check of the "
                         "script on a machine without a GPU (rows get a _cpu suffix; not a baseline)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds to wait for a consumer (default 300)")
    return ap


def resolve_scale(args):
    if args.scale is not None and args.scale < 1:
        raise SystemExit("--scale must be >= 1")
    return args.scale if args.scale is not None else (SMALL_SCALE if args.small else 1)


class Out:
    """Writes the `row`/`skip` lines; remembers whether anything failed."""

    def __init__(self, tool, suffix=""):
        self.tool = tool
        self.suffix = suffix
        self.failed = False

    def log(self, msg):
        print(f"{self.tool}: {msg}", file=sys.stderr, flush=True)

    def row(self, name, samples_ms, **extra):
        name += self.suffix
        if not samples_ms:
            self.skip(name, "no samples")
            return
        med = statistics.median(samples_ms)
        kv = "".join(f" {k}={v}" for k, v in extra.items())
        print(f"row {name} {med:.3f} {min(samples_ms):.3f} n={len(samples_ms)}{kv}", flush=True)
        self.log(f"{name}: median {med:.3f} ms, min {min(samples_ms):.3f} ms, "
                 f"all {' '.join(f'{s:.2f}' for s in samples_ms)}")

    def skip(self, name, reason):
        print(f"skip {name}{self.suffix if not name.endswith(self.suffix) else ''} {reason}", flush=True)
        self.log(f"skipped {name}: {reason}")


def need_torch(out, rows, want_cuda, device):
    """Imports torch (and checks CUDA when asked); on failure prints a skip
    line per row and exits 77."""
    try:
        import torch  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        for r in rows:
            out.skip(r, f"torch is not importable by {sys.executable}: {type(e).__name__}: {e}")
        sys.exit(SKIP)
    if want_cuda:
        if not torch.cuda.is_available():
            for r in rows:
                out.skip(r, f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)")
            sys.exit(SKIP)
        if device >= torch.cuda.device_count():
            for r in rows:
                out.skip(r, f"CUDA device {device} does not exist ({torch.cuda.device_count()} visible)")
            sys.exit(SKIP)
    return torch


def parse_device(args):
    """('cuda', ordinal) or ('cpu', None)."""
    if args.device == "cpu":
        return "cpu", None
    try:
        return "cuda", int(args.device)
    except ValueError:
        raise SystemExit(f"--device must be an ordinal or 'cpu', not {args.device!r}")


def make_state_dict(torch, shapes, dev):
    """The tensors, allocated and element 0 set (for the consumer's check);
    synchronised. Returns {name: tensor}."""
    sd = {}
    for i, (name, shape) in enumerate(shapes):
        t = torch.empty(shape, dtype=torch.bfloat16, device=dev)
        t.view(-1)[0] = touch_value(i)
        sd[name] = t
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return sd


def touch_all(torch, tensors, dev):
    """What "usable" means in every row: one read of element 0 of each tensor
    (on CUDA a copy kernel per tensor into one buffer, then one synchronising
    copy to the host), mirroring bench_model.cpp's one-element copy per
    tensor and one synchronisation. Returns the values read, as floats."""
    out = torch.empty(len(tensors), dtype=torch.bfloat16, device=dev)
    for i, t in enumerate(tensors):
        out[i] = t.view(-1)[0]
    return out.float().tolist()  # .tolist() synchronises on CUDA


def check_values(values, indices):
    """Number of wrong values: values[k] must be touch_value(indices[k])."""
    return sum(1 for v, i in zip(values, indices) if v != touch_value(i))


def now_ns():
    # CLOCK_MONOTONIC: one clock for every process of the machine.
    return time.monotonic_ns()


def ms(ns):
    return ns / 1e6


def parent_alive(parent_pid):
    return os.getppid() == parent_pid


# ---- what every script's main() and consumer share ----------------------------

class Run:
    """What start() set up: torch, the row writer, the device, the state dict's shapes."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def start(tool, args, row_names, extra_log=""):
    """The preamble of every model baseline: parse --device, import torch (or
    print a skip line per row and exit 77), resolve the scale, build and
    check the shapes, select the device, log one line. Returns a Run with
    torch, out, kind ('cuda' or 'cpu'), ordinal, dev, scale, shapes, elements."""
    kind, ordinal = parse_device(args)
    out = Out(tool, "_cpu" if kind == "cpu" else "")
    torch = need_torch(out, row_names, kind == "cuda", ordinal or 0)
    scale = resolve_scale(args)
    shapes = state_dict_shapes(scale)
    elements = check_shapes(shapes, scale)
    dev = torch.device(kind, ordinal) if kind == "cuda" else torch.device("cpu")
    if kind == "cuda":
        torch.cuda.set_device(dev)
    name = f" ({torch.cuda.get_device_name(dev)})" if kind == "cuda" else ""
    out.log(f"torch {torch.__version__}, device {dev}{name}, {len(shapes)} bf16 tensors, "
            f"{elements * 2 / 1e9:.3f} GB (scale {scale}){extra_log}")
    return Run(torch=torch, out=out, kind=kind, ordinal=ordinal, dev=dev, scale=scale, shapes=shapes,
               elements=elements, dev_spec=(kind, ordinal))


def consumer_device(torch, dev_spec):
    """In a consumer process: its device, with the CUDA context made now,
    before the producer's clock starts."""
    dev = torch.device(*dev_spec) if dev_spec[1] is not None else torch.device(dev_spec[0])
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        torch.zeros(1, device=dev).item()
    warm_touch(torch, dev)
    return dev


def warm_touch(torch, dev):
    """With MEMCUDA_BENCH_WARM_TOUCH=1, runs touch_all once on two small
    tensors of the consumer's own, before the clock: a fresh process's first
    launches of those kernels (torch loads their modules lazily: about 12 ms
    on an H200 host) then count in no row. Every consumer of every row calls
    it, so the rows stay comparable either way."""
    if os.environ.get("MEMCUDA_BENCH_WARM_TOUCH") == "1":
        tmp = [torch.ones(4, dtype=torch.bfloat16, device=dev) for _ in range(2)]
        touch_all(torch, tmp, dev)


def spawn_consumer(ctx, target, method, ack, dev_spec, *extra):
    """A consumer process (daemon) and its channel: a Queue for "queue", else a
    one-way Pipe. Returns (process, the producer's end). The target is called
    as target(method, src, ack, dev_spec, producer_pid, *extra)."""
    if method == "queue":
        src = sink = ctx.Queue()
    else:
        src, sink = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(method, src, ack, dev_spec, os.getpid(), *extra), daemon=True)
    proc.start()
    return proc, sink


def send_end(method, sink):
    """Tells a consumer of receive() to stop."""
    sink.put(None) if method == "queue" else sink.send_bytes(b"")


def receive(method, src, parent_pid):
    """A consumer's next item from a Queue ("queue") or a Pipe (anything
    else: the bytes); None at the end (None or b"" sent, the pipe closed, or
    the producer gone)."""
    while True:
        try:
            if method == "queue":
                item = src.get(timeout=5)
            else:
                if not src.poll(5):
                    raise queue.Empty
                item = src.recv_bytes()
        except queue.Empty:
            if not parent_alive(parent_pid):
                return None
            continue
        except EOFError:
            return None
        return None if item is None or item == b"" else item


def wait_acks(ack, procs, n, timeout, what):
    """The next n messages on `ack`; RuntimeError when a consumer process
    exited or `timeout` seconds passed first."""
    msgs = []
    deadline = now_ns() + int(timeout * 1e9)
    while len(msgs) < n:
        try:
            msgs.append(ack.get(timeout=1))
        except queue.Empty:
            dead = [p.exitcode for p in procs if not p.is_alive()]
            if dead:
                raise RuntimeError(f"{len(dead)} consumer(s) exited (codes {dead}) before {what}")
            if now_ns() > deadline:
                raise RuntimeError(f"{n - len(msgs)} consumer(s) sent no {what} within {timeout} s")
    return msgs
