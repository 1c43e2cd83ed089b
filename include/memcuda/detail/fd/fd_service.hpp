// FdService: this process's FdServer and the small thread that serves it,
// one per process, shared by every registry and allocation: a fd is served
// as long as its allocation lives, past the registry that made it
// (docs/fd-transfer.md, "The fd service", says when it starts and stops
// and where its socket is). The thread only answers fd requests and never
// talks to Redis, so joining it is quick. The runtime directory and peer
// policy (FdAccess) are the process's: every registry pins the same ones
// while it lives (pin()).
#pragma once

#include "memcuda/config.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "memcuda/detail/base/log.hpp"
#include "memcuda/detail/fd/fd_access.hpp"
#include "memcuda/detail/fd/fd_server.hpp"
#include "memcuda/detail/fd/fd_socket_dir.hpp"
#include "memcuda/detail/fd/fd_source.hpp"
#include "memcuda/detail/fd/unique_fd.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class FdService : public std::enable_shared_from_this<FdService> {
 public:
  // One entry: an fd this process serves, the key of the allocation it
  // belongs to (the allocations Hash field) and the session that publishes
  // it ("" until one does: an adopted allocation before its record moved).
  struct Entry {
    std::uint64_t id = 0;
    std::string tag;
    std::string key;
    ServedSource source;
  };

  // The process's service, started on first use with the process's
  // FdAccess (access()). Throws FdTransferError when the runtime directory
  // is refused (runtime_dir) or the socket cannot be made.
  static std::shared_ptr<FdService> acquire() {
    auto& st = fd_service_state();
    std::lock_guard lk(st.mu);
    if (auto s = st.current.lock()) return s;
    FdAccess a = st.access_locked();
    prepare_runtime_dir(a);
    sweep_stale_sockets(a.runtime_dir);
    auto s = std::shared_ptr<FdService>(new FdService(std::move(a)));
    st.current = s;
    return s;
  }
  // The running service, or null (starts nothing).
  static std::shared_ptr<FdService> existing() {
    auto& st = fd_service_state();
    std::lock_guard lk(st.mu);
    return st.current.lock();
  }

  // The process's FdAccess: the one pinned, else the default (the default
  // runtime directory, own uid only). A reader checks fd sources against
  // its runtime directory.
  static FdAccess access() {
    auto& st = fd_service_state();
    std::lock_guard lk(st.mu);
    if (auto s = st.current.lock()) return s->access_;
    return st.access_locked();
  }

  // Makes `a` the process's FdAccess while the returned handle lives (each
  // registry holds one). Throws InvalidArgument when another is pinned, or
  // a service still runs with another (a tensor of a closed registry keeps
  // it): one runtime directory and peer policy per process at a time.
  static std::shared_ptr<void> pin(FdAccess a) {
    a.runtime_dir = normalize_runtime_dir(a.runtime_dir);
    auto& st = fd_service_state();
    std::lock_guard lk(st.mu);
    auto running = st.current.lock();
    const FdAccess* other = running && !(running->access_ == a) ? &running->access_
                            : st.pins && !(st.pinned == a)      ? &st.pinned
                                                                : nullptr;
    if (other)
      throw InvalidArgument("this process's fd server already uses runtime directory '" + other->runtime_dir +
                            "' serving " + describe_policy(*other) + "; a registry asks for '" + a.runtime_dir +
                            "' serving " + describe_policy(a) +
                            ": every registry of a process must use the same runtime_dir, allowed_uids and "
                            "allowed_gids");
    st.pinned = std::move(a);
    ++st.pins;
    return std::shared_ptr<void>(nullptr, [](void*) {
      auto& q = fd_service_state();
      std::lock_guard l(q.mu);
      --q.pins;
    });
  }

  ~FdService() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }
  FdService(const FdService&) = delete;
  FdService& operator=(const FdService&) = delete;

  const std::string& address() const noexcept { return server_.address(); }

  // Serves `fd` (owned from now on) for the allocation `key`; returns the
  // entry's id. Thread-safe.
  std::uint64_t serve(UniqueFd fd, std::string key, std::string tag) {
    std::lock_guard lk(mu_);
    const std::uint64_t id = next_id_++;
    Entry e;
    e.id = id;
    e.tag = std::move(tag);
    e.key = std::move(key);
    e.source.id = id;
    e.source.source = FdSource{server_.address(), ::getpid(), fd.get(), fd_identity(fd.get())};
    server_.add(id, fd.get(), e.key);
    fds_.emplace(id, std::move(fd));
    entries_.emplace(id, std::move(e));
    ++version_;
    return id;
  }

  // Stops serving `id` and closes its fd (the memory goes once no other
  // process holds an fd or a mapping of it). Thread-safe, idempotent.
  void withdraw(std::uint64_t id) noexcept {
    UniqueFd doomed;
    {
      std::lock_guard lk(mu_);
      server_.remove(id);  // after this the server never touches the fd
      if (auto it = fds_.find(id); it != fds_.end()) {
        doomed = std::move(it->second);
        fds_.erase(it);
      }
      if (entries_.erase(id)) ++version_;
    }
  }

  // Names the session that publishes `id` (an adopted allocation, once its
  // records name this process).
  void retag(std::uint64_t id, const std::string& tag) {
    std::lock_guard lk(mu_);
    if (auto it = entries_.find(id); it != entries_.end() && it->second.tag != tag) {
      it->second.tag = tag;
      ++version_;
    }
  }

  ServedSource source(std::uint64_t id) const {
    std::lock_guard lk(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) throw InternalError("fd service: no entry " + std::to_string(id));
    return it->second.source;
  }

  // The entries `tag` publishes. Thread-safe (a copy).
  std::vector<Entry> entries(const std::string& tag) const {
    std::lock_guard lk(mu_);
    std::vector<Entry> v;
    for (const auto& [id, e] : entries_)
      if (e.tag == tag) v.push_back(e);
    return v;
  }

  // Bumped by every serve/withdraw/retag: publishers compare it to skip work.
  std::uint64_t version() const {
    std::lock_guard lk(mu_);
    return version_;
  }
  std::size_t size() const {
    std::lock_guard lk(mu_);
    return entries_.size();
  }
  std::uint64_t served() const noexcept { return server_.served(); }
  std::uint64_t refused() const noexcept { return server_.refused(); }
  // Requests answered, and fds sent along unasked (fd_wire.hpp).
  std::uint64_t requests() const noexcept { return server_.requests(); }
  std::uint64_t offered() const noexcept { return server_.offered(); }

 private:
  explicit FdService(FdAccess a)
      : access_(std::move(a)), server_(server_options(access_)) {
    thread_ = std::thread([this] { loop(); });
  }

  static FdServerOptions server_options(const FdAccess& a) {
    FdServerOptions o;
    o.address = make_address(a.runtime_dir);
    o.access = a;
    return o;
  }

  static std::string make_address(const std::string& dir) {
    std::random_device rd;
    std::uint64_t r = (std::uint64_t{rd()} << 32) ^ rd();
    return dir + "/" + socket_name(::getpid(), pid_namespace_inode(), r);
  }

  void loop() {
    int failures = 0;
    std::uint64_t refusals = 0;
    for (;;) {
      try {
        const ServeResult r = server_.serve_once(std::chrono::milliseconds(1000));
        if (r == ServeResult::stopped) return;
        // The server side of a refused peer (the peer has it too), at warn;
        // a peer that keeps trying is logged at first and then every 100th
        // time. Other errors answered (an unknown id: a stale record) at debug.
        if (r == ServeResult::refused) {
          std::string why = server_.last_error();
          const bool creds = why.starts_with("refused: ");
          if (!creds) log(LogLevel::debug, "fd service at '" + server_.address() + "': " + why);
          else if (++refusals <= 10 || refusals % 100 == 0)
            log(LogLevel::warn, "fd service at '" + server_.address() + "': " + why);
        }
        failures = 0;
      } catch (const std::exception& e) {  // poll() failed: should not happen; do not spin
        if (++failures <= 3) log(LogLevel::warn, std::string("fd service: ") + e.what());
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  }

  const FdAccess access_;
  FdServer server_;
  std::thread thread_;
  mutable std::mutex mu_;  // leaf: guards the maps and counters; never held across a wait
  std::uint64_t next_id_ = 1;
  std::uint64_t version_ = 0;
  std::unordered_map<std::uint64_t, UniqueFd> fds_;
  std::unordered_map<std::uint64_t, Entry> entries_;
};

// An fd served for one allocation: withdrawn (and closed) by withdraw() or
// the destructor, whichever comes first. Keeps the service alive.
class ServedFd {
 public:
  ServedFd(std::shared_ptr<FdService> svc, UniqueFd fd, std::string key, std::string tag)
      : svc_(std::move(svc)), id_(svc_->serve(std::move(fd), std::move(key), std::move(tag))) {}
  ~ServedFd() { withdraw(); }
  ServedFd(const ServedFd&) = delete;
  ServedFd& operator=(const ServedFd&) = delete;

  std::uint64_t id() const noexcept { return id_; }
  ServedSource source() const { return svc_->source(id_); }
  std::string source_text() const { return encode_fd_source(source()); }
  void retag(const std::string& tag) { svc_->retag(id_, tag); }
  void withdraw() noexcept {
    std::lock_guard lk(mu_);
    if (!done_) svc_->withdraw(id_);
    done_ = true;
  }

 private:
  std::shared_ptr<FdService> svc_;
  std::uint64_t id_;
  std::mutex mu_;  // leaf
  bool done_ = false;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
