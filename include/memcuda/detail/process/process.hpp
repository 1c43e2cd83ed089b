// Process: what mem-cuda keeps once per process, one object made on first
// use and destroyed at exit in the reverse of its parts' order: backends
// (the cache's blocks free through them), fds, conns, open_files, copies,
// events, cache (its last mappings close into fds), releases (destroyed
// first: joining its thread, which uses the rest). Core's constructor
// reaches it, so every registry, even a static one, goes before it; the
// parts' constructors must not call get(). The parts are only named here,
// so that their own headers may include this one; impl/process.ipp defines
// them (docs/design.md, "Lock order" and "The process object").
#pragma once

#include "memcuda/config.hpp"

#include <memory>

#include "memcuda/detail/process/process_options.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

struct Backends;
class FdTable;
class FdConnCache;
class OpenFiles;
class CopyCount;
class EventCache;
class ProcessCache;
class ReleaseQueue;

class Process {
 public:
  static Process& get();
  // Applies fd parking and the import cache settings (each registry made
  // does, so the last one wins); log and faults are fixed at first use.
  void configure(const ProcessOptions& o);

  Backends& backends() noexcept;
  FdTable& fds() noexcept;
  FdConnCache& conns() noexcept;
  OpenFiles& open_files() noexcept;
  CopyCount& copies() noexcept;
#if MEMCUDA_HAS_CUDA()
  EventCache& events() noexcept;  // the interprocess events (CUDA builds only)
#endif
  ProcessCache& cache() noexcept;
  ReleaseQueue& releases() noexcept;

 private:
  Process();
  ~Process();
  struct Parts;
  std::unique_ptr<Parts> parts_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
