// Model versions: a trainer overwrites a published model's tensors in place
// and publishes a new version of the model (a name prefix) with ONE event;
// consumers that hold the tensors already wait for the version and order
// their stream on that event, without re-opening anything (docs/design.md,
// "In-place model updates"; the record: docs/protocol.md). Waiters block in
// Redis on a private list the publish script pushes to, as Client::wait's;
// the event is opened once per producer and process (EventCache).
#pragma once

#include "memcuda/config.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "memcuda/detail/cuda/ipc_event.hpp"
#include "memcuda/detail/registry/core.hpp"
#include "memcuda/detail/store/reply.hpp"
#include "memcuda/error.hpp"
#include "memcuda/shape.hpp"
#include "memcuda/stream.hpp"
#include "memcuda/detail/store/lists.hpp"
#include "memcuda/detail/store/model_ab_scripts.hpp"
#include "memcuda/detail/store/records.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// One version record as read from Redis.
struct ModelRecord {
  bool exists = false;
  std::uint64_t version = 0;
  std::string event_handle, backend, device_uuid, node, session;
  int device = -1;
};

class ModelVersions {
 public:
  // Records one interprocess event on `stream` (cuda) and publishes the
  // next version of `prefix`; returns it.
  static std::uint64_t publish(Core& core, std::string_view prefix, StreamHandle stream,
                               std::optional<BackendKind> backend, int device) {
    validate_prefix(prefix);
    auto& ctx = core.ctx;
    const BackendKind b = backend.value_or(ctx.default_backend());
    auto [handle, uuid] = record_event(ctx, prefix, stream, b, device);
    const auto r = store::publish_version(*ctx.pool.acquire(), ctx.keys, prefix, handle, to_string(b), device, uuid,
                                          ctx.node, ctx.session);
    const std::string& st = r.status;
    if (st == "notfound")
      throw NotFound("cannot publish a version of model '" + std::string(prefix) +
                     "': no tensor name starts with it");
    if (st != "ok") unexpected_status("publish_version", st);
    return reply_u64(r[1]);
  }

  // Records the model's interprocess event on `stream` (cuda; `device`
  // becomes the ordinal used, -1 on host): the handle and device UUID a
  // publish stores, empty on the host backend.
  static std::pair<std::string, std::string> record_event(Context& ctx, std::string_view prefix, StreamHandle stream,
                                                          BackendKind b, int& device) {
    std::string handle, uuid;
    if (b == BackendKind::cuda) {
#if MEMCUDA_HAS_CUDA()
      if (device < 0) MEMCUDA_CUDA_TRY(cudaGetDevice(&device));
      uuid = device_uuid(device);
      auto& ev = event_for(ctx.keys.model(prefix), device);
      ev.record(stream);
      handle = ev.handle();
#else
      (void)ctx, (void)prefix, (void)stream;
      throw Unavailable("the cuda backend is not available: mem-cuda was built without the CUDA toolkit");
#endif
    } else {
      (void)stream;
      device = -1;
    }
    return {handle, uuid};
  }

  // The current version (0: tensors under the prefix, no version yet).
  static std::uint64_t current(Core& core, std::string_view prefix) {
    validate_prefix(prefix);
    auto c = core.ctx.pool.acquire();
    auto v = store::read_model_version(*c, core.ctx.keys, prefix);
    if (!v.is_nil()) return reply_u64(v.view());
    if (!has_tensors(core, *c, prefix)) throw unknown(prefix);
    return 0;
  }

  // Blocks until the version is > `after` (or the timeout passes: nullopt),
  // then orders `stream` after the producer's event.
  static std::optional<std::uint64_t> wait(Core& core, std::string_view prefix, std::uint64_t after,
                                           std::chrono::milliseconds timeout, StreamHandle stream) {
    validate_prefix(prefix);
    if (timeout.count() < 0) throw InvalidArgument("wait_version: negative timeout");
    auto& ctx = core.ctx;
    const std::string key = ctx.keys.model(prefix);
    const std::string ws = ctx.keys.model_waiters(prefix);
    const std::string wl = ctx.keys.model_wait_list(ctx.session, ++seq());
    ModelRecord rec;
    {
      auto c = ctx.waits.acquire();
      // Registered before the read: a publish after the read pushes to us.
      auto rs = store::add_model_waiter_and_read(*c, ws, wl, kSetTtlMs, key);
      rec = decode(rs[2].view());
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      bool registered = true;
      while (rec.version <= after) {
        if (!rec.exists && !has_tensors(core, *c, prefix)) {
          store::remove_waiter(*c, ws, wl);
          throw unknown(prefix);
        }
        auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) break;
        if (!registered) {  // woken, yet not past `after` (a stray push): register, then read again
          auto rs3 = store::add_model_waiter_and_read(*c, ws, wl, kSetTtlMs, key);
          registered = true;
          rec = decode(rs3[2].view());
          continue;
        }
        // In slices, each refreshing the set's expiry: one waiter's expiry
        // must never cut another's (longer) wait short.
        const auto slice = std::min(left, std::chrono::milliseconds(kSliceMs));
        auto r = store::pop_wait(*c, wl, slice);
        if (r.is_nil()) {
          store::add_waiter(*c, ws, wl, kSetTtlMs);
          continue;
        }
        // The push carries the record (no round trip: the publish dropped
        // the waiters set and BLPOP took the list's one element). A push
        // of a bare version (an older publisher) is followed by a read.
        registered = false;
        if (auto pushed = r.is_array() && r.size() == 2 ? decode_push(r[1].str()) : std::nullopt) {
          rec = std::move(*pushed);
          continue;
        }
        auto rs2 = store::read_model_and_remove_waiter(*c, ws, wl, key);
        rec = decode(rs2[0].view());
      }
      if (registered) store::remove_waiter(*c, ws, wl);
    }
    if (rec.version <= after) return std::nullopt;
    // An in-place version changes bytes under unchanged records: another
    // node's replicas of them would look current. A/B versions cross nodes.
    if (!rec.node.empty() && !same_node(rec.node, ctx.node))
      throw Unavailable("model '" + std::string(prefix) + "' version " + std::to_string(rec.version) +
                        " was published in place on node " + rec.node + ", this is " + ctx.node +
                        ": in-place versions are not followed across nodes (publish A/B versions)");
    order_after(ctx, prefix, rec, stream);
    return rec.version;
  }

 private:
  // A waiters set outlives every live waiter's next refresh (each blocks at
  // most kSliceMs between refreshes); a dead waiter's entry goes with it.
  static constexpr std::int64_t kSliceMs = 30000;
  static constexpr const char* kSetTtlMs = "120000";


 public:  // shared with the A/B versions (model_ab.hpp)
  static void validate_prefix(std::string_view prefix) { rules::validate_name(prefix, "model prefix"); }

  static NotFound unknown(std::string_view prefix) {
    return NotFound("no model '" + std::string(prefix) +
                    "': no version was published and no tensor name starts with it");
  }

 private:
  static std::atomic<std::uint64_t>& seq() {
    static std::atomic<std::uint64_t> s{0};
    return s;
  }

  static bool has_tensors(Core& core, redis::Connection& c, std::string_view prefix) {
    return !names_page(c, core.ctx.keys, prefix, {}, 1).empty();
  }

 public:
  static ModelRecord decode(redis::ReplyView r) {
    ModelRecord m;
    if (r.size() == 0) return m;
    m.exists = true;
    for (std::size_t i = 0; i + 1 < r.size(); i += 2) {
      const auto f = r[i].str();
      const auto v = r[i + 1].str();
      namespace mf = store::model_field;
      if (f == mf::version) m.version = reply_u64(r[i + 1]);
      else if (f == mf::event_handle) m.event_handle = std::string(v);
      else if (f == mf::backend) m.backend = std::string(v);
      else if (f == mf::device) m.device = static_cast<int>(reply_int(r[i + 1]));
      else if (f == mf::device_uuid) m.device_uuid = std::string(v);
      else if (f == mf::node) m.node = std::string(v);
      else if (f == mf::session) m.session = std::string(v);
    }
    return m;
  }

 private:
  // What the publish script pushes to a waiter: version, backend, device,
  // device uuid, node, session, event handle ('\n'-separated, the binary
  // handle last). nullopt: not that shape (a bare version).
  static std::optional<ModelRecord> decode_push(std::string_view p) {
    std::string_view f[6];
    for (auto& x : f) {
      const auto nl = p.find('\n');
      if (nl == std::string_view::npos) return std::nullopt;
      x = p.substr(0, nl);
      p.remove_prefix(nl + 1);
    }
    ModelRecord m;
    m.exists = true;
    std::int64_t dev = -1;
    auto [e1, c1] = std::from_chars(f[0].data(), f[0].data() + f[0].size(), m.version);
    auto [e2, c2] = std::from_chars(f[2].data(), f[2].data() + f[2].size(), dev);
    if (c1 != std::errc() || e1 != f[0].data() + f[0].size() || c2 != std::errc() ||
        e2 != f[2].data() + f[2].size() || m.version == 0)
      return std::nullopt;
    m.backend = std::string(f[1]);
    m.device = static_cast<int>(dev);
    m.device_uuid = std::string(f[3]);
    m.node = std::string(f[4]);
    m.session = std::string(f[5]);
    m.event_handle = std::string(p);
    return m;
  }

 public:
  // Makes `stream` wait for the producer's event; nothing on the host
  // backend (the producer's writes happened before its publish, which
  // happened before our read of the version), nor for another node's A/B
  // version: it is read here through node replicas, whose bytes were on
  // this node's device before they were marked ready, and the source's
  // stager waited for this event (the commit writes it into every member's
  // record) before it staged them.
  static void order_after(Context& ctx, [[maybe_unused]] std::string_view prefix, const ModelRecord& rec,
                          StreamHandle stream) {
    if (rec.event_handle.empty() || !same_node(rec.node, ctx.node)) return;
#if MEMCUDA_HAS_CUDA()
    (void)ordinal_of_uuid(rec.device_uuid, rec.device);  // Unavailable when this process cannot see it
    stream_wait_ipc_event(stream, rec.event_handle);
#else
    (void)stream;
    throw Unavailable("model '" + std::string(prefix) + "' version " + std::to_string(rec.version) +
                      " is ordered by a CUDA event, and mem-cuda was built without the CUDA toolkit");
#endif
  }

#if MEMCUDA_HAS_CUDA()
  // This process's event per (model key, device), made on first use and
  // kept for the process's life (a consumer may have opened its handle).
  // The mutex is a leaf held across the event's creation (a CUDA call),
  // like TensorHandle::event_mu_.
  static ExportedEvent& event_for(const std::string& model_key, int device) {
    static std::mutex mu;
    static std::map<std::pair<std::string, int>, std::unique_ptr<ExportedEvent>>* events =
        new std::map<std::pair<std::string, int>, std::unique_ptr<ExportedEvent>>();  // never destroyed: no CUDA at exit
    std::lock_guard lk(mu);
    auto& e = (*events)[{model_key, device}];
    if (!e) e = std::make_unique<ExportedEvent>(device);
    return *e;
  }
#endif
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
