"""Borrowed tensors (Registry.share): a PyTorch tensor shared by name without a
copy is read by another process (a C++ worker) through the registry; its
data_ptr never changes; plain host tensors are refused with a typed error."""
from __future__ import annotations

import numpy as np
import pytest

import memcuda
from conftest import fields, wait_for

torch = pytest.importorskip("torch")


def test_torch_tensor_shared_by_name_is_read_by_another_process(reg, worker_factory):
    t = memcuda.shareable_empty((4, 256), "f32")
    t.fill_(1.5)
    before = t.data_ptr()
    h = reg.share("sh.t", t)
    assert t.data_ptr() == before  # shared as it is: no copy, no move
    assert h.generation > 0 and reg.info("sh.t").refcount == 1
    w = worker_factory("--no-control", "--backend", "host")
    got = fields(w.cmd("get sh.t"))
    assert float(got["sum"]) == 1.5 * 1024
    w.cmd("fill sh.t 2")  # the other process writes the owner's own bytes
    assert bool(torch.all(t == 2.0))
    assert t.data_ptr() == before
    del h
    w.cmd("release sh.t")
    reg.flush()
    wait_for(lambda: "sh.t" not in [i.name for i in reg.list("sh.*")], what="the borrowed record to go")


def test_numpy_shareable_array_round_trips(reg):
    a = memcuda.shareable_empty((8,), "i32", like="numpy")
    a[:] = np.arange(8)
    h = reg.share("sh.n", a)
    assert np.array_equal(np.from_dlpack(reg.get("sh.n")), np.arange(8))
    del h


def test_plain_host_tensor_is_refused_and_nothing_is_registered(reg):
    t = torch.ones(1 << 18)  # malloc'd: no file another process could map
    with pytest.raises(memcuda.InvalidArgument, match="cannot be shared without a copy"):
        reg.share("sh.plain", t)
    with pytest.raises(memcuda.NotFound):
        reg.info("sh.plain")
    with pytest.raises(memcuda.InvalidArgument):
        reg.share("sh.list", [1, 2, 3])
