// The Mover over UCX (ucp): one context and one worker per mover, RMA gets
// on memory registered with ucp_mem_map, keys packed with ucp_rkey_pack,
// endpoints created from the peer's packed worker address. The worker runs
// in UCX's multi-thread mode with a progress thread of its own: a software
// RMA transport (TCP) needs the exposing side to progress too, and a
// caller's get only posts the request and waits on a condition variable,
// so no lock of ours is held while bytes travel.
//
// Debian's UCX has no CUDA transports; expose() and get() then refuse
// device memory with Unavailable (the staging buffer goes in front).
#pragma once

#include "memcuda/config.hpp"

#if MEMCUDA_HAS_UCX()

#include <poll.h>
#include <ucp/api/ucp.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "memcuda/detail/transfer/mover.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::transfer {

struct UcxOptions {
  std::string transports;   // UCX_TLS ("tcp"); empty: UCX's own choice
  std::string net_devices;  // UCX_NET_DEVICES ("lo"); empty: every device
};

class UcxMover final : public Mover {
 public:
  explicit UcxMover(const UcxOptions& o = {}) {
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

    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_MULTI;
    ucp_worker_h w = nullptr;
    check(ucp_worker_create(ctx, &wp, &w), "ucp_worker_create");
    worker_ = std::shared_ptr<ucp_worker>(w, ucp_worker_destroy);
    ucp_worker_attr_t wa{};
    wa.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE;
    check(ucp_worker_query(w, &wa), "ucp_worker_query");
    if (wa.thread_mode != UCS_THREAD_MODE_MULTI)
      throw TransferError(UCS_ERR_UNSUPPORTED, "no multi-thread mode", "UCX built without --enable-mt");
    ucp_address_t* addr = nullptr;
    std::size_t len = 0;
    check(ucp_worker_get_address(w, &addr, &len), "ucp_worker_get_address");
    endpoint_.assign(reinterpret_cast<const char*>(addr), len);
    ucp_worker_release_address(w, addr);
    check(ucp_worker_get_efd(w, &efd_), "ucp_worker_get_efd");
    progress_ = std::jthread([this](std::stop_token st) { run(st); });
  }

  // Stops the progress thread, then closes the endpoints without waiting
  // on peers (force close: no network I/O on the caller's thread).
  ~UcxMover() override {
    progress_.request_stop();
    ucp_worker_signal(worker_.get());
    progress_.join();
    for (auto& [addr, ep] : eps_) close_ep(*ep);
  }

  UcxMover(const UcxMover&) = delete;
  UcxMover& operator=(const UcxMover&) = delete;

  const char* kind() const noexcept override { return "ucx"; }
  const std::string& endpoint() const noexcept override { return endpoint_; }

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

  void do_get(const RemoteRegion& src, std::uint64_t offset, void* dst, std::size_t n, Deadline deadline,
              MemoryKind dst_kind) override {
    check_range(src, offset, n);
    check_kind(dst_kind, "get");
    std::shared_ptr<Ep> ep = endpoint_for(src.endpoint);
    ucp_rkey_h rkey = nullptr;
    if (auto s = ucp_ep_rkey_unpack(ep->ep, src.key.data(), &rkey); s != UCS_OK)
      throw TransferError(s, ucs_status_string(s), "ucp_ep_rkey_unpack: the peer's key is not valid here");
    std::unique_ptr<ucp_rkey, void (*)(ucp_rkey_h)> rkey_guard(rkey, ucp_rkey_destroy);

    Pending done;
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.send = [](void*, ucs_status_t s, void* user) { static_cast<Pending*>(user)->finish(s); };
    rp.user_data = &done;
    ucs_status_ptr_t req = ucp_get_nbx(ep->ep, dst, n, src.address + offset, rkey, &rp);
    if (req == nullptr) return;  // completed in place
    if (UCS_PTR_IS_ERR(req)) {
      forget_ep(src.endpoint, ep);
      const ucs_status_t s = UCS_PTR_STATUS(req);
      throw TransferError(s, ucs_status_string(s), "ucp_get_nbx");
    }
    ucp_worker_signal(worker_.get());  // the progress thread may be asleep in poll
    ucs_status_t s = done.wait_until(deadline);
    const bool timed_out = s == UCS_INPROGRESS;
    if (timed_out) {
      // dst must not be written after we return: closing the endpoint by
      // force completes every request on it (as canceled); wait for that.
      forget_ep(src.endpoint, ep);
      ucp_worker_signal(worker_.get());
      s = done.wait_until(Deadline::max());
    }
    ucp_request_free(req);
    if (timed_out) throw TransferError(UCS_ERR_TIMED_OUT, ucs_status_string(UCS_ERR_TIMED_OUT), "ucp_get_nbx: deadline passed");
    if (s != UCS_OK) {
      forget_ep(src.endpoint, ep);
      throw TransferError(s, ucs_status_string(s), "ucp_get_nbx");
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

  static void check(ucs_status_t s, const char* what) {
    if (s != UCS_OK) throw TransferError(s, ucs_status_string(s), what);
  }
  void check_kind(MemoryKind k, const char* what) const {
    if (k == MemoryKind::cuda && !cuda_)
      throw Unavailable(std::string(what) + ": this UCX moves host memory only (built without CUDA transports)");
  }

  // Progress until stopped, sleeping on the worker's event fd when idle.
  void run(std::stop_token st) {
    ucp_worker_h w = worker_.get();
    while (!st.stop_requested()) {
      while (ucp_worker_progress(w) != 0) {}
      if (ucp_worker_arm(w) == UCS_ERR_BUSY) continue;
      pollfd pfd{efd_, POLLIN, 0};
      ::poll(&pfd, 1, 100);
    }
  }

  // An endpoint and whether UCX reported its peer failed (set from the
  // progress thread's error callback, which takes no lock of ours: UCX may
  // call it holding the worker's lock, which ucp_ep_create takes too).
  struct Ep {
    ucp_ep_h ep = nullptr;
    std::atomic<bool> failed{false};
  };

  // The cached endpoint to a peer, created on first use (local work only:
  // UCX connects in the background); a failed one is replaced.
  std::shared_ptr<Ep> endpoint_for(const std::string& address) {
    std::shared_ptr<Ep> dead;
    std::shared_ptr<Ep> e;
    {
      std::lock_guard lk(ep_mu_);
      if (auto it = eps_.find(address); it != eps_.end()) {
        if (!it->second->failed.load()) return it->second;
        dead = std::move(it->second);
        eps_.erase(it);
      }
      e = std::make_shared<Ep>();
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
      ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t) { static_cast<Ep*>(arg)->failed.store(true); };
      ep.err_handler.arg = e.get();
      check(ucp_ep_create(worker_.get(), &ep, &e->ep), "ucp_ep_create");
      eps_.emplace(address, e);
    }
    if (dead) close_ep(*dead);
    return e;
  }
  // Drops a failed endpoint so the next get makes a fresh one.
  void forget_ep(const std::string& address, const std::shared_ptr<Ep>& e) {
    {
      std::lock_guard lk(ep_mu_);
      auto it = eps_.find(address);
      if (it == eps_.end() || it->second != e) return;  // another thread dropped it
      eps_.erase(it);
    }
    close_ep(*e);
  }
  void close_ep(Ep& e) {
    ucp_request_param_t cp{};
    cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    cp.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(e.ep, &cp);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
      // A forced close completes locally, without the peer; the worker is
      // multi-threaded, so this thread may progress it alongside the
      // progress thread.
      while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(worker_.get());
      ucp_request_free(r);
    }
  }

  std::shared_ptr<ucp_context> ctx_;
  std::shared_ptr<ucp_worker> worker_;
  bool cuda_ = false;
  std::string endpoint_;
  int efd_ = -1;
  std::mutex ep_mu_;
  std::map<std::string, std::shared_ptr<Ep>> eps_;
  std::jthread progress_;
};

// A program that includes this header (and links memcuda::ucx) gives a
// fleet's registries UCX as their mover; UCX reads its own settings from
// the environment (UCX_TLS, UCX_NET_DEVICES).
inline const bool kUcxMoverInstalled = install_mover_factory(+[]() -> std::unique_ptr<Mover> {
  return std::make_unique<UcxMover>();
});

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::transfer

#endif  // MEMCUDA_HAS_UCX()
