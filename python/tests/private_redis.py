"""A private redis-server on a unix socket, for one test session or one
benchmark run (the pytest fixture `redis_url` and benchmarks/python use it),
as tests/support/redis_server.hpp starts one for the C++ tests."""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Iterator


class NoRedisServer(LookupError):
    """There is no redis-server to start."""


def _accepts(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


@contextlib.contextmanager
def private_redis(prefix: str = "memcuda-redis-") -> Iterator[str]:
    """Starts redis-server ($MEMCUDA_TEST_REDIS_SERVER, else PATH) and yields
    its unix:// URL; kills it and removes its folder afterwards. Raises
    NoRedisServer when there is none."""
    server = os.environ.get("MEMCUDA_TEST_REDIS_SERVER") or shutil.which("redis-server")
    if not server:
        raise NoRedisServer("redis-server not found (apt-get install redis-server, or set MEMCUDA_TEST_REDIS_SERVER)")
    d = tempfile.mkdtemp(prefix=prefix)
    sock = os.path.join(d, "redis.sock")
    proc = subprocess.Popen([server, "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700", "--save", "",
                             "--appendonly", "no", "--dir", d, "--logfile", os.path.join(d, "redis.log")],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        # The socket file appears at bind(), a moment before listen(): wait
        # until a connect succeeds, not just for the file.
        while not _accepts(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start (log in {d})")
            time.sleep(0.01)
        yield "unix://" + sock
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(d, ignore_errors=True)
