"""Fixtures of the memcuda pytest suite: a private redis-server (real, on a
unix socket, as tests/support/redis_server.hpp starts one), a registry per test
in its own namespace, and the C++ programs the cross-process tests drive."""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Iterator, List, Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, HERE)

import memcuda  # noqa: E402
from private_redis import NoRedisServer, private_redis  # noqa: E402


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device, torch with CUDA (or cupy) and a CUDA build")


def find_program(env: str, pattern: str) -> Optional[str]:
    p = os.environ.get(env)
    if p:
        return p
    found = sorted(glob.glob(os.path.join(REPO, pattern)))
    return found[0] if found else None


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    try:
        with private_redis("memcuda-pytest-") as url:
            yield url
    except NoRedisServer as e:
        pytest.skip(str(e))


@pytest.fixture
def namespace() -> str:
    return "py" + uuid.uuid4().hex[:10]


PKG = os.path.join(REPO, "python")


def gpu_torch():
    """torch (None where it is missing) and the marks of a test file that
    needs it on a CUDA device: skipped, with the reason, where the build,
    torch or a device is missing."""
    try:
        import torch
        cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - depends on the machine
        torch, cuda = None, False
    return torch, [
        pytest.mark.gpu,
        pytest.mark.skipif(not memcuda.has_cuda(), reason="libmemcuda_c was built without the CUDA backend"),
        pytest.mark.skipif(torch is None, reason="torch is not installed"),
        pytest.mark.skipif(torch is not None and not cuda, reason="torch sees no CUDA device"),
    ]


@pytest.fixture
def greg(redis_url: str, namespace: str) -> Iterator[memcuda.Registry]:
    """The allocator of record of this test's namespace, cuda backend."""
    r = memcuda.Registry(redis_url, namespace, default_backend="cuda", session_ttl=0.6, gc_interval=0.2)
    yield r
    r.close()


@pytest.fixture
def reg(redis_url: str, namespace: str) -> Iterator[memcuda.Registry]:
    """The allocator of record of this test's namespace, host backend."""
    r = memcuda.Registry(redis_url, namespace, default_backend="host", session_ttl=0.6, gc_interval=0.2)
    try:
        yield r
    finally:
        r.close()


class Worker:
    """tests/worker.cpp: a real C++ mem-cuda process, one command per line."""

    def __init__(self, url: str, namespace: str, *args: str) -> None:
        exe = find_program("MEMCUDA_TEST_WORKER", "build*/tests/memcuda_test_worker")
        if not exe or not os.path.exists(exe):
            pytest.skip("memcuda_test_worker not built (cmake --build BUILD --target memcuda_test_worker) "
                        "and MEMCUDA_TEST_WORKER not set")
        self.proc = subprocess.Popen([exe, "--url", url, "--ns", namespace, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        ready = self.proc.stdout.readline()
        assert ready.startswith("READY"), ready

    def cmd(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        out = self.proc.stdout.readline().strip()
        assert out.startswith("OK"), f"{line!r} -> {out!r}"
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("exit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def worker_factory(redis_url: str, namespace: str):
    made: List[Worker] = []

    def make(*args: str) -> Worker:
        w = Worker(redis_url, namespace, *args)
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()


def fields(line: str) -> dict:
    """'OK a=1 b=x' -> {'a': '1', 'b': 'x'}"""
    return dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)


def wait_for(pred, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
