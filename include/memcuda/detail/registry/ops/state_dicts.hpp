// State-dict records: one reference per opened model instead of one per
// tensor (docs/design.md, "One reference per model"; the scripts and the
// record's rules are in store/dict_scripts.hpp). publish_state_dict links a
// record over what it published (link()); open_state_dict opens through it
// (open()), or, where none is linked, gets nullopt and opens per name.
#pragma once

#include "memcuda/config.hpp"

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memcuda/detail/backend/record_fd_batch.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/detail/registry/core.hpp"
#include "memcuda/detail/store/dict_scripts.hpp"
#include "memcuda/protocol/dict_blob.hpp"
#include "memcuda/protocol/record_desc.hpp"
#include "memcuda/shared_tensor.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// What the handles of one open share: the reference, released when the
// last handle goes (queued, no I/O on the caller's thread).
class DictShare {
 public:
  DictShare(std::shared_ptr<Core> core, std::shared_ptr<DictRef> ref) : core_(std::move(core)), ref_(std::move(ref)) {}
  DictShare(const DictShare&) = delete;
  DictShare& operator=(const DictShare&) = delete;
  ~DictShare() {
    if (ref_->per_name.load()) {  // recovery turned it into one reference per member
      for (const auto& [name, gen] : ref_->members) Core::release_later(core_, name, gen);
      return;
    }
    Core& c = *core_;
    Process::get().releases().push_dict(std::move(core_), c.ctx, c.alloc, ref_->id);
  }

 private:
  std::shared_ptr<Core> core_;
  std::shared_ptr<DictRef> ref_;
};

class DictClient {
 public:
  explicit DictClient(std::shared_ptr<Core> core) : core_(std::move(core)), ctx_(core_->ctx) {}

  // Links a record over the dict just published under `prefix`: `members`
  // (full names and generations) must be exactly the names under it, all
  // persistent. False (nothing changed) when the script refuses, e.g. a
  // name under the prefix that is not a member: opens then go per name.
  bool link(std::string_view prefix, const std::vector<std::pair<std::string, std::uint64_t>>& members) {
    std::set<std::string_view> seen;
    for (const auto& [name, gen] : members)
      if (!seen.insert(name).second) throw InvalidArgument("link_state_dict names '" + name + "' twice");
    auto c = ctx_.pool.acquire();
    auto r = store::link_dict(*c, ctx_.keys, prefix, ctx_.node, members);
    if (r.is("ok")) return true;
    log(LogLevel::debug, "state dict '" + std::string(prefix) + "' not linked (" + r.status +
                             "): it is opened name by name");
    return false;
  }

  // Every member of the record linked at `prefix`, under one reference of
  // this process, by full name; nullopt when none is linked (or it is of
  // another node). Strict: a member that cannot be mapped throws, and the
  // reference goes with the handles already made.
  std::optional<std::map<std::string, SharedTensor<void>>> open(std::string_view prefix) {
    const auto r = store::acquire_dict(*ctx_.pool.acquire(), ctx_.keys, prefix, ctx_.session, ctx_.node);
    if (!r.is("ok")) return std::nullopt;
    return adopt(prefix, r[1].str(), r[2].str());
  }

  // Handles over a reference this process has just taken on record `id`
  // (dict_acquire's, or an A/B model open's), from the record's blob. Same
  // contract as open(): the reference goes with the last handle, whatever throws.
  std::map<std::string, SharedTensor<void>> adopt(std::string_view prefix, std::string_view id,
                                                  std::string_view blob) {
    auto ref = std::make_shared<DictRef>();
    ref->id = protocol::detail::parse_decimal<std::uint64_t>(id).value_or(0);
    std::shared_ptr<void> share;
    try {
      share = std::make_shared<DictShare>(core_, ref);
    } catch (...) {  // no handle can hold it: give it back now
      Process::get().releases().push_dict(core_, ctx_, core_->alloc, ref->id);
      throw;
    }
    // From here the reference is `share`'s: it goes when `share` and every
    // handle made below are gone, whatever throws.
    std::map<std::string, SharedTensor<void>> out;
    // Members first, then the maps: their fds fetched a chunk at a time, one
    // request per owner (record_fd_batch.hpp).
    std::vector<TensorInfo> members;
    for (const auto& m : protocol::parse_dict_blob(blob)) {
      protocol::LiveFields live;
      live.generation = m.generation;
      live.epoch = m.epoch;
      if (!m.event_handle.empty()) live.event_handle = m.event_handle;
      if (!m.event_version.empty()) live.event_version = m.event_version;
      members.push_back(protocol::decode_desc(m.desc, live));
      if (members.back().name != m.name)
        throw ProtocolError(ProtocolErrc::bad_record, "state dict record of '" + std::string(prefix) +
                                                          "': a member's name differs from its desc's");
    }
    for (std::size_t i = 0; i < members.size(); ++i) {
      if (i % kPrefetchChunk == 0) {
        std::vector<const TensorInfo*> chunk;
        for (std::size_t j = i; j < members.size() && j < i + kPrefetchChunk; ++j) chunk.push_back(&members[j]);
        try {
          prefetch_record_fds(chunk);
        } catch (const std::exception&) {
          // each open reports its own failure
        }
      }
      TensorInfo& t = members[i];
      ref->members.emplace_back(t.name, t.generation);
      auto [p, keep] = core_->client.map(t);
      std::string n = t.name;
      out.emplace(std::move(n), SharedTensor<void>(std::make_shared<TensorHandle>(core_, std::move(t), p,
                                                                                  std::move(keep), share)));
    }
    core_->dicts.add(ref);  // members known: recovery can stand in for them
    return out;
  }

 private:
  std::shared_ptr<Core> core_;
  Context& ctx_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
