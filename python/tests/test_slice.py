"""Sliced reads on the host backend: zero-copy views through NumPy (the array
interface and DLPack) and torch CPU, tp shards, and memcuda.Shard over a
state dict."""
from __future__ import annotations

import numpy as np
import pytest

import memcuda

try:
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (Debian: python3-torch)")


def _put(reg, name, shape=(8, 6)):
    return reg.put(name, np.arange(np.prod(shape), dtype=np.float32).reshape(shape), persistent=True)


def test_slice_views_through_numpy(reg):
    src = np.arange(48, dtype=np.float32).reshape(8, 6)
    _put(reg, "s.w")
    cols = reg.get_slice("s.w", 1, 2, 3)
    assert cols.shape == (8, 3) and cols.strides == (6, 1) and cols.nbytes == 8 * 3 * 4
    a = np.asarray(cols)
    assert a.strides == (24, 4)
    np.testing.assert_array_equal(a, src[:, 2:5])
    np.testing.assert_array_equal(np.from_dlpack(cols), src[:, 2:5])
    a[0, 0] = -1  # zero copy: the tensor's memory
    assert np.asarray(reg.get("s.w"))[0, 2] == -1
    np.testing.assert_array_equal(np.frombuffer(cols.tobytes(), np.float32).reshape(8, 3), a)  # one 2D copy
    inner = cols.slice(0, 2, 3).slice(1, 1)  # composes: rows 2..4, columns 3..4
    np.testing.assert_array_equal(np.asarray(inner), src[2:5, 3:5])
    assert inner.data_ptr == reg.get("s.w").data_ptr + (2 * 6 + 3) * 4


def test_shards_of_every_rank(reg):
    src = np.arange(48, dtype=np.float32).reshape(8, 6)
    _put(reg, "s.tp")
    for world in (1, 2, 4, 8):
        parts = [np.asarray(reg.get_shard("s.tp", 0, r, world)) for r in range(world)]
        np.testing.assert_array_equal(np.concatenate(parts, axis=0), src)
    parts = [np.asarray(reg.get_shard("s.tp", 1, r, 3)) for r in range(3)]
    np.testing.assert_array_equal(np.concatenate(parts, axis=1), src)
    del parts
    reg.flush()
    assert reg.info("s.tp").refcount == 1  # every view (and the arrays over them) released


def test_bad_slices_raise_invalid_argument(reg):
    _put(reg, "m/w", (11, 2))
    with pytest.raises(memcuda.InvalidArgument, match="dimension 0 of 'm/w' is 11, not divisible by world 3"):
        reg.get_shard("m/w", 0, 0, 3)
    with pytest.raises(memcuda.InvalidArgument, match="dimension 2 is out of range"):
        reg.get_slice("m/w", 2, 0)
    t = reg.get("m/w")
    with pytest.raises(memcuda.InvalidArgument, match="does not fit dimension 1"):
        t.slice(1, 1, 5)
    t.release()
    reg.flush()
    assert reg.info("m/w").refcount == 1


@needs_torch
def test_slice_views_through_torch(reg):
    src = torch.arange(48, dtype=torch.float32).reshape(8, 6)
    _put(reg, "s.t")
    v = reg.get_shard("s.t", 1, 1, 2).torch()
    assert v.shape == (8, 3) and v.stride() == (6, 1)
    assert torch.equal(v, src[:, 3:6])


def test_state_dict_shard(reg):
    reg.put_state_dict("llm/", {"l0.qkv.weight": np.arange(32, dtype=np.float32).reshape(8, 4),
                                "l0.o_proj.weight": np.arange(32, dtype=np.float32).reshape(4, 8),
                                "l0.norm": np.ones(4, np.float32)}, persistent=True)
    shard = memcuda.Shard(1, 2, {"*.qkv.weight": 0, "*.weight": 1})
    sd = reg.get_state_dict("llm/", "numpy", shard=shard)
    np.testing.assert_array_equal(sd["l0.qkv.weight"], np.arange(32, dtype=np.float32).reshape(8, 4)[4:])
    np.testing.assert_array_equal(sd["l0.o_proj.weight"], np.arange(32, dtype=np.float32).reshape(4, 8)[:, 4:])
    assert sd["l0.norm"].shape == (4,)
    with pytest.raises(memcuda.InvalidArgument, match=r"'\*.q_proj.weight' matches no tensor"):
        reg.get_state_dict("llm/", shard=memcuda.Shard(0, 2, {"*.q_proj.weight": 0}))
    whole = reg.get_state_dict("llm/", shard=memcuda.Shard(0, 2, {"*.q_proj.weight": 0, "*": None},
                                                           allow_unused=True))
    assert whole["l0.qkv.weight"].shape == (8, 4)


@needs_torch
def test_state_dict_shard_torch(reg):
    reg.put_state_dict("tl/", {"a.weight": torch.arange(24, dtype=torch.float32).reshape(4, 6)}, persistent=True)
    sd = reg.get_state_dict("tl/", "torch", shard=memcuda.Shard(2, 3, {"*.weight": 1}))
    assert torch.equal(sd["a.weight"], torch.arange(24, dtype=torch.float32).reshape(4, 6)[:, 4:])


def test_single_column_shard_copies(reg):
    src = np.arange(48, dtype=np.float32).reshape(8, 6)
    _put(reg, "s.c")
    for r in range(6):
        col = reg.get_shard("s.c", 1, r, 6)
        np.testing.assert_array_equal(np.frombuffer(col.tobytes(), np.float32), src[:, r])


def test_empty_view_at_the_end(reg):
    _put(reg, "s.e", (4, 6))
    v = reg.get_slice("s.e", 0, 4, 0)
    assert v.shape == (0, 6) and v.tobytes() == b""
    assert np.asarray(v).shape == (0, 6)


def test_shard_dims_count_from_the_end(reg):
    reg.put_state_dict("neg/", {"o.weight": np.arange(32, dtype=np.float32).reshape(4, 8),
                                "norm": np.ones(4, np.float32)}, persistent=True)
    src = np.arange(32, dtype=np.float32).reshape(4, 8)
    sd = reg.get_state_dict("neg/", "numpy", shard=memcuda.Shard(1, 2, {"*.weight": -1}))
    np.testing.assert_array_equal(sd["o.weight"], src[:, 4:])  # -1: the last dimension, as in numpy
    sd = reg.get_state_dict("neg/", "numpy", shard=memcuda.Shard(1, 2, {"*.weight": -2}))
    np.testing.assert_array_equal(sd["o.weight"], src[2:])
    sd = reg.get_state_dict("neg/", "numpy", shard=memcuda.Shard(1, 2, {"*.weight": None}))
    np.testing.assert_array_equal(sd["o.weight"], src)  # None: whole
    with pytest.raises(memcuda.InvalidArgument, match=r"'norm'.*dimension -2|dimension -2.*'neg/norm'"):
        reg.get_state_dict("neg/", shard=memcuda.Shard(0, 2, {"norm": -2}))
    with pytest.raises(memcuda.InvalidArgument, match="int or None"):
        memcuda.Shard(0, 2, {"norm": 1.5})


def test_replicas_of_a_host_tensor(reg):
    """Replicas are per CUDA device: a host tensor is refused, and a get
    asking for the local copy gets the tensor itself."""
    _put(reg, "r.w")
    with pytest.raises(memcuda.InvalidArgument):
        reg.replicate("r.w")
    with pytest.raises(memcuda.InvalidArgument):
        reg.replicate("", prefix=True)
    t = reg.get("r.w", local=True)
    assert t.name == "r.w"
    np.testing.assert_array_equal(np.asarray(t), np.arange(48, dtype=np.float32).reshape(8, 6))
    assert reg.drop_replicas("r.w") == 0
    assert reg.drop_replicas("r.", prefix=True) == 0
