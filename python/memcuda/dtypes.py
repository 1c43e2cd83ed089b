"""Element types: memcuda's dtype names and their NumPy, PyTorch and array-interface spellings."""
from __future__ import annotations

from typing import Any

from ._lib import lib
from .errors import InvalidArgument

# In the order of memcuda::DType (the values of the C ABI's MEMCUDA_DTYPE_*).
NAMES = ("bool", "u8", "i8", "i16", "i32", "i64", "u16", "u32", "u64", "f16", "bf16", "f32", "f64")
# Bytes per element (memcuda_dtype_itemsize, without a C call).
ITEMSIZE = (1, 1, 1, 2, 4, 8, 2, 4, 8, 2, 2, 4, 8)
# __array_interface__ / __cuda_array_interface__ type strings (bf16 has none).
TYPESTR = ("|b1", "|u1", "|i1", "<i2", "<i4", "<i8", "<u2", "<u4", "<u8", "<f2", None, "<f4", "<f8")
# NumPy names (NumPy has no bfloat16).
NUMPY = ("bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16", None,
         "float32", "float64")
# torch attribute names.
TORCH = ("bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16", "bfloat16",
         "float32", "float64")

DType = Any  # a name ("f32", "float32", "bfloat16"), a numpy dtype or type, or a torch dtype


def code_of(dtype: DType) -> int:
    """The MEMCUDA_DTYPE_* code of a dtype given as a memcuda or NumPy name, a
    NumPy dtype or scalar type, or a torch dtype. Raises InvalidArgument."""
    if isinstance(dtype, str):
        text = dtype
    elif type(dtype).__module__ == "torch":  # torch.float32 -> "torch.float32"
        text = str(dtype).split(".", 1)[-1]
    else:
        try:
            import numpy
            text = numpy.dtype(dtype).name
        except Exception:
            text = str(dtype)
    code = lib.memcuda_dtype_from_name(text.encode())
    if code < 0:
        raise InvalidArgument(f"unknown dtype {dtype!r}; use one of {', '.join(NAMES)} "
                              "(or a NumPy/PyTorch name such as float32, bfloat16)")
    return code


def name_of(code: int) -> str:
    return NAMES[code]


def torch_dtype(code: int):
    """The torch dtype of a code (raises InvalidArgument where this torch lacks it)."""
    import torch
    dt = getattr(torch, TORCH[code], None)
    if dt is None:
        raise InvalidArgument(f"torch {torch.__version__} has no {TORCH[code]} dtype")
    return dt
