"""A/B model versions from Python (memcuda/model_versions.py): a producer
stages the next version in a second set of tensors and commits; readers keep
their version until they advance. Real redis-server, host backend."""
from __future__ import annotations

import numpy as np
import pytest

import memcuda
from conftest import fields


def test_publish_open_advance(reg):
    assert reg.publish_model("ab/", {"w": np.full(16, 1, np.float32), "b": np.arange(4, dtype=np.int64)}) == 1
    with reg.open_model("ab/", framework="numpy") as m:
        assert m.version == 1 and sorted(m.tensors) == ["b", "w"]
        assert float(m.tensors["w"].sum()) == 16
        with reg.begin_model_version("ab/", {"w": ((16,), "float32"), "b": ((4,), "int64")}) as w:
            assert w.version == 2 and sorted(w.tensors) == ["b", "w"]
            w.tensors["w"].numpy()[:] = 2
            w.tensors["b"].numpy()[:] = 7
            assert w.commit() == 2
        # pinned: still version 1's bytes
        assert m.version == 1 and float(m.tensors["w"].sum()) == 16
        assert m.latest() == 2
        assert m.advance() is True
        assert m.version == 2 and float(m.tensors["w"].sum()) == 32 and list(m.tensors["b"]) == [7] * 4
        assert m.advance() is False
    assert reg.current_version("ab/") == 2


def test_limit_abort_and_bad_input(reg):
    reg.publish_model("lim/", {"w": np.zeros(4, np.float32)})
    m = reg.open_model("lim/")
    reg.publish_model("lim/", {"w": np.ones(4, np.float32)})
    # version 1 (pinned) and 2 have memory: a third is refused, nothing staged
    with pytest.raises(memcuda.BudgetExceeded):
        reg.publish_model("lim/", {"w": np.ones(4, np.float32)})
    # an exception inside the writer's block aborts it
    with pytest.raises(RuntimeError):
        with reg.begin_model_version("lim/", {"w": np.ones(4, np.float32)}, max_versions=3):
            raise RuntimeError("boom")
    assert reg.current_version("lim/") == 2
    assert reg.publish_model("lim/", {"w": np.full(4, 3, np.float32)}, max_versions=3) == 3
    assert m.advance() and m.version == 3
    m.close()
    with pytest.raises(memcuda.InvalidArgument):
        reg.begin_model_version(".memcuda-ab/x", {"w": np.ones(4, np.float32)})
    with pytest.raises(memcuda.NotFound):
        reg.open_model("nothing/")
    with pytest.raises(memcuda.InvalidArgument):
        reg.open_model("lim/", framework="jax")


def test_replicas_of_a_host_version_and_a_local_open(reg):
    """Replicas are per CUDA device: a host version cannot ask for them, and a
    local open of a version without replicas is the plain open."""
    with pytest.raises(memcuda.InvalidArgument):
        reg.publish_model("lr/", {"w": np.ones(4, np.float32)}, backend="host", replicas=[0])
    assert reg.publish_model("lr/", {"w": np.full(4, 5, np.float32)}, backend="host") == 1
    with reg.open_model("lr/", framework="numpy", local=True) as m:
        assert m.version == 1 and list(m.tensors["w"]) == [5] * 4
        assert reg.publish_model("lr/", {"w": np.full(4, 6, np.float32)}, backend="host") == 2
        assert m.advance() and list(m.tensors["w"]) == [6] * 4


def test_cpp_reader_pinned_across_a_flip(reg, worker_factory):
    reg.publish_model("x/", {"w": np.full(16, 1, np.float32)})
    r = worker_factory("--no-control", "--backend", "host")
    assert fields(r.cmd("openmodel x/")) == {"version": "1", "sum": "16"}
    reg.publish_model("x/", {"w": np.full(16, 2, np.float32)})
    assert fields(r.cmd("sumpinned x/")) == {"version": "1", "sum": "16"}
    assert fields(r.cmd("advance x/")) == {"moved": "1", "version": "2", "sum": "32"}


def test_torch_views(reg):
    torch = pytest.importorskip("torch")
    reg.publish_model("t/", {"w": torch.full((2, 3), 1.0)})
    m = reg.open_model("t/", framework="torch")
    assert torch.equal(m.tensors["w"], torch.full((2, 3), 1.0))
    w = reg.begin_model_version("t/", {"w": ((2, 3), torch.float32)})
    w.torch()["w"].fill_(5.0)
    assert w.commit() == 2
    assert torch.equal(m.tensors["w"], torch.full((2, 3), 1.0))
    assert m.advance()
    assert torch.equal(m.tensors["w"], torch.full((2, 3), 5.0))
    m.close()
