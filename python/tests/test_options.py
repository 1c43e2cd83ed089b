"""Registry options from Python (every keyword, the pool's included, the
MEMCUDA_* variables for what is left None) and get_many's contract
(docs/protocol.md, "The get_many contract")."""
from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest

import memcuda

ENV = ("MEMCUDA_SHARE_REFERENCES", "MEMCUDA_RELEASE_LINGER_MS", "MEMCUDA_CUDA_ALLOCATION", "MEMCUDA_RUNTIME_DIR",
       "MEMCUDA_ALLOWED_UIDS", "MEMCUDA_ALLOWED_GIDS", "MEMCUDA_DEBUG_POISON")


@pytest.fixture
def clean_env(monkeypatch):
    for v in ENV:
        monkeypatch.delenv(v, raising=False)
    return monkeypatch


def test_keywords_reach_the_registry(redis_url, namespace, clean_env):
    with memcuda.Registry(redis_url, namespace, control_thread=False, client_connections=3, waiting_connections=5,
                          share_references=False, release_linger=0.25, cuda_allocation="ipc",
                          serve_stall_timeout=4) as r:
        o = r.options
    assert o["client_connections"] == 3 and o["waiting_connections"] == 5
    assert o["share_references"] is False
    assert o["release_linger"] == 0.25
    assert o["cuda_allocation"] == "ipc"
    assert o["serve_stall_timeout"] == 4
    assert o["namespace"] == namespace and o["control_thread"] is False

    with memcuda.Registry(redis_url, namespace, control_thread=False) as r:
        d = r.options
    assert (d["client_connections"], d["waiting_connections"]) == (4, 16)
    assert d["share_references"] is True and d["release_linger"] == 0
    assert d["cuda_allocation"] == "auto" and d["serve_stall_timeout"] == 30


class NeverAllocates:
    """An upstream resource; the host backend never calls it."""

    def allocate(self, nbytes, device):
        return 0

    def deallocate(self, ptr, nbytes, device):
        pass


def test_pool_keywords_reach_the_registry(redis_url, namespace, clean_env):
    up = NeverAllocates()
    with memcuda.Registry(redis_url, namespace, control_thread=False, slab_bytes=8 << 20, host_slab_bytes=2 << 20,
                          dedicated_threshold=600 << 10, pack_batches_min_bytes=0, alignment=1024,
                          retain_empty_slabs=0, budget_bytes=7 << 20, device_budgets={-1: 3 << 20, 1: 5 << 20},
                          upstream=up, poison=True) as r:
        o = r.options
    assert (o["slab_bytes"], o["host_slab_bytes"], o["dedicated_threshold"]) == (8 << 20, 2 << 20, 600 << 10)
    assert o["pack_batches_min_bytes"] == 0 and o["retain_empty_slabs"] == 0 and o["alignment"] == 1024
    assert o["budget_bytes"] == 7 << 20 and o["device_budgets"] == {-1: 3 << 20, 1: 5 << 20}
    assert o["upstream"] is up and o["poison"] is True

    with memcuda.Registry(redis_url, namespace, control_thread=False) as r:
        d = r.options
    assert (d["slab_bytes"], d["host_slab_bytes"], d["dedicated_threshold"]) == (256 << 20, 32 << 20, 0)
    assert (d["pack_batches_min_bytes"], d["alignment"], d["retain_empty_slabs"]) == (64 << 20, 256, 1)
    assert d["budget_bytes"] == 0 and d["device_budgets"] == {} and d["upstream"] is None and d["poison"] is False


@pytest.mark.parametrize("budget", [{"budget_bytes": 2 << 20}, {"device_budgets": {-1: 2 << 20}},
                                    {"budget_bytes": 64 << 20, "device_budgets": {-1: 2 << 20}}])
def test_budget_from_python_is_enforced(redis_url, namespace, clean_env, budget):
    """The allocator of record's pool takes the budget given here (for every
    device, or the host's own, which wins): a create past it raises
    BudgetExceeded, and fits once memory is given back."""
    with memcuda.Registry(redis_url, namespace, default_backend="host", host_slab_bytes=1 << 20, **budget) as r:
        a = r.create("b.a", [900 << 10], "u8")
        b = r.create("b.b", [900 << 10], "u8")
        with pytest.raises(memcuda.BudgetExceeded, match="budget 2097152"):
            r.create("b.c", [900 << 10], "u8")
        with pytest.raises(memcuda.NotFound):
            r.info("b.c")
        a.release()
        r.flush()
        c = r.create("b.c", [900 << 10], "u8")
        del b, c


def test_variables_fill_what_is_left_none(redis_url, namespace, clean_env):
    clean_env.setenv("MEMCUDA_SHARE_REFERENCES", "0")
    clean_env.setenv("MEMCUDA_RELEASE_LINGER_MS", "7")
    clean_env.setenv("MEMCUDA_CUDA_ALLOCATION", "vmm")
    with memcuda.Registry(redis_url, namespace, control_thread=False) as r:
        o = r.options
    assert o["share_references"] is False and o["release_linger"] == 0.007 and o["cuda_allocation"] == "vmm"
    # a keyword wins over its variable
    with memcuda.Registry(redis_url, namespace, control_thread=False, share_references=True, release_linger=0,
                          cuda_allocation="auto") as r:
        o = r.options
    assert o["share_references"] is True and o["release_linger"] == 0 and o["cuda_allocation"] == "auto"
    clean_env.setenv("MEMCUDA_RELEASE_LINGER_MS", "soon")
    with pytest.raises(memcuda.InvalidArgument, match="MEMCUDA_RELEASE_LINGER_MS"):
        memcuda.Registry(redis_url, namespace, control_thread=False)


def test_runtime_dir_and_peer_policy(redis_url, namespace, clean_env):
    """In a child interpreter: the runtime directory and policy are the
    process's, one at a time, so they must not meet this process's registries."""
    # Not pytest's tmp_path: from its tenth run (/tmp/pytest-of-<user>/pytest-10/...)
    # that path is longer than the 63 bytes a runtime_dir may have.
    top = tempfile.mkdtemp(prefix="mc-rt-")
    code = textwrap.dedent(f"""
        import os, memcuda
        url, ns, d = {redis_url!r}, {namespace!r}, {os.path.join(top, "rt")!r}
        with memcuda.Registry(url, ns, control_thread=False, runtime_dir=d + "/", allowed_uids=[1234, 5678],
                              allowed_gids=[]) as r:
            o = r.options
            assert o["runtime_dir"] == d, o
            assert o["allowed_uids"] == [1234, 5678] and o["allowed_gids"] == [], o
            try:  # another directory while the first registry lives
                memcuda.Registry(url, ns, control_thread=False, runtime_dir=d + "2")
                raise SystemExit("a second runtime_dir was accepted")
            except memcuda.InvalidArgument as e:
                assert "runtime_dir" in str(e), e
        os.environ["MEMCUDA_ALLOWED_GIDS"] = "100,101"
        with memcuda.Registry(url, ns, control_thread=False) as r:
            o = r.options
            assert o["runtime_dir"] == "/tmp/memcuda-%d" % os.geteuid(), o
            assert o["allowed_gids"] == [100, 101] and o["allowed_uids"] == [], o
        for bad in ({{"runtime_dir": "rel/dir"}}, {{"allowed_uids": [-1]}}, {{"allowed_gids": "100"}}):
            try:
                memcuda.Registry(url, ns, control_thread=False, **bad)
                raise SystemExit("accepted %r" % (bad,))
            except memcuda.InvalidArgument:
                pass
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr + out.stdout


@pytest.mark.parametrize("kw", [{"cuda_allocation": "cumem"}, {"client_connections": 0},
                                {"waiting_connections": -1}, {"release_linger": 61}, {"release_linger": -1},
                                {"alignment": 300}, {"budget_bytes": -1}, {"slab_bytes": "1M"},
                                {"device_budgets": [1 << 20]}, {"device_budgets": {-2: 1}},
                                {"upstream": object()}])
def test_bad_values_are_refused(redis_url, namespace, clean_env, kw):
    with pytest.raises(memcuda.InvalidArgument):
        memcuda.Registry(redis_url, namespace, control_thread=False, **kw)


def test_share_references_as_redis_counts_it(clean_env, reg, redis_url, namespace):
    made = reg.put("o.t", np.arange(4, dtype=np.float32))
    same = reg.get("o.t")  # sharing on (the fixture's default): the creator's handle, no new reference
    reg.flush()
    assert reg.info("o.t").refcount == 1
    with memcuda.Registry(redis_url, namespace, control_thread=False, share_references=False) as off:
        a, b = off.get("o.t"), off.get("o.t")
        off.flush()
        assert reg.info("o.t").refcount == 3  # one reference per get
        del a, b
        gc.collect()
        off.flush()
    assert reg.info("o.t").refcount == 1
    del made, same


def test_get_many_contract(reg):
    keep = [reg.put(n, np.full(1, i, np.int32)) for i, n in enumerate(("g.a", "g.b", "g.c"))]
    got = reg.get_many(["g.c", "g.a", "g.b"])  # the order given, not name order
    assert [t.name for t in got] == ["g.c", "g.a", "g.b"]
    del got
    assert reg.get_many([]) == []
    with pytest.raises(memcuda.ProtocolError):  # an InvalidArgument: the whole call, nothing taken
        reg.get_many(["g.a", "bad name"])
    with pytest.raises(memcuda.NotFound, match="g.z.missing"):  # the first refused in the order given
        reg.get_many(["g.c", "g.z.missing", "g.a", "g.b.missing"])
    gc.collect()
    reg.flush()
    assert [reg.info(n).refcount for n in ("g.a", "g.b", "g.c")] == [1, 1, 1]
    del keep
