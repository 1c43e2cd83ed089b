"""Borrowed tensors (Registry.share): a PyTorch tensor shared by name without a
copy is read by another process (a C++ worker) through the registry; its
data_ptr never changes; plain host tensors are refused with a typed error."""
from __future__ import annotations

import os

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
    from conftest import find_program
    cli = find_program("MEMCUDA_CLI", "build*/tools/memcuda")
    if cli and os.path.exists(cli):  # the record says whose memory it is
        import json
        import subprocess
        out = subprocess.run([cli, "--url", reg.url, "--namespace", reg.namespace, "--json", "info", "sh.t"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert doc["borrowed"] is True and doc["alloc_kind"] == "host_memfd", doc
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


class ForeignArrow:
    """An Arrow producer written from the specification (ctypes structs, no
    Arrow library): a float32 array over a shareable NumPy buffer, exported
    through ``__arrow_c_array__``; its release callback counts its calls."""

    def __init__(self, data, offset=0):
        import ctypes
        from memcuda.arrow import ArrowArray, ArrowSchema, _release_array_t, _release_schema_t
        self.data, self.released = data, 0

        def release_array(p):
            self.released += 1
            ArrowArray.from_address(p).release = _release_array_t()

        def release_schema(p):
            ArrowSchema.from_address(p).release = _release_schema_t()

        self._callbacks = (_release_array_t(release_array), _release_schema_t(release_schema))
        self._bufs = (ctypes.c_void_p * 2)(None, data.ctypes.data)
        self.schema = ArrowSchema(format=b"f", name=b"col", release=self._callbacks[1])
        self.array = ArrowArray(length=data.size - offset, offset=offset, n_buffers=2, buffers=self._bufs,
                                release=self._callbacks[0])
        new = ctypes.pythonapi.PyCapsule_New
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        self._new = new

    def __arrow_c_array__(self, requested_schema=None):
        import ctypes
        return (self._new(ctypes.addressof(self.schema), b"arrow_schema", None),
                self._new(ctypes.addressof(self.array), b"arrow_array", None))


def test_arrow_array_shared_by_name_is_read_by_another_process_and_released(reg, worker_factory):
    data = memcuda.shareable_empty((1000,), "f32", like="numpy")
    data[:] = 2.0
    producer = ForeignArrow(data, offset=10)
    h = reg.share("sh.arrow", producer)
    assert not producer.array.release  # moved out of the producer's struct
    assert h.data_ptr == data.ctypes.data + 40 and h.shape == (990,)  # no copy, its offset kept
    w = worker_factory("--no-control", "--backend", "host")
    assert float(fields(w.cmd("get sh.arrow"))["sum"]) == 2.0 * 990
    w.cmd("release sh.arrow")
    assert producer.released == 0  # our handle still holds it
    del h
    reg.flush()
    wait_for(lambda: producer.released == 1, what="the array's release callback (from a registry thread)")


def test_arrow_array_with_nulls_is_refused_and_released(reg):
    data = memcuda.shareable_empty((8,), "f32", like="numpy")
    producer = ForeignArrow(data)
    producer.array.null_count = 2
    with pytest.raises(memcuda.InvalidArgument, match="2 null"):
        reg.share("sh.nulls", producer)
    assert producer.released == 1
    with pytest.raises(memcuda.NotFound):
        reg.info("sh.nulls")


def test_interpreter_exits_cleanly_with_borrowed_tensors_still_held(redis_url, namespace):
    """Handles of borrowed torch tensors alive at exit, after close() and with
    Redis gone: the registry's threads must not run torch's DLPack deleters
    while the interpreter tears down (that crashed it with SIGSEGV)."""
    import subprocess
    import sys
    import textwrap
    from conftest import REPO
    src = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.join(REPO, 'python')!r})
        import memcuda
        reg = memcuda.Registry({redis_url!r}, {namespace!r}, default_backend="host")
        held = [reg.share(f"exit.{{i}}", memcuda.shareable_empty((64,), "f32")) for i in range(32)]
        reg.close()
    """)
    out = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"exit code {out.returncode}: {out.stderr[-2000:]}"


def test_state_dict_shared_in_one_call_and_all_or_nothing(reg, worker_factory):
    sd = {f"layer{i}.w": memcuda.shareable_empty((16, 16), "f32") for i in range(3)}
    for i, t in enumerate(sd.values()):
        t.fill_(float(i + 1))
    got = reg.share_state_dict("sd/", sd)
    assert sorted(got) == sorted(sd)
    assert all(got[k].data_ptr == sd[k].data_ptr() for k in sd)  # no copy
    w = worker_factory("--no-control", "--backend", "host")
    assert float(fields(w.cmd("get sd/layer2.w"))["sum"]) == 3.0 * 256
    w.cmd("release sd/layer2.w")
    # A plain (malloc'd) tensor in the dict: nothing of it is registered.
    bad = {"a": memcuda.shareable_empty((4,), "f32"), "b": torch.ones(4)}
    with pytest.raises(memcuda.InvalidArgument, match="cannot be shared without a copy"):
        reg.share_state_dict("bad/", bad)
    assert not reg.list("bad/*")
    # A taken name refuses the whole dict.
    with pytest.raises(memcuda.AlreadyExists, match="sd/layer0.w"):
        reg.share_state_dict("sd/", {"new": memcuda.shareable_empty((4,), "f32"), "layer0.w": sd["layer0.w"]})
    reg.flush()
    wait_for(lambda: not reg.list("sd/new"), what="the refused dict's other member to be released")
    del got
