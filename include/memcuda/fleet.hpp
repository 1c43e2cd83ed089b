// Several machines on one Redis (RegistryOptions::fleet, MEMCUDA_FLEET=1):
// each node has its own allocator of record, which exposes its memory to
// the other nodes through a byte mover; a get of a tensor of another node
// pulls it once into a replica on the reader's node, shared there zero-copy
// by every process, and taken by later gets while it is current
// (docs/scale-out.md, section 2).
//
// The program that hosts a node's allocator of record includes this header
// and links memcuda::ucx (mem-cuda built with UCX, the default where
// libucx-dev is found): that is what gives its registries UCX as their
// mover. A program without it can read and create on its own node, and its
// node's pulls are served by another process there that has it, or loads
// it as a plugin (libmemcuda_ucx.so, detail/transfer/mover_plugin.hpp) as
// the C library and the Python package do.
#pragma once

#include "memcuda/config.hpp"

// Built without UCX, it gives no mover: the node's allocator of record
// then logs that its tensors cannot be read from other nodes.
#if MEMCUDA_HAS_UCX()
#include "memcuda/detail/transfer/ucx_mover.hpp"
#endif
