// A float buffer in a MAP_SHARED memfd mapping: host memory
// TensorRegistry::share (and the Arrow import) can lend without a copy.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstddef>
#include <memory>

#include "memcuda/share_options.hpp"

namespace memcuda::test {

// The buffer, and a flag its keep-alive sets when the registry lets go of it.
struct MemfdBuffer {
  int fd = -1;
  float* p = nullptr;
  std::size_t n = 0;
  std::shared_ptr<std::atomic<bool>> dropped = std::make_shared<std::atomic<bool>>(false);
  explicit MemfdBuffer(std::size_t count, float v) : n(count) {
    fd = ::memfd_create("test-borrow", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, static_cast<off_t>(n * sizeof(float))) == 0);
    void* m = ::mmap(nullptr, n * sizeof(float), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    REQUIRE(m != MAP_FAILED);
    p = static_cast<float*>(m);
    std::fill_n(p, n, v);
  }
  ~MemfdBuffer() {
    ::munmap(p, n * sizeof(float));
    ::close(fd);
  }
  ShareOptions options() const {
    ShareOptions o;
    auto flag = dropped;
    o.keep_alive = std::shared_ptr<void>(static_cast<void*>(p), [flag](void*) { flag->store(true); });
    return o;
  }
};

}  // namespace memcuda::test
