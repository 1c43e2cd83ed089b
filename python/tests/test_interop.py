"""Zero-copy interop on the host backend: NumPy (DLPack and the array
interface) and PyTorch (CPU; bf16 and f16 included)."""
from __future__ import annotations

import gc

import numpy as np
import pytest


try:
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (Debian: python3-torch)")


def test_numpy_from_dlpack_is_zero_copy(reg):
    t = reg.create("i.np", (5, 7), "f64")
    a = np.from_dlpack(t)
    assert a.ctypes.data == t.data_ptr
    assert a.shape == (5, 7) and a.dtype == np.float64
    b = np.asarray(t)  # the array interface: writable, same memory
    assert b.ctypes.data == t.data_ptr and b.flags.writeable
    b[...] = 4
    assert np.all(a == 4)


def test_numpy_f16_and_every_numpy_dtype(reg):
    for name in ("bool", "u8", "i8", "i16", "i32", "i64", "u16", "u32", "u64", "f16", "f32", "f64"):
        src = (np.arange(6) % 2).astype(np.dtype({"bool": "bool", "u8": "u1", "i8": "i1", "i16": "i2", "i32": "i4",
                                                  "i64": "i8", "u16": "u2", "u32": "u4", "u64": "u8",
                                                  "f16": "f2", "f32": "f4", "f64": "f8"}[name]))
        t = reg.put("i.dt." + name, src)
        assert t.dtype == name
        assert np.array_equal(np.asarray(t), src) and np.asarray(t).dtype == src.dtype


def test_bf16_has_no_numpy_view(reg):
    t = reg.create("i.bf", (4,), "bf16")
    with pytest.raises(AttributeError):
        t.__array_interface__  # noqa: B018 - NumPy has no bfloat16


@needs_torch
def test_torch_from_dlpack_zero_copy_and_release(reg):
    reg.put("i.t", np.arange(6, dtype=np.float32), persistent=True).release()
    t = reg.get("i.t")
    x = torch.from_dlpack(t)
    assert x.data_ptr() == t.data_ptr and x.dtype == torch.float32 and x.device.type == "cpu"
    x.mul_(2)  # torch's view writes into the shared memory
    assert np.array_equal(np.asarray(t), np.arange(6, dtype=np.float32) * 2)
    del t
    gc.collect()
    reg.flush()
    assert reg.info("i.t").refcount == 2  # x still holds this process's reference
    del x
    gc.collect()
    reg.flush()
    assert reg.info("i.t").refcount == 1


@needs_torch
def test_bf16_and_f16_through_torch(reg):
    for dt in (torch.bfloat16, torch.float16):
        src = torch.linspace(-3, 3, 12, dtype=torch.float32).to(dt).reshape(3, 4)
        name = "i." + str(dt).split(".")[1]
        t = reg.put(name, src)
        assert t.dtype == {torch.bfloat16: "bf16", torch.float16: "f16"}[dt]
        y = torch.from_dlpack(reg.get(name, dtype=dt))
        assert y.dtype == dt and torch.equal(y, src)
        assert y.data_ptr() == t.data_ptr


@needs_torch
def test_torch_state_dict(reg):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    sd = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    handles = reg.put_state_dict("m.", sd)
    got = reg.get_state_dict("m.", framework="torch")
    assert sorted(got) == sorted(sd)
    for k, v in sd.items():
        assert got[k].dtype == torch.bfloat16 and torch.equal(got[k], v)
    assert len(handles) == len(sd)


@needs_torch
def test_torch_state_dict_is_one_import_per_allocation(reg):
    # 68 MiB in all: create_many packs the batch into one allocation
    # (PoolOptions::pack_batches_min_bytes, 64 MiB), so every view below is
    # cut from one DLPack import (tensor.torch_views).
    sd = {"a": torch.arange(12, dtype=torch.float32).reshape(3, 4),
          "b": torch.tensor([True, False, True]),
          "c": torch.tensor(7, dtype=torch.int64),
          "d": torch.linspace(0, 1, 5).to(torch.bfloat16),
          "e": torch.full((2, 3), 1.5, dtype=torch.float16),
          "empty": torch.zeros((0, 4), dtype=torch.float32),
          "big": torch.arange(17 * 2**20, dtype=torch.int32)}
    made = reg.put_state_dict("v.", sd, persistent=True)
    bases = {made[k]._base for k in sd}
    assert len(bases) == 1  # packed: one allocation
    ptrs = {k: made[k].data_ptr for k in sd}
    del made
    gc.collect()
    reg.flush()
    # The name's reference, and the pin of the state-dict record put_state_dict linked.
    assert all(reg.info("v." + k).refcount == 2 for k in sd)

    got = reg.get_state_dict("v.", framework="torch")
    assert sorted(got) == sorted(sd)
    for k, v in sd.items():
        want = v.to(torch.uint8) if v.dtype == torch.bool else v  # bool travels as uint8 (DLPack 0.6)
        assert got[k].dtype == want.dtype and got[k].shape == want.shape, k
        assert torch.equal(got[k], want), k
        assert got[k].is_contiguous() and (got[k].numel() == 0 or got[k].data_ptr() == ptrs[k]), k  # zero copy
    got["a"][1, 2] = -1  # a view writes the shared memory
    assert reg.get("v.a").numpy()[1, 2] == -1
    reg.flush()
    assert all(reg.info("v." + k).refcount == 2 for k in sd)  # one reference, on the record: members unmoved
    del got
    gc.collect()

    # A remove unlinks the record: the next open goes name by name (a
    # reference per tensor), its views still hold them together.
    reg.remove("v.empty")
    reg.flush()
    reg.collect_garbage()  # nobody held the record, so the remove deleted it: GC drops its pins now
    assert all(reg.info("v." + k).refcount == 1 for k in sd if k != "empty")
    got = reg.get_state_dict("v.", framework="torch")
    assert sorted(got) == sorted(k for k in sd if k != "empty")
    reg.flush()
    assert reg.info("v.a").refcount == 2  # its name, and this open's own
    keep = got["c"]
    del got
    gc.collect()
    reg.flush()
    assert reg.info("v.a").refcount == 2  # one view alive keeps the whole import (documented)
    del keep
    gc.collect()
    reg.flush()
    assert all(reg.info("v." + k).refcount == 1 for k in sd if k != "empty")
    for k in sd:
        if k != "empty":
            reg.remove("v." + k)


def test_dlpack_rejects_copy_and_other_devices(reg):
    t = reg.create("i.dl", (2,), "f32")
    assert t.__dlpack_device__() == (1, 0)
    with pytest.raises(BufferError):
        t.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        t.__dlpack__(dl_device=(2, 0))
    with pytest.raises(AttributeError):
        t.__cuda_array_interface__  # noqa: B018 - a host tensor
