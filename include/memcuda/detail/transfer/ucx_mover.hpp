// The Mover over UCX (ucp): one context and several workers ("lanes"), RMA
// gets on memory registered with ucp_mem_map (a context's registration and
// packed key serve every worker of it), endpoints created from the peer's
// packed worker addresses. Each lane runs in UCX's multi-thread mode with a
// progress thread of its own: a software RMA transport (TCP) needs the
// exposing side to progress too, and a caller's get only posts requests
// and waits on a condition variable, so no lock of ours is held while bytes
// travel. A get of a megabyte or more is cut into one stripe per lane, each
// on its own connection and progress threads at both ends: one TCP
// connection's emulated get stops at a few GB/s, well below the host's
// copies.
//
// Debian's UCX has no CUDA transports; expose() and get() then refuse
// device memory with Unavailable (the staging buffer goes in front).
#pragma once

#include "memcuda/config.hpp"

#if MEMCUDA_HAS_UCX()

#include <poll.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "memcuda/detail/transfer/mover.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::transfer {

struct UcxOptions {
  std::string transports;   // UCX_TLS ("tcp"); empty: UCX's own choice
  std::string net_devices;  // UCX_NET_DEVICES ("lo"); empty: every device
  std::size_t lanes = 0;    // workers (1-16); 0: MEMCUDA_UCX_LANES, else 4
};

class UcxMover final : public Mover {
 public:
  static constexpr std::size_t kMaxLanes = 16;
  static constexpr std::size_t kMinStripe = std::size_t{1} << 20;  // smaller gets take one lane

  explicit UcxMover(const UcxOptions& o = {}) {
    const std::size_t lanes = lane_count(o.lanes);
    ucp_config_t* cfg = nullptr;
    check(ucp_config_read(nullptr, nullptr, &cfg), "ucp_config_read");
    std::unique_ptr<ucp_config_t, void (*)(ucp_config_t*)> cfg_guard(cfg, ucp_config_release);
    if (!o.transports.empty()) check(ucp_config_modify(cfg, "TLS", o.transports.c_str()), "ucp_config_modify TLS");
    if (!o.net_devices.empty())
      check(ucp_config_modify(cfg, "NET_DEVICES", o.net_devices.c_str()), "ucp_config_modify NET_DEVICES");
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    p.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    p.mt_workers_shared = 1;
    ucp_context_h ctx = nullptr;
    check(ucp_init(&p, cfg, &ctx), "ucp_init");
    ctx_ = std::shared_ptr<ucp_context>(ctx, ucp_cleanup);
    ucp_context_attr_t ca{};
    ca.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    check(ucp_context_query(ctx, &ca), "ucp_context_query");
    cuda_ = (ca.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;

    std::vector<std::string> addresses;
    for (std::size_t i = 0; i < lanes; ++i) {
      auto& l = *lanes_.emplace_back(std::make_unique<Lane>());
      ucp_worker_params_t wp{};
      wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
      wp.thread_mode = UCS_THREAD_MODE_MULTI;
      ucp_worker_h w = nullptr;
      check(ucp_worker_create(ctx, &wp, &w), "ucp_worker_create");
      l.worker = std::shared_ptr<ucp_worker>(w, ucp_worker_destroy);
      ucp_worker_attr_t wa{};
      wa.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE;
      check(ucp_worker_query(w, &wa), "ucp_worker_query");
      if (wa.thread_mode != UCS_THREAD_MODE_MULTI)
        throw TransferError(UCS_ERR_UNSUPPORTED, "no multi-thread mode", "UCX built without --enable-mt");
      ucp_address_t* addr = nullptr;
      std::size_t len = 0;
      check(ucp_worker_get_address(w, &addr, &len), "ucp_worker_get_address");
      addresses.emplace_back(reinterpret_cast<const char*>(addr), len);
      ucp_worker_release_address(w, addr);
      check(ucp_worker_get_efd(w, &l.efd), "ucp_worker_get_efd");
    }
    endpoint_ = pack_endpoint(addresses);
    for (auto& l : lanes_) l->progress = std::jthread([w = l->worker.get(), efd = l->efd](std::stop_token st) {
      run(st, w, efd);
    });
  }

  // Stops the progress threads, then closes the endpoints without waiting
  // on peers (force close: no network I/O on the caller's thread).
  ~UcxMover() override {
    for (auto& l : lanes_) {
      l->progress.request_stop();
      ucp_worker_signal(l->worker.get());
    }
    for (auto& l : lanes_)
      if (l->progress.joinable()) l->progress.join();
    for (auto& [at, ep] : eps_) close_ep(*ep);
  }

  UcxMover(const UcxMover&) = delete;
  UcxMover& operator=(const UcxMover&) = delete;

  const char* kind() const noexcept override { return "ucx"; }
  // The lanes' packed worker addresses: a count byte, then each as a
  // 4-byte little-endian length and its bytes.
  const std::string& endpoint() const noexcept override { return endpoint_; }
  std::size_t lanes() const noexcept { return lanes_.size(); }

 protected:
  Region do_expose(void* p, std::size_t n, MemoryKind kind) override {
    if (!p || n == 0) throw InvalidArgument("expose: an empty range");
    check_kind(kind, "expose");
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = p;
    mp.length = n;
    ucp_mem_h memh = nullptr;
    check(ucp_mem_map(ctx_.get(), &mp, &memh), "ucp_mem_map");
    // The registration keeps the context: a Region may outlive its mover.
    auto ctx = ctx_;
    std::shared_ptr<void> reg(memh, [ctx](void* h) { ucp_mem_unmap(ctx.get(), static_cast<ucp_mem_h>(h)); });
    void* kb = nullptr;
    std::size_t kl = 0;
    check(ucp_rkey_pack(ctx_.get(), memh, &kb, &kl), "ucp_rkey_pack");
    std::string key(static_cast<const char*>(kb), kl);
    ucp_rkey_buffer_release(kb);
    return Region(reinterpret_cast<std::uintptr_t>(p), n, std::move(key), std::move(reg));
  }

  // One stripe per lane (a get under 2 kMinStripe takes one), lane j
  // reading from the peer's lane j modulo its count; every stripe has
  // finished or was canceled before this returns or throws.
  void do_get(const RemoteRegion& src, std::uint64_t offset, void* dst, std::size_t n, Deadline deadline,
              MemoryKind dst_kind) override {
    check_range(src, offset, n);
    check_kind(dst_kind, "get");
    const std::vector<std::string> peer = unpack_endpoint(src.endpoint);
    const std::size_t stripes = std::clamp<std::size_t>(n / kMinStripe, 1, lanes_.size());
    const std::size_t first = next_lane_.fetch_add(stripes, std::memory_order_relaxed);
    const std::size_t each = (n + stripes - 1) / stripes;
    std::vector<std::unique_ptr<Stripe>> parts;
    std::optional<TransferError> failed;
    for (std::size_t j = 0; j < stripes && !failed; ++j) {
      const std::size_t lane = (first + j) % lanes_.size(), at = j * each;
      auto& s = *parts.emplace_back(std::make_unique<Stripe>());
      s.lane = lane;
      s.address = peer[lane % peer.size()];
      try {
        s.ep = endpoint_for(lane, s.address);
      } catch (const TransferError& e) {
        s.done.finish(static_cast<ucs_status_t>(e.status()));
        failed.emplace(e);
        break;
      }
      if (auto st = ucp_ep_rkey_unpack(s.ep->ep, src.key.data(), &s.rkey); st != UCS_OK) {
        s.done.finish(st);
        failed.emplace(st, ucs_status_string(st), "ucp_ep_rkey_unpack: the peer's key is not valid here");
        break;
      }
      ucp_request_param_t rp{};
      rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      rp.cb.send = [](void*, ucs_status_t st, void* user) { static_cast<Pending*>(user)->finish(st); };
      rp.user_data = &s.done;
      s.req = ucp_get_nbx(s.ep->ep, static_cast<char*>(dst) + at, std::min(each, n - at), src.address + offset + at,
                          s.rkey, &rp);
      if (s.req == nullptr) {
        s.done.finish(UCS_OK);  // completed in place
      } else if (UCS_PTR_IS_ERR(s.req)) {
        const ucs_status_t st = UCS_PTR_STATUS(s.req);
        s.req = nullptr;
        s.done.finish(st);
        forget_ep(s.lane, s.address, s.ep);
        failed.emplace(st, ucs_status_string(st), "ucp_get_nbx");
      } else {
        ucp_worker_signal(lanes_[lane]->worker.get());  // its progress thread may be asleep in poll
      }
    }
    bool timed_out = false;
    for (auto& s : parts) {
      if (s->done.wait_until(deadline) != UCS_INPROGRESS) continue;
      // dst must not be written after we return: closing the endpoint by
      // force completes every request on it (as canceled); wait for that.
      timed_out = true;
      forget_ep(s->lane, s->address, s->ep);
      ucp_worker_signal(lanes_[s->lane]->worker.get());
      s->done.wait_until(Deadline::max());
    }
    for (auto& s : parts) {
      if (s->req) ucp_request_free(s->req);
      if (s->rkey) ucp_rkey_destroy(s->rkey);
    }
    if (timed_out) throw TransferError(UCS_ERR_TIMED_OUT, ucs_status_string(UCS_ERR_TIMED_OUT), "ucp_get_nbx: deadline passed");
    if (failed) throw *failed;
    for (auto& s : parts) {
      if (const ucs_status_t st = s->done.status; st != UCS_OK) {
        forget_ep(s->lane, s->address, s->ep);
        throw TransferError(st, ucs_status_string(st), "ucp_get_nbx");
      }
    }
  }

 private:
  // A request's completion, set from the progress thread's callback.
  struct Pending {
    std::mutex m;
    std::condition_variable cv;
    bool finished = false;
    ucs_status_t status = UCS_INPROGRESS;
    void finish(ucs_status_t s) {
      std::lock_guard lk(m);
      finished = true;
      status = s;
      cv.notify_all();
    }
    ucs_status_t wait_until(Deadline d) {
      std::unique_lock lk(m);
      if (d == Deadline::max()) cv.wait(lk, [&] { return finished; });
      else cv.wait_until(lk, d, [&] { return finished; });
      return finished ? status : UCS_INPROGRESS;
    }
  };

  // A worker and the thread that progresses it.
  struct Lane {
    std::shared_ptr<ucp_worker> worker;
    int efd = -1;
    std::jthread progress;
  };

  // An endpoint and whether UCX reported its peer failed (set from the
  // progress thread's error callback, which takes no lock of ours: UCX may
  // call it holding the worker's lock, which ucp_ep_create takes too).
  struct Ep {
    ucp_ep_h ep = nullptr;
    ucp_worker_h worker = nullptr;
    std::atomic<bool> failed{false};
  };

  // One stripe of a get in flight.
  struct Stripe {
    std::size_t lane = 0;
    std::string address;
    std::shared_ptr<Ep> ep;
    ucp_rkey_h rkey = nullptr;
    ucs_status_ptr_t req = nullptr;
    Pending done;
  };

  static void check(ucs_status_t s, const char* what) {
    if (s != UCS_OK) throw TransferError(s, ucs_status_string(s), what);
  }
  void check_kind(MemoryKind k, const char* what) const {
    if (k == MemoryKind::cuda && !cuda_)
      throw Unavailable(std::string(what) + ": this UCX moves host memory only (built without CUDA transports)");
  }

  static std::size_t lane_count(std::size_t asked) {
    if (asked == 0) {
      asked = 4;
      if (const char* v = std::getenv("MEMCUDA_UCX_LANES"); v && *v) {
        char* end = nullptr;
        const unsigned long x = std::strtoul(v, &end, 10);
        if (*end || x == 0 || x > kMaxLanes)
          throw InvalidArgument(std::string("MEMCUDA_UCX_LANES='") + v + "': a count of 1 to " +
                                std::to_string(kMaxLanes));
        asked = x;
      }
    }
    if (asked > kMaxLanes) throw InvalidArgument("UcxOptions::lanes: at most " + std::to_string(kMaxLanes));
    return asked;
  }

  static std::string pack_endpoint(const std::vector<std::string>& addresses) {
    std::string out(1, static_cast<char>(addresses.size()));
    for (const auto& a : addresses) {
      for (int b = 0; b < 4; ++b) out += static_cast<char>((a.size() >> (8 * b)) & 0xff);
      out += a;
    }
    return out;
  }
  // A peer's endpoint into its lanes' addresses; Unavailable for bytes that
  // are not one (a worker address carries no length of its own, so UCX
  // could not tell a truncated one).
  static std::vector<std::string> unpack_endpoint(std::string_view e) {
    auto bad = [&] { return Unavailable("a UCX endpoint of " + std::to_string(e.size()) + " bytes that is not one"); };
    if (e.empty()) throw bad();
    const std::size_t count = static_cast<unsigned char>(e[0]);
    if (count == 0 || count > kMaxLanes) throw bad();
    std::vector<std::string> out;
    std::size_t at = 1;
    for (std::size_t i = 0; i < count; ++i) {
      if (e.size() - at < 4) throw bad();
      std::size_t len = 0;
      for (int b = 0; b < 4; ++b) len |= std::size_t{static_cast<unsigned char>(e[at + b])} << (8 * b);
      at += 4;
      if (len == 0 || e.size() - at < len) throw bad();
      out.emplace_back(e.substr(at, len));
      at += len;
    }
    if (at != e.size()) throw bad();
    return out;
  }

  // Progress until stopped, sleeping on the worker's event fd when idle.
  static void run(const std::stop_token& st, ucp_worker_h w, int efd) {
    while (!st.stop_requested()) {
      while (ucp_worker_progress(w) != 0) {}
      if (ucp_worker_arm(w) == UCS_ERR_BUSY) continue;
      pollfd pfd{efd, POLLIN, 0};
      ::poll(&pfd, 1, 100);
    }
  }

  // Lane `lane`'s cached endpoint to a peer's worker, created on first use
  // (local work only: UCX connects in the background); a failed one is
  // replaced.
  std::shared_ptr<Ep> endpoint_for(std::size_t lane, const std::string& address) {
    std::shared_ptr<Ep> dead;
    std::shared_ptr<Ep> e;
    {
      std::lock_guard lk(ep_mu_);
      if (auto it = eps_.find({lane, address}); it != eps_.end()) {
        if (!it->second->failed.load()) return it->second;
        dead = std::move(it->second);
        eps_.erase(it);
      }
      e = std::make_shared<Ep>();
      e->worker = lanes_[lane]->worker.get();
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
      ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t) { static_cast<Ep*>(arg)->failed.store(true); };
      ep.err_handler.arg = e.get();
      check(ucp_ep_create(e->worker, &ep, &e->ep), "ucp_ep_create");
      eps_.emplace(std::make_pair(lane, address), e);
    }
    if (dead) close_ep(*dead);
    return e;
  }
  // Drops a failed endpoint so the next get makes a fresh one.
  void forget_ep(std::size_t lane, const std::string& address, const std::shared_ptr<Ep>& e) {
    {
      std::lock_guard lk(ep_mu_);
      auto it = eps_.find({lane, address});
      if (it == eps_.end() || it->second != e) return;  // another thread dropped it
      eps_.erase(it);
    }
    close_ep(*e);
  }
  static void close_ep(Ep& e) {
    ucp_request_param_t cp{};
    cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    cp.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(e.ep, &cp);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
      // A forced close completes locally, without the peer; the worker is
      // multi-threaded, so this thread may progress it alongside the
      // progress thread.
      while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(e.worker);
      ucp_request_free(r);
    }
  }

  std::shared_ptr<ucp_context> ctx_;
  bool cuda_ = false;
  std::vector<std::unique_ptr<Lane>> lanes_;
  std::string endpoint_;
  std::atomic<std::size_t> next_lane_{0};  // where the next get's stripes start
  std::mutex ep_mu_;
  std::map<std::pair<std::size_t, std::string>, std::shared_ptr<Ep>> eps_;
};

// A program that includes this header (and links memcuda::ucx) gives a
// fleet's registries UCX as their mover; UCX reads its own settings from
// the environment (UCX_TLS, UCX_NET_DEVICES).
inline const bool kUcxMoverInstalled = install_mover_factory(+[]() -> std::unique_ptr<Mover> {
  return std::make_unique<UcxMover>();
});

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::transfer

#endif  // MEMCUDA_HAS_UCX()
