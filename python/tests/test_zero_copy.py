"""Zero copy or an error (docs/python.md): where a view cannot be had the call
raises NotZeroCopy saying why; allow_copy=True copies instead, warns
(ZeroCopyWarning) and counts it in stats(); without it nothing is copied."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import memcuda
from memcuda.errors import NotZeroCopy, Unavailable, ZeroCopyWarning

try:
    import torch
except ImportError:  # pragma: no cover - the CI interpreter has torch
    torch = None

BF16_BITS = np.array([0x3F80, 0xC000, 0x4049, 0x0000], dtype=np.uint16)  # 1.0, -2.0, 3.140625, 0.0
BF16_VALUES = np.array([1.0, -2.0, 3.140625, 0.0], dtype=np.float32)


def _bf16(reg, name):
    t = reg.create(name, (2, 2), "bf16")
    t.copy_from_host(BF16_BITS.ctypes.data, BF16_BITS.nbytes)
    return t


def _copies(reg):
    s = reg.stats()
    return s.copies, s.copied_bytes


def test_not_zero_copy_is_an_unavailable_with_its_own_code():
    assert issubclass(NotZeroCopy, Unavailable) and NotZeroCopy.name == "not_zero_copy"
    assert memcuda.NotZeroCopy is NotZeroCopy and NotZeroCopy.code == 21


def test_numpy_of_a_host_tensor_is_a_view_and_copies_nothing(reg):
    t = reg.put("zc.f", np.arange(6, dtype=np.float32))
    before = _copies(reg)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ZeroCopyWarning)
        a = reg.get("zc.f").numpy()
        b = reg.get("zc.f").numpy(allow_copy=True)  # a view is had: allow_copy changes nothing
    a[2] = 42.0
    assert t.numpy()[2] == 42.0 and b[2] == 42.0
    assert a.ctypes.data == t.data_ptr == b.ctypes.data
    assert _copies(reg) == before


def test_bf16_to_numpy_is_not_zero_copy_unless_asked(reg):
    t = _bf16(reg, "zc.bf")
    before = _copies(reg)
    with pytest.raises(NotZeroCopy, match=r"tensor 'zc.bf' is bf16: NumPy has no bfloat16.*allow_copy=True"):
        t.numpy()
    # numpy.asarray used to give a 0-d object array here, silently.
    with pytest.raises(NotZeroCopy, match="NumPy has no bfloat16"):
        np.asarray(t)
    assert _copies(reg) == before  # refusing copies nothing
    with pytest.warns(ZeroCopyWarning, match=r"copied 8 bytes of tensor 'zc.bf'.*NumPy cannot view bfloat16"):
        a = t.numpy(allow_copy=True)
    assert a.dtype == np.float32 and a.shape == (2, 2)
    assert np.array_equal(a.ravel(), BF16_VALUES)
    assert _copies(reg) == (before[0] + 1, before[1] + 8)
    a[0, 0] = 5.0  # a copy: the tensor is untouched
    back = np.frombuffer(t.tobytes(), dtype=np.uint16)
    assert np.array_equal(back, BF16_BITS)


def test_get_state_dict_numpy_refuses_bf16_and_copies_when_allowed(reg):
    held = [reg.put("sd.w", np.ones(3, dtype=np.float32)), _bf16(reg, "sd.b")]
    before = _copies(reg)
    with pytest.raises(NotZeroCopy, match="tensor 'sd.b' is bf16"):
        reg.get_state_dict("sd.", framework="numpy")
    assert _copies(reg) == before
    with pytest.warns(ZeroCopyWarning):
        got = reg.get_state_dict("sd.", framework="numpy", allow_copy=True)
    assert np.array_equal(got["b"].ravel(), BF16_VALUES) and np.array_equal(got["w"], np.ones(3, np.float32))
    assert _copies(reg) == (before[0] + 1, before[1] + 8)  # only the bf16 one was copied
    del held


def test_check_device_of_a_host_tensor(reg):
    t = reg.put("zc.h", np.zeros(4, dtype=np.int32))
    t.check_device(-1)
    t.check_device("cpu")
    with pytest.raises(NotZeroCopy, match=r"tensor 'zc.h' is host memory.*CUDA device 0 cannot read it in place"):
        t.check_device(0)
    with pytest.raises(NotZeroCopy, match="CUDA device 3"):
        t.check_device("cuda:3")
    with pytest.raises(memcuda.InvalidArgument):
        t.check_device("tpu")


def test_the_c_stats_struct_of_another_size_is_refused(reg):
    """A struct_size other than the library's (a header and library that
    differ) is refused, nothing written; the library's own is filled."""
    import ctypes
    from memcuda._lib import StatsC, lib
    s = StatsC()
    lib.memcuda_stats_init(ctypes.byref(s))
    assert lib.memcuda_stats_get(reg._handle(), ctypes.byref(s)) == 0
    assert s.struct_size == ctypes.sizeof(StatsC) and s.copies != 12345
    for size in (StatsC.copies.offset, ctypes.sizeof(StatsC) + 8):
        s.struct_size = size
        s.copies = 12345
        assert lib.memcuda_stats_get(reg._handle(), ctypes.byref(s)) == memcuda.InvalidArgument.code
        assert s.struct_size == size and s.copies == 12345


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_a_dtype_torch_lacks_is_not_zero_copy(reg):
    if getattr(torch, "uint16", None) is not None:
        pytest.skip(f"torch {torch.__version__} has uint16")
    t = reg.put("zt.u", np.arange(4, dtype=np.uint16))
    with pytest.raises(NotZeroCopy, match=rf"tensor 'zt.u' is u16: torch {torch.__version__} has no uint16"):
        t.torch()
    with pytest.raises(NotZeroCopy, match="tensor 'zt.u' is u16"):
        reg.get_state_dict("zt.", framework="torch")
    # The other dtypes still come as views.
    f = reg.put("zv.f", np.arange(4, dtype=np.float32))
    v = reg.get_state_dict("zv.", framework="torch")["f"]
    assert v.data_ptr() == f.data_ptr


@pytest.mark.gpu
@pytest.mark.skipif(not memcuda.has_cuda(), reason="libmemcuda_c was built without the CUDA backend")
def test_cuda_tensor_to_numpy_is_not_zero_copy_unless_asked(redis_url, namespace):
    if torch is None or not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    with memcuda.Registry(redis_url, namespace, default_backend="cuda") as reg:
        src = torch.arange(256, dtype=torch.float32, device="cuda")
        t = reg.put("zg.x", src)
        torch.cuda.synchronize()
        before = _copies(reg)
        with pytest.raises(NotZeroCopy, match=r"device memory on CUDA device 0.*numpy\(allow_copy=True\)"):
            t.numpy()
        with pytest.raises(NotZeroCopy):
            np.asarray(t)
        with pytest.raises(NotZeroCopy, match="host code cannot dereference it"):
            t.check_device("cpu")
        t.check_device(0)
        assert _copies(reg) == before
        with pytest.warns(ZeroCopyWarning, match="NumPy cannot view device memory"):
            a = t.numpy(allow_copy=True)
        assert np.array_equal(a, np.arange(256, dtype=np.float32))
        assert _copies(reg) == (before[0] + 1, before[1] + 1024)
