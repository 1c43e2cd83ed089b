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


def test_dlpack_rejects_copy_and_other_devices(reg):
    t = reg.create("i.dl", (2,), "f32")
    assert t.__dlpack_device__() == (1, 0)
    with pytest.raises(BufferError):
        t.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        t.__dlpack__(dl_device=(2, 0))
    with pytest.raises(AttributeError):
        t.__cuda_array_interface__  # noqa: B018 - a host tensor
