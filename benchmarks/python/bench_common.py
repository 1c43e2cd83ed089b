"""What the Python benchmarks share: the `row` lines with p50/p99 and the
ratios to the baselines, a private redis-server, the imports that turn into
`skip` lines (exit 77) when torch or memcuda is missing, and a fresh consumer
process driven over its stdin/stdout.

Output (stdout), one line each, read by benchmarks/python/run.sh:
    row <name> <p50_ms> <p99_ms> n=<samples> [key=value ...] [ratio=<baseline p50 / this p50> vs=<baseline>]
    skip <name> <reason...>
Progress goes to stderr. The state dict, its touch values and the PyTorch
baselines are benchmarks/baselines/model_common.py's (one definition for the
C++ and the Python benchmarks).
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import subprocess
import sys
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "baselines"))
sys.path.insert(0, os.path.join(ROOT, "python", "tests"))
import model_common as mc  # noqa: E402
from private_redis import private_redis  # noqa: E402

SKIP = mc.SKIP


def percentile(samples, q):
    """Nearest-rank percentile (as memcuda_bench and torch_handoff.py compute it)."""
    s = sorted(samples)
    if not s:
        return float("nan")
    return s[min(max(math.ceil(q * len(s)), 1), len(s)) - 1]


class Rows:
    """Collects samples (ms) per row, then prints every row with its ratio to
    its baseline: ratio = the baseline's p50 / this row's p50 (above 1: faster
    than the baseline)."""

    def __init__(self, tool, suffix=""):
        self.tool, self.suffix = tool, suffix
        self.samples, self.extra, self.skipped, self.order = {}, {}, {}, []

    def log(self, msg):
        print(f"{self.tool}: {msg}", file=sys.stderr, flush=True)

    def add(self, name, samples_ms, **extra):
        self.order.append(name)
        self.samples[name] = list(samples_ms)
        self.extra[name] = extra

    def skip(self, name, reason):
        self.order.append(name)
        self.skipped[name] = reason
        self.log(f"skipped {name}: {reason}")

    def p50(self, name):
        return percentile(self.samples[name], 0.5) if self.samples.get(name) else None

    def print(self, baselines=None):
        """baselines: {row: [baseline rows]}; the ratio is to the fastest of them that ran."""
        baselines = baselines or {}
        print(f"# {self.tool}: name p50_ms p99_ms n= ... ratio=(baseline p50 / p50) vs=(baseline)", flush=True)
        for name in self.order:
            shown = name + self.suffix
            if name in self.skipped or not self.samples.get(name):
                print(f"skip {shown} {self.skipped.get(name, 'no samples')}", flush=True)
                continue
            s = self.samples[name]
            kv = "".join(f" {k}={v}" for k, v in self.extra[name].items())
            ran = [(self.p50(b), b) for b in baselines.get(name, ()) if self.p50(b)]
            if ran:
                best, b = min(ran)
                kv += f" ratio={best / percentile(s, 0.5):.2f} vs={b}{self.suffix}"
            print(f"row {shown} {percentile(s, 0.5):.4f} {percentile(s, 0.99):.4f} n={len(s)}{kv}", flush=True)
            self.log(f"{shown}: p50 {percentile(s, 0.5):.4f} ms, p99 {percentile(s, 0.99):.4f} ms, n {len(s)}")


def parser(doc, repeat, warmup):
    """The options both benchmarks take, plus the hidden ones of their
    consumer processes (--consumer, --ns)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--repeat", type=int, default=repeat)
    ap.add_argument("--warmup", type=int, default=warmup)
    ap.add_argument("--url", default=None, help="Redis (default: $MEMCUDA_REDIS_URL, else a private redis-server)")
    ap.add_argument("--consumer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ns", default=None, help=argparse.SUPPRESS)
    return ap


def need_imports(rows, row_names, device):
    """(torch, memcuda), or a skip line per row and exit 77 when one cannot be
    imported or (device cuda) torch sees no GPU or memcuda was built without CUDA."""
    def skip_all(why):
        for r in row_names:
            rows.skip(r, why)
        rows.print()
        sys.exit(SKIP)
    try:
        import torch
    except Exception as e:  # ImportError, or a broken install
        skip_all(f"torch is not importable by {sys.executable}: {type(e).__name__}: {e}")
    try:
        import memcuda
    except Exception as e:
        skip_all(f"memcuda is not importable (PYTHONPATH=python, MEMCUDA_LIBRARY=libmemcuda_c.so): "
                 f"{type(e).__name__}: {e}")
    if device == "cuda":
        if not torch.cuda.is_available():
            skip_all(f"torch {torch.__version__} sees no CUDA device (use --device cpu for a functional check)")
        if not memcuda.has_cuda():
            skip_all(f"{memcuda.library_path} was built without CUDA (MEMCUDA_CUDA=OFF)")
    return torch, memcuda


@contextlib.contextmanager
def redis_url(url=None):
    """`url`, else $MEMCUDA_REDIS_URL, else a private redis-server on a unix
    socket for the run (python/tests/private_redis.py; LookupError when there
    is no redis-server)."""
    url = url or os.environ.get("MEMCUDA_REDIS_URL")
    if url:
        yield url
        return
    with private_redis("memcuda-pybench-") as u:
        yield u


def namespace():
    return "pybench" + uuid.uuid4().hex[:8]


def setup(tool, args, row_names):
    """(rows, torch, memcuda, torch.device) of a benchmark's main process (a
    skip line per row and exit 77 when an import or the device is missing)."""
    rows = Rows(tool, "_cpu" if args.device == "cpu" else "")
    torch, memcuda = need_imports(rows, row_names, args.device)
    return rows, torch, memcuda, torch_device(torch, args.device)


def torch_device(torch, device):
    return torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")


class Consumer:
    """A fresh Python process running `script --consumer ARGS`: one command
    line in, one answer line out (`ok ...` or `error ...`)."""

    def __init__(self, script, *args):
        self.proc = subprocess.Popen([sys.executable, script, "--consumer", *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        self.expect("ready")

    def send(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def expect(self, what):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the consumer exited (code {self.proc.wait()}) before {what}")
        fields = line.split()
        if fields[0] != "ok":
            raise RuntimeError(f"the consumer failed at {what}: {line.strip()}")
        return fields[1:]

    def ask(self, line):
        self.send(line)
        return self.expect(line.split()[0])

    def close(self):
        if self.proc.poll() is None:
            try:
                self.send("exit")
                self.proc.wait(timeout=30)
            except Exception:
                self.proc.kill()
                self.proc.wait()


def serve(handlers):
    """The consumer's loop: `ready`, then one answer per command line until
    `exit` or EOF. handlers: {command: f(*args) -> str}."""
    print("ok ready", flush=True)
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "exit":
            return 0
        try:
            print("ok " + handlers[cmd](*args), flush=True)
        except Exception as e:  # reported to the producer, which fails the row
            print(f"error {type(e).__name__}: {e}".replace("\n", " "), flush=True)
    return 0
