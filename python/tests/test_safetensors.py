"""Registry.put_safetensors: a safetensors file published in pieces (host backend here)."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest

import memcuda


def write_safetensors(path, arrays, header=None):
    """The format's rules: an 8-byte little-endian header length, the JSON header, the data."""
    codes = {np.float32: "F32", np.int64: "I64", np.float16: "F16", np.uint8: "U8"}
    meta, data = {"__metadata__": {"format": "np"}}, b""
    for name, a in arrays.items():
        b = np.ascontiguousarray(a).tobytes()
        meta[name] = {"dtype": codes[a.dtype.type], "shape": list(a.shape), "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    text = (header if header is not None else json.dumps(meta)).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return str(path)


def test_put_safetensors_reads_the_file_in_pieces(reg, tmp_path):
    arrays = {"layers.0.weight": np.arange(300 * 1000, dtype=np.float32).reshape(300, 1000),
              "ids": np.arange(-50, 50, dtype=np.int64), "norm": np.full((8, 8), 0.5, dtype=np.float16)}
    path = write_safetensors(tmp_path / "m.safetensors", arrays)
    got = reg.put_safetensors("st/", path, staging_bytes=8192, persistent=True)
    assert sorted(got) == sorted(arrays)
    for name, a in arrays.items():
        t = got[name]
        assert (t.shape, t.backend) == (a.shape, "host")
        assert np.array_equal(t.numpy(), a)
    # A persistent publish links a state-dict record: the open is one reference.
    sd = reg.get_state_dict("st/", framework="numpy")
    assert np.array_equal(sd["layers.0.weight"], arrays["layers.0.weight"])


def test_put_safetensors_errors_are_typed_and_leave_nothing(reg, tmp_path):
    good = {"w": np.arange(4, dtype=np.float32)}
    bad = write_safetensors(tmp_path / "bad.safetensors", good,
                            header=json.dumps({"w": {"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}}))
    with pytest.raises(memcuda.InvalidArgument, match="need 20"):
        reg.put_safetensors("bad/", bad)
    with pytest.raises(memcuda.NotFound):
        reg.put_safetensors("none/", str(tmp_path / "missing.safetensors"))
    with pytest.raises(memcuda.InvalidArgument, match="staging_bytes"):
        reg.put_safetensors("small/", write_safetensors(tmp_path / "g.safetensors", good), staging_bytes=100)
    assert reg.list("bad/*") == [] and reg.list("small/*") == []
