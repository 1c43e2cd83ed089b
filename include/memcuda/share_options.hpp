// Options of TensorRegistry::share (registering a buffer this process
// already has, without a copy) and the error it raises for memory that
// cannot be shared that way. docs/design.md, "Borrowed tensors".
#pragma once

#include "memcuda/config.hpp"

#include <memory>
#include <string>

#include "memcuda/dtype.hpp"
#include "memcuda/error.hpp"
#include "memcuda/shape.hpp"

MEMCUDA_NAMESPACE_BEGIN

struct ShareOptions {
  // Kept by the registry until the last reference to the shared tensor is
  // gone (this process's handles and every other process's), or this
  // process exits: give it the object that owns the buffer (a framework
  // tensor, a custom deleter), so the buffer cannot go while others read it.
  std::shared_ptr<void> keep_alive;
  // Also held by its name: the tensor (and keep_alive) stays until remove()
  // and the last release, or until this process exits.
  bool persistent = false;
};

// One buffer of TensorRegistry::share_many: share()'s arguments.
struct ShareRequest {
  std::string name;
  void* data = nullptr;
  DType dtype = DType::u8;
  Shape shape;
  ShareOptions opts;
};

// The memory cannot be shared without a copy: plain malloc'd (anonymous)
// memory, a private mapping, a file that cannot be sealed against resizing,
// device memory of an allocator that cannot export it. The message says
// why and what to do instead (copy it into registry memory, or allocate it
// shareable). On the wire and in C it is an InvalidArgument.
class NotShareable final : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

MEMCUDA_NAMESPACE_END  // namespace memcuda
