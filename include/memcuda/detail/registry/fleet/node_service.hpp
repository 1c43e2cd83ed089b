// A fleet node's allocator of record across machines (docs/scale-out.md,
// section 2): it exposes its slabs through a byte mover and publishes them,
// with the mover's endpoint, in the node's record (node_endpoint.hpp), its
// device memory through a staging ring (stager.hpp); and it runs its own
// node's pulls of other nodes' tensors (puller.hpp) through that mover.
//
// Threads: the control loop's (its tick and the pull command it executes),
// except expose_new(), which a create on any thread of the allocator of
// record calls so that a slab it made is readable before its tensor is
// published. The one lock (pub_mu_) is a leaf held for no I/O.
#pragma once

#include "memcuda/config.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "memcuda/detail/backend/select.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/create/allocator.hpp"
#include "memcuda/detail/registry/lease/lease.hpp"
#include "memcuda/detail/registry/fleet/node_endpoint.hpp"
#include "memcuda/detail/registry/fleet/puller.hpp"
#include "memcuda/detail/registry/fleet/stager.hpp"
#include "memcuda/detail/store/records.hpp"
#include "memcuda/detail/transfer/mover.hpp"
#include "memcuda/detail/transfer/mover_plugin.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class NodeService {
 public:
  NodeService(Context& ctx, Lease& lease, Allocator& alloc) : ctx_(ctx), lease_(lease), alloc_(alloc) {}
  NodeService(const NodeService&) = delete;
  NodeService& operator=(const NodeService&) = delete;

  // The control loop's tick. As the allocator of record: the mover made
  // (once), new slabs exposed, gone ones withdrawn, the record published or
  // renewed; otherwise the record withdrawn if it was this process's.
  void tick(redis::Connection& c, bool leader) {
    if (!leader) return withdraw(c);
    serve(c);
  }

  // The mover made, the slabs exposed, the record published or renewed:
  // the tick's, and a pull's first step (what it pulls is served onward
  // from the moment it is marked ready, not from the next tick on).
  void serve(redis::Connection& c) {
    if (!start()) return;
    sync(c);
    if (!published_) {
      pub_->publish(c);
      published_ = true;
      set_incarnation(pub_->record().incarnation);
      log(LogLevel::debug, "fleet: published this node's endpoint (incarnation " + pub_->record().incarnation + ")");
    } else if (pub_->refresh(c)) {
      log(LogLevel::debug, "fleet: this node's endpoint had expired, was replaced or missed a change: published again");
    }
  }

  // A create's new host slab, exposed and its region field written before
  // the create script publishes a tensor in it: a peer's pull then never
  // waits for the next tick. Any thread; a no-op before the mover exists
  // (the first tick exposes it) or once the slab is exposed.
  void expose_new(redis::Connection& c, ExportedBlock& slab) {
    transfer::Mover* m = live_.load(std::memory_order_acquire);
    if (!m || slab.allocation().kind != BackendKind::host) return;
    auto [e, made] = expose(*m, slab);
    if (!made || !e) return;
    std::string incarnation;
    {
      std::lock_guard lk(pub_mu_);
      incarnation = incarnation_;
    }
    if (incarnation.empty()) return;  // not published yet: the tick's publish carries it
    const auto& a = slab.allocation();
    (void)store::update_node_regions(c, ctx_.keys, ctx_.node, incarnation,
                                     {{store::region_field(a.alloc_id), region_text(*e)}});
  }

  // Pulls into this node's replicas, and their bytes.
  std::uint64_t pulls() const noexcept { return puller_.pulls(); }
  std::uint64_t pulled_bytes() const noexcept { return puller_.pulled_bytes(); }
  const Puller& puller() const noexcept { return puller_; }

  // The pull command (puller.hpp), after this node's record is published
  // and, where a GPU is, its staging ring started: what it pulls is served
  // onward from the moment it is marked ready, not from the next tick on
  // (nodes that pull one version at once read from each other). The ring's
  // field is written between the pull's tensors once the ring is made.
  std::vector<protocol::ReplyTensor> pull(redis::Connection& c, const std::vector<std::string>& names) {
    Puller::Running running(puller_);
    if (!published_ && lease_.held()) serve(c);
    if (!start()) return puller_.pull(c, nullptr, names);
#if MEMCUDA_HAS_CUDA()
    if (cuda_usable()) start_stager();
#endif
    auto between = [this](redis::Connection& conn) {
      std::map<std::string, std::string> changes;
      show_stage(changes);
      pub_->set_regions(published_ ? &conn : nullptr, changes);
    };
    between(c);
    return puller_.pull(c, mover_.get(), names, between);
  }

  // The lease is gone (or the registry stops): the record goes, and no peer reads through its keys.
  void withdraw(redis::Connection& c) noexcept {
    if (!pub_ || !published_) return stop_stager();
    published_ = false;
    set_incarnation({});
    log(LogLevel::debug, "fleet: withdrawing this node's endpoint");
    try {
      pub_->withdraw(c);
    } catch (const std::exception& e) {
      log(LogLevel::warn, std::string("fleet: withdrawing this node's endpoint: ") + e.what());
    }
    stop_stager();  // after the record: no peer reads the ring once it goes
  }

 private:
  // The mover, made on the first tick that needs it (ucp_init reads the
  // machine's devices: not in a constructor every registry runs).
  bool start() {
    if (mover_) return true;
    if (failed_) return false;
    try {
      std::string why;
      if (auto make = transfer::mover_factory().load()) mover_ = make();
      else mover_ = transfer::load_mover_plugin(why);
      if (!mover_)
        throw Unavailable("this program links no byte mover (include <memcuda/fleet.hpp> and link memcuda::ucx) "
                          "and loads none (" + why + ")");
      pub_.emplace(ctx_.keys, mover_->kind(), mover_->endpoint(), ctx_.session, kTtl, ctx_.node);
      live_.store(mover_.get(), std::memory_order_release);
      return true;
    } catch (const std::exception& e) {
      failed_ = true;
      log(LogLevel::error, std::string("fleet: no byte mover, this node's tensors cannot be read from others: ") +
                               e.what());
      return false;
    }
  }

  // Exposes every slab not exposed yet (a create may have done it first)
  // and withdraws the fields of those gone.
  void sync(redis::Connection& c) {
    std::map<std::string, std::string> changes;
    std::map<std::uint64_t, std::weak_ptr<ExportedBlock>> now;
    for (DevicePool* p : alloc_.pools()) {
      for (auto& s : p->slabs()) {
        const auto& a = s->allocation();
        if (a.kind != BackendKind::host) {  // device memory: read through the staging ring
          start_stager();
          continue;
        }
        if (exposed_.count(a.alloc_id)) {
          now[a.alloc_id] = s;
          continue;
        }
        if (auto e = expose(*mover_, *s).first) {  // one the engine refused is tried again next tick
          now[a.alloc_id] = s;
          changes[store::region_field(a.alloc_id)] = region_text(*e);
        }
      }
    }
    for (const auto& [id, w] : exposed_)
      if (!now.count(id)) changes[store::region_field(id)] = "";
    exposed_ = std::move(now);
    show_stage(changes);
    pub_->set_regions(published_ ? &c : nullptr, changes);
  }

  // The staging ring of this node's device memory (stager.hpp), started
  // with its first device slab or pull. Its thread makes the ring; this one
  // waits a second for it (usually some 100 ms), so that the field goes out
  // with this tick or pull, and leaves the rest to a later one.
  void start_stager() {
#if MEMCUDA_HAS_CUDA()
    if (stager_ || stage_failed_) return;
    try {
      stager_ = std::make_unique<Stager>(ctx_, *mover_);
    } catch (const std::exception& e) {  // no thread: pulls of its device memory wait for a field, and fail
      stage_failed_ = true;
      log(LogLevel::error, std::string("fleet: no stager, this node's device tensors cannot be read from others: ") +
                               e.what());
      return;
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (!stager_->region() && stager_->failure().empty() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
#endif
  }
  // The record's "stage" field, once the stager made its ring or failed to
  // ("none": pulls fail at once rather than wait for a ring).
  void show_stage([[maybe_unused]] std::map<std::string, std::string>& changes) {
#if MEMCUDA_HAS_CUDA()
    if (!stager_ || stage_shown_) return;
    if (const transfer::Region* r = stager_->region()) {
      changes[std::string(kStageField)] = region_text(*r);
      stage_shown_ = true;
      log(LogLevel::debug, "fleet: staging this node's device memory for other nodes");
    } else if (std::string why = stager_->failure(); !why.empty()) {
      stager_.reset();
      stage_failed_ = true;
      changes[std::string(kStageField)] = "none";
      log(LogLevel::error, "fleet: no staging ring, this node's device tensors cannot be read from others: " + why);
    }
#endif
  }
  void stop_stager() noexcept {
#if MEMCUDA_HAS_CUDA()
    if (stage_shown_ && pub_) pub_->set_regions(nullptr, {{std::string(kStageField), ""}});
    stager_.reset();
    stage_shown_ = false;
#endif
  }

  // The slab's exposure, made once: it (null: the engine refused, logged) and whether this call made it.
  static std::pair<std::shared_ptr<transfer::Region>, bool> expose(transfer::Mover& m, ExportedBlock& s) {
    const auto& a = s.allocation();
    try {
      auto [e, made] = s.expose_once([&] {
        return std::static_pointer_cast<void>(
            std::make_shared<transfer::Region>(m.expose(a.base, a.size, transfer::MemoryKind::host)));
      });
      return {std::static_pointer_cast<transfer::Region>(e), made};
    } catch (const std::exception& e) {
      log(LogLevel::warn, "fleet: exposing allocation " + std::to_string(a.alloc_id) + ": " + e.what());
      return {nullptr, false};
    }
  }

  void set_incarnation(std::string i) {
    std::lock_guard lk(pub_mu_);
    incarnation_ = std::move(i);
  }

  static constexpr std::chrono::milliseconds kTtl{5000};

  Context& ctx_;
  Lease& lease_;
  Allocator& alloc_;
  std::unique_ptr<transfer::Mover> mover_;
  std::optional<NodePublisher> pub_;
  bool published_ = false;
  bool failed_ = false;
  std::map<std::uint64_t, std::weak_ptr<ExportedBlock>> exposed_;  // those whose field the publisher has
  std::atomic<transfer::Mover*> live_{nullptr};  // mover_, once made: what expose_new reads
  std::mutex pub_mu_;        // leaf: guards incarnation_
  std::string incarnation_;  // the published record's; empty when none is
  Puller puller_{ctx_, lease_, alloc_};
#if MEMCUDA_HAS_CUDA()
  std::unique_ptr<Stager> stager_;  // after mover_: stopped before it goes
  bool stage_shown_ = false;        // the record has its ring's field
  bool stage_failed_ = false;
#endif
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
