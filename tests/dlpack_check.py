"""Imports a mem-cuda tensor into PyTorch through DLPack and prints one line.

usage: dlpack_check.py LIBPROBE.so REDIS_URL NAME
"""
import ctypes
import gc
import sys

import torch
import torch.utils.dlpack

lib = ctypes.CDLL(sys.argv[1])
lib.memcuda_probe_open.restype = ctypes.c_void_p
lib.memcuda_probe_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
lib.memcuda_probe_refcount.restype = ctypes.c_longlong
lib.memcuda_probe_refcount.argtypes = [ctypes.c_char_p]
name = sys.argv[3].encode()
ptr = lib.memcuda_probe_open(sys.argv[2].encode(), name)
if not ptr:
    print("ERR memcuda_probe_open failed", flush=True)
    sys.exit(1)
new_capsule = ctypes.pythonapi.PyCapsule_New
new_capsule.restype = ctypes.py_object
new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
t = torch.utils.dlpack.from_dlpack(new_capsule(ptr, b"dltensor", None))
held = lib.memcuda_probe_refcount(name)
s = t.double().sum().item()
shape = list(t.shape)
dev = str(t.device)
del t
gc.collect()
after = lib.memcuda_probe_refcount(name)
print(f"OK sum={int(s)} shape={shape} device={dev} refcount_held={held} refcount_after={after}", flush=True)
