"""Real processes: a C++ process (tests/worker.cpp, the memcuda CLI) and Python
exchange the same bytes both ways; a killed Python holder is collected; a
forked child cannot use its parent's handles."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import REPO, fields, find_program, kill, wait_for


def test_cpp_creates_python_reads(reg, worker_factory):
    w = worker_factory("--no-control", "--backend", "host")
    gen = int(fields(w.cmd("create cx.a 3,5 2.5"))["gen"])
    t = reg.get("cx.a", dtype="f32")
    assert t.generation == gen and t.shape == (3, 5) and t.backend == "host"
    a = np.from_dlpack(t)
    assert a.dtype == np.float32 and np.all(a == 2.5)
    assert reg.info("cx.a").refcount == 2
    w.cmd("fill cx.a -1.25")  # the C++ process writes; Python's view shows it
    assert np.all(a == -1.25)


def test_python_creates_cpp_reads(reg, worker_factory):
    src = np.arange(12, dtype=np.float32) * 0.25
    t = reg.put("cx.b", src.reshape(3, 4))
    w = worker_factory("--no-control", "--backend", "host")
    got = fields(w.cmd("get cx.b"))
    assert int(got["gen"]) == t.generation
    assert float(got["sum"]) == float(src.sum())  # 16.5, exact in f32
    assert int(got["refcount"]) == 2
    t.numpy()[0, 0] = 100  # Python writes; the C++ process sees it
    assert float(fields(w.cmd("sum cx.b"))["sum"]) == float(src.sum()) + 100
    w.cmd("release cx.b")
    reg.flush()
    assert reg.info("cx.b").refcount == 1


def test_cli_prints_what_python_wrote(reg, redis_url, namespace):
    cli = find_program("MEMCUDA_CLI", "build*/tools/memcuda")
    if not cli or not os.path.exists(cli):
        pytest.skip("the memcuda CLI is not built (target memcuda_cli) and MEMCUDA_CLI is not set")
    values = np.array([[1, -2, 3], [40000, -5, 6]], dtype=np.int32)
    t = reg.put("cx.cli", values)
    out = subprocess.run([cli, "--url", redis_url, "--namespace", namespace, "--json", "cat", "cx.cli",
                          "--head", "6"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    flat = doc.get("values", doc.get("elements", doc.get("data")))
    assert [int(v) for v in flat] == values.ravel().tolist(), doc
    del t


HOLDER = textwrap.dedent("""
    import sys, time, numpy
    sys.path.insert(0, {pkg!r})
    import memcuda
    reg = memcuda.Registry({url!r}, {ns!r}, control_thread=False, session_ttl=0.5)
    t = reg.get("cx.held")
    view = numpy.from_dlpack(t)
    print("READY", float(view.sum()), flush=True)
    time.sleep(600)
""")


def test_killed_python_holder_is_collected(reg, redis_url, namespace):
    reg.put("cx.held", np.ones(64, np.float32), persistent=True).release()
    reg.flush()
    assert reg.info("cx.held").refcount == 1
    code = HOLDER.format(pkg=os.path.join(REPO, "python"), url=redis_url, ns=namespace)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        line = p.stdout.readline()
        assert line.split() == ["READY", "64.0"], line
        assert reg.info("cx.held").refcount == 2
    finally:
        kill(p)

    def collected() -> bool:
        reg.collect_garbage()
        return reg.info("cx.held").refcount == 1

    wait_for(collected, 15, "the killed holder's reference to be dropped")


FORK_CHILD = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {pkg!r})
    import memcuda, numpy
    reg = memcuda.Registry({url!r}, {ns!r}, control_thread=False)
    t = reg.get("cx.fork")
    pid = os.fork()
    if pid == 0:
        codes = []
        for f in (lambda: reg.get("cx.fork"), lambda: t.tobytes()):
            try:
                f()
                codes.append("ok")
            except memcuda.MemcudaError as e:
                codes.append("refused")
        child = memcuda.Registry({url!r}, {ns!r}, control_thread=False)  # a fresh one works
        codes.append(str(int(numpy.from_dlpack(child.get("cx.fork")).sum())))
        child.close()
        print(" ".join(codes), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    print("parent", int(numpy.from_dlpack(t).sum()), flush=True)
""")


def test_forked_child_opens_its_own_registry(reg, redis_url, namespace):
    keep = reg.put("cx.fork", np.full(10, 3, np.int64))
    code = FORK_CHILD.format(pkg=os.path.join(REPO, "python"), url=redis_url, ns=namespace)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["refused refused 30", "parent 30"], out.stdout + out.stderr
    del keep
