// The process object (detail/process/process.hpp).
#pragma once

#include "memcuda/detail/backend/borrow.hpp"
#include "memcuda/detail/backend/process_cache.hpp"
#include "memcuda/detail/backend/select.hpp"
#include "memcuda/detail/base/copy_count.hpp"
#include "memcuda/detail/cuda/ipc_event.hpp"
#include "memcuda/detail/fd/fd_conn_cache.hpp"
#include "memcuda/detail/fd/fd_table.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/detail/registry/release_queue.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

struct Process::Parts {  // destroyed bottom up (process.hpp says why)
  Backends backends;
  FdTable fds;
  FdConnCache conns;
  OpenFiles open_files;
  CopyCount copies;
#if MEMCUDA_HAS_CUDA()
  EventCache events;
#endif
  ProcessCache cache;
  ReleaseQueue releases;
};

Process& Process::get() {
  static Process p;  // the one process-wide object
  return p;
}
Process::Process() : parts_(std::make_unique<Parts>()) {}
Process::~Process() = default;

void Process::configure(const ProcessOptions& o) {
  parts_->fds.configure(o.fd_prefetch, o.fd_park_window);
  parts_->cache.set_idle_limit(o.import_cache);
}

Backends& Process::backends() noexcept { return parts_->backends; }
FdTable& Process::fds() noexcept { return parts_->fds; }
FdConnCache& Process::conns() noexcept { return parts_->conns; }
OpenFiles& Process::open_files() noexcept { return parts_->open_files; }
CopyCount& Process::copies() noexcept { return parts_->copies; }
#if MEMCUDA_HAS_CUDA()
EventCache& Process::events() noexcept { return parts_->events; }
#endif
ProcessCache& Process::cache() noexcept { return parts_->cache; }
ReleaseQueue& Process::releases() noexcept { return parts_->releases; }

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
