// A/B model versions (docs/design.md, "A/B model versions"): the calls
// behind memcuda/model_ab.hpp that talk to Redis, through the scripts of
// store/model_ab_scripts.hpp.
//
// A staged set lives under a hidden prefix no user model shares:
// ".memcuda-ab/<length of the prefix>/<prefix>/v<seq>/" (the length makes
// one model's hidden prefix never a prefix of another's). Names starting
// with ".memcuda-ab/" are reserved for it (docs/protocol.md).
#pragma once

#include "memcuda/config.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "memcuda/detail/registry/core.hpp"
#include "memcuda/detail/registry/ops/model_version.hpp"
#include "memcuda/detail/registry/ops/state_dicts.hpp"
#include "memcuda/detail/store/model_ab_scripts.hpp"
#include "memcuda/detail/store/reply.hpp"
#include "memcuda/error.hpp"
#include "memcuda/shared_tensor.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// A staging reserved by begin(): the version it will become (unless an
// in-place publish comes first), and its hidden prefix.
struct AbStaging {
  std::uint64_t version = 0, seq = 0;
  std::string hidden, token;  // token: "<seq> <session>", what the model record holds
};

// What an open or advance found.
struct AbOpened {
  enum class Kind { none, plain, same, inplace, unlinked, ok } kind = Kind::none;
  ModelRecord rec;
  std::string dict_id, hidden;
  std::map<std::string, SharedTensor<void>> tensors;  // by full name (ok only)
};

class ModelAb {
 public:
  static constexpr std::string_view kReserved = ".memcuda-ab/";

  // Every set of the model is under its root: "<root><seq>/".
  static std::string hidden_root(std::string_view prefix) {
    return std::string(kReserved) + std::to_string(prefix.size()) + "/" + std::string(prefix) + "/v";
  }
  static std::string hidden_prefix(std::string_view prefix, std::uint64_t seq) {
    return hidden_root(prefix) + std::to_string(seq) + "/";
  }

  static void validate(std::string_view prefix) {
    ModelVersions::validate_prefix(prefix);
    if (prefix.starts_with(kReserved) || std::string_view(kReserved).starts_with(prefix))
      throw InvalidArgument("model prefix '" + std::string(prefix) + "' overlaps the reserved names '" +
                            std::string(kReserved) + "...' of A/B model versions");
  }

  // Reserves a staging. A staging of this process that no writer owns any
  // more (its writer was dropped without commit or abort) is given up first.
  static AbStaging begin(Core& core, std::string_view prefix, unsigned max_versions) {
    validate(prefix);
    if (max_versions < 2)
      throw InvalidArgument("max_versions is " + std::to_string(max_versions) +
                            ": an A/B update needs room for the current version and the new one (2 or more)");
    auto& ctx = core.ctx;
    const auto deadline = std::chrono::steady_clock::now() + ctx.opts.request_timeout;
    auto pause = std::chrono::milliseconds(10);
    bool gave_up = false;
    for (;;) {
      const auto r = store::ab_begin(*ctx.pool.acquire(), ctx.keys, prefix, ctx.session, max_versions,
                                     hidden_root(prefix));
      const std::string& st = r.status;
      if (st == "ok") {
        AbStaging s;
        s.version = reply_u64(r[1]);
        s.seq = reply_u64(r[2]);
        s.hidden = hidden_prefix(prefix, s.seq);
        s.token = std::to_string(s.seq) + " " + ctx.session;
        if (const auto retired = reply_int(r[3]); retired > 0)
          log(LogLevel::warn, "model '" + std::string(prefix) + "': its record was lost (Redis lost its data); " +
                                  std::to_string(retired) + " tensor(s) of its earlier versions were retired, and " +
                                  "its versions count again from " + std::to_string(s.version));
        writers().add(s.token);
        return s;
      }
      if (st == "full") {
        // Versions no reader holds only wait for the next GC round to
        // free their memory: worth a short wait, not an error blaming
        // readers (a publish right after a publish lands here).
        const std::string live(r[1].str()), releasing(r.size() > 2 ? r[2].str() : std::string_view());
        const auto words = [](const std::string& t) {
          return t.empty() ? 0u : 1u + static_cast<unsigned>(std::count(t.begin(), t.end(), ' '));
        };
        const bool frees_suffice = !releasing.empty() && words(live) - words(releasing) + 1 <= max_versions;
        if (frees_suffice && std::chrono::steady_clock::now() + pause < deadline) {
          std::this_thread::sleep_for(pause);
          pause = std::min(pause * 2, std::chrono::milliseconds(200));
          continue;
        }
        throw BudgetExceeded(
            "model '" + std::string(prefix) + "': " + std::to_string(words(live)) + " of max_versions " +
            std::to_string(max_versions) + " versions are live (version:record:generation " + live + ")" +
            (frees_suffice ? "; no reader holds version(s) " + releasing +
                                 " any more, but their memory is still being released (the next garbage collection "
                                 "round frees it; waited " + std::to_string(ctx.opts.request_timeout.count()) +
                                 " ms); retry once it is freed, or use a larger max_versions"
                           : ": the current one and older ones a reader still holds; a new version needs one of "
                             "them to go (its readers advance or close), or a larger max_versions"));
      }
      if (st != "busy") unexpected_status("ab_begin", st);
      const std::string sess(r[1].str());
      const std::string token = std::string(r[2].str()) + " " + sess;
      if (sess == ctx.session && !writers().has(token) && !gave_up) {
        gave_up = true;
        abort(core, prefix, token);  // ours, abandoned: its tensors went with its writer's handles
        continue;
      }
      throw AlreadyExists("model '" + std::string(prefix) + "': session " + sess +
                          " is staging a version (commit or abort it first)");
    }
  }

  // Gives the staging up (idempotent); the writer drops its tensors.
  static void abort(Core& core, std::string_view prefix, const std::string& token) {
    writers().remove(token);
    auto& ctx = core.ctx;
    store::ab_abort(*ctx.pool.acquire(), ctx.keys, prefix, token);
  }

  // A writer gone without commit or abort (no I/O: the next begin of this
  // process gives the staging up, and another process's once ours is dead).
  static void forget(const std::string& token) noexcept {
    try {
      writers().remove(token);
    } catch (...) {
    }
  }

  // Makes the staged set current: `members` are its tensors (full names
  // and generations). Returns the new version.
  static std::pair<std::uint64_t, std::string> commit(Core& core, std::string_view prefix, const AbStaging& s,
                                                      const std::vector<std::pair<std::string, std::uint64_t>>& members,
                                                      StreamHandle stream, BackendKind b, int device) {
    auto& ctx = core.ctx;
    if (members.empty()) throw InvalidArgument("a model version needs at least one tensor");
    auto [handle, uuid] = ModelVersions::record_event(ctx, prefix, stream, b, device);
    const auto r = store::ab_commit(*ctx.pool.acquire(), ctx.keys, prefix, s.token, s.hidden, handle, to_string(b),
                                    device, uuid, ctx.node, ctx.session, members);
    const std::string& st = r.status;
    const std::string what = "commit of model '" + std::string(prefix) + "' version " + std::to_string(s.version);
    if (st == "ok") {
      writers().remove(s.token);
      return {reply_u64(r[1]), std::string(r[2].str())};
    }
    if (st == "notstaged")
      throw StaleHandle(what + ": the staging was aborted or taken over (the model record stages '" +
                        std::string(r[1].str()) + "')");
    if (st == "mismatch")
      throw InvalidArgument(what + ": " + std::to_string(reply_int(r[1])) + " names under " + s.hidden + ", " +
                            std::to_string(members.size()) + " members given");
    if (st == "changed") throw StaleHandle(what + ": tensor '" + std::string(r[1].str()) + "' was removed or replaced");
    if (st == "nodesc")
      throw ProtocolError(ProtocolErrc::bad_record, what + ": tensor '" + std::string(r[1].str()) + "' has no usable desc");
    unexpected_status("ab_commit", st);
  }

  // Opens the model's current set unless it is the pinned one (`pinned_dict`,
  // at `pinned_version`; both empty for a first open).
  static AbOpened open(const std::shared_ptr<Core>& core, std::string_view prefix, const std::string& pinned_dict,
                       const std::string& pinned_version) {
    auto& ctx = core->ctx;
    const auto r = store::ab_open(*ctx.pool.acquire(), ctx.keys, prefix, ctx.session, ctx.node, pinned_dict,
                                  pinned_version);
    const std::string& st = r.status;
    AbOpened o;
    using K = AbOpened::Kind;
    if (st == "none") return o;
    if (st == "same") {
      o.kind = K::same;
      return o;
    }
    o.rec = ModelVersions::decode(r[1]);
    if (st == "plain") o.kind = K::plain;
    else if (st == "inplace") o.kind = K::inplace;
    else if (st == "unlinked") {
      o.kind = K::unlinked;
      o.hidden = std::string(r[2].str());
      o.dict_id = std::string(r[3].str());
    } else if (st == "ok") {
      o.kind = K::ok;
      o.dict_id = std::string(r[2].str());
      o.hidden = std::string(r[4].str());
      o.tensors = DictClient(core).adopt(o.hidden, o.dict_id, r[3].str());
    } else {
      unexpected_status("ab_open", st);
    }
    return o;
  }

 private:
  // The stagings this process's live writers own.
  class Writers {
   public:
    void add(const std::string& t) {
      std::lock_guard lk(mu_);
      live_.insert(t);
    }
    void remove(const std::string& t) {
      std::lock_guard lk(mu_);
      live_.erase(t);
    }
    bool has(const std::string& t) {
      std::lock_guard lk(mu_);
      return live_.count(t) > 0;
    }

   private:
    std::mutex mu_;
    std::set<std::string> live_;
  };
  // Process-wide: a writer may outlive its registry, and tokens name their
  // session, so one set serves every registry. Never destroyed: writers may
  // go at exit.
  static Writers& writers() {
    static Writers* w = new Writers();
    return *w;
  }
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
