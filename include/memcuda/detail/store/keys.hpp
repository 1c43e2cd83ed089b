// Every Redis key mem-cuda uses, in one place (docs/protocol.md lists them).
// A namespace N prefixes every key with "N:", so registries on one Redis
// never see each other; the default namespace is empty so the lifecycle
// list is the seed's plain `tensor_lifecycle`. On Redis Cluster the prefix
// is the hash tag "{N}:" ("{memcuda}:" for the default namespace: "{}" is
// no tag), so that every key of a namespace, those the scripts build from
// the prefix included, lives in one slot (docs/scale-out.md, section 3).
#pragma once

#include "memcuda/config.hpp"

#include <cstdint>
#include <string>
#include <string_view>

#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

// A fleet (RegistryOptions::fleet: several machines on one Redis) gives
// each node an allocator of record of its own: the keys of that role (the
// lease, the lifecycle list and its processing lists, the pool statistics,
// the owner uid, the fd allocations) carry "@<node scope>" (base/node.hpp:
// the boot id, or MEMCUDA_NODE_ID); the records, names, sessions and
// generations stay shared by the nodes.
class Keys {
 public:
  explicit Keys(std::string_view ns = {}, bool cluster = false, std::string_view node_scope = {})
      : scope_(node_scope.empty() ? std::string() : "@" + std::string(node_scope)) {
    for (char c : ns)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'))
        throw InvalidArgument("namespace '" + std::string(ns) +
                              "' may only contain letters, digits, '_', '-' and '.'");
    if (ns.size() > 64) throw InvalidArgument("namespace longer than 64 bytes");
    if (cluster) prefix_ = "{" + std::string(ns.empty() ? std::string_view("memcuda") : ns) + "}:";
    else prefix_ = ns.empty() ? std::string() : std::string(ns) + ":";
  }

  const std::string& prefix() const noexcept { return prefix_; }
  std::string lifecycle() const { return prefix_ + "tensor_lifecycle" + scope_; }
  std::string tensor(std::string_view name) const { return prefix_ + "memcuda:tensor:" + std::string(name); }
  std::string tensor_prefix() const { return prefix_ + "memcuda:tensor:"; }
  // Where a tensor's Hash goes when its name is unlinked while still held.
  std::string removed(std::uint64_t gen) const { return prefix_ + "memcuda:removed:" + std::to_string(gen); }
  // Forwards releases of a migrated generation to its successor.
  std::string moved(std::uint64_t gen) const { return prefix_ + "memcuda:moved:" + std::to_string(gen); }
  // A holder that re-registered a generation after a failover and found no
  // record: the owner keeps that block out of its pool (held_frees.hpp).
  std::string claim(std::uint64_t gen) const { return prefix_ + "memcuda:claim:" + std::to_string(gen); }
  // A write the owner of held frees makes so that one WAIT covers them all.
  std::string freed_ack(std::string_view sid) const { return prefix_ + "memcuda:freed_ack:" + std::string(sid); }
  // Says why a name whose tensor died with its allocator of record is gone.
  std::string lost(std::string_view name) const { return prefix_ + "memcuda:lost:" + std::string(name); }
  // Messages from the allocator of record to one session (migrate, free, forget).
  std::string inbox(std::string_view sid) const { return prefix_ + "memcuda:inbox:" + std::string(sid); }
  // The index of linked names: a sorted set, every score 0, so that a
  // prefix is a range (ZRANGEBYLEX) and a listing pages by name.
  std::string names() const { return prefix_ + "memcuda:names"; }
  // A holder's references ('<generation>:<name>' members) and the set of
  // holders that have such an index (index_fn.hpp): the garbage collector
  // reads these, never every record.
  std::string refs(std::string_view holder) const { return prefix_ + "memcuda:refs:" + std::string(holder); }
  std::string holders() const { return prefix_ + "memcuda:holders"; }
  // The allocators of record that own records (a session each): the orphan
  // scan runs only when one of them is dead.
  std::string owners() const { return prefix_ + "memcuda:owners"; }
  // Counts and logical bytes of the named tensors per backend and device.
  std::string usage() const { return prefix_ + "memcuda:usage"; }
  std::string leader() const { return prefix_ + "memcuda:leader" + scope_; }
  std::string epoch() const { return prefix_ + "memcuda:epoch" + scope_; }
  // The effective uid of the namespace's allocators of record (owner_uid.hpp).
  std::string owner_uid() const { return prefix_ + "memcuda:owner_uid" + scope_; }
  std::string generation() const { return prefix_ + "memcuda:generation"; }
  std::string processing(std::uint64_t epoch) const {
    return prefix_ + "memcuda:processing" + scope_ + ":" + std::to_string(epoch);
  }
  std::string processing_lists() const { return prefix_ + "memcuda:processing_lists" + scope_; }
  std::string session(std::string_view sid) const { return prefix_ + "memcuda:session:" + std::string(sid); }
  std::string sessions() const { return prefix_ + "memcuda:sessions"; }
  std::string reply(std::string_view sid) const { return prefix_ + "memcuda:reply:" + std::string(sid); }
  std::string ready_channel(std::string_view name) const {
    return prefix_ + "memcuda:ready:" + std::string(name);
  }
  // The reply list of one request of a session: one list per request, so
  // threads waiting concurrently never take each other's replies.
  std::string request_reply(std::string_view sid, std::uint64_t seq) const {
    return reply(sid) + ":" + std::to_string(seq);
  }
  // The reply list of one batch command of a session (create_many, remove_many).
  std::string batch_reply(std::string_view sid, std::uint64_t seq) const {
    return reply(sid) + ":batch:" + std::to_string(seq);
  }
  // Where a fleet node's stager answers one ask of this session (protocol/stage.hpp).
  std::string stage_reply(std::string_view sid, std::uint64_t seq) const {
    return reply(sid) + ":stage:" + std::to_string(seq);
  }
  // Where holders answer a migrate request of this session (the leader).
  std::string migrate_reply(std::string_view sid) const { return reply(sid) + ":migrate"; }
  // A wait()er's private list, and the set of them per name (the create
  // script pushes the generation to each).
  std::string wait_list(std::string_view sid, std::uint64_t seq) const {
    return reply(sid) + ":wait:" + std::to_string(seq);
  }
  std::string waiters(std::string_view name) const { return prefix_ + "memcuda:waiters:" + std::string(name); }
  // A model's version record (a name prefix; detail/registry/ops/model_version.hpp),
  // the set of its waiters' lists, and one waiter's private list.
  std::string model(std::string_view prefix) const { return prefix_ + "memcuda:model:" + std::string(prefix); }
  std::string model_waiters(std::string_view prefix) const {
    return prefix_ + "memcuda:model_waiters:" + std::string(prefix);
  }
  std::string model_wait_list(std::string_view sid, std::uint64_t seq) const {
    return reply(sid) + ":model_wait:" + std::to_string(seq);
  }
  // State-dict records (dict_scripts.hpp): one record per published dict,
  // the link naming a prefix's current record, the set of every record's id
  // (linked or still held) and the set of linked prefixes.
  std::string dict(std::uint64_t id) const { return prefix_ + "memcuda:dict:" + std::to_string(id); }
  std::string dict_link(std::string_view prefix) const {
    return prefix_ + "memcuda:dictlink:" + std::string(prefix);
  }
  std::string dict_ids() const { return prefix_ + "memcuda:dict_ids"; }
  std::string dicts() const { return prefix_ + "memcuda:dicts"; }
  // A state dict's record by the id its pin holder "@dict:<id>" names.
  std::string dict(std::string_view id) const { return prefix_ + "memcuda:dict:" + std::string(id); }
  // The record a pin holder "@dict:<id>" stands for ("" when `holder` is no such pin).
  std::string dict_of_holder(std::string_view holder) const {
    return holder.starts_with(kDictHolder) ? dict(holder.substr(kDictHolder.size())) : std::string();
  }
  static constexpr std::string_view kDictHolder = "@dict:";
  // The allocations Hash of cuda_vmm_fd fd sources, its version token, and
  // a standby's progress marker (detail/store/allocations.hpp).
  std::string allocations() const { return prefix_ + "memcuda:allocations" + scope_; }
  std::string allocations_version() const { return prefix_ + "memcuda:allocations_version" + scope_; }
  std::string standby_synced(std::string_view sid) const { return prefix_ + "memcuda:standby:" + std::string(sid); }
  // A standby's wake list: the allocator of record pushes to it when it
  // made an allocation the standby should hold at once.
  std::string standby_wake(std::string_view sid) const { return prefix_ + "memcuda:standby_wake:" + std::string(sid); }
  // Where a node's byte mover is reached (node_endpoints.hpp): one per node.
  std::string node(std::string_view node_id) const { return prefix_ + "memcuda:node:" + std::string(node_id); }
  // A fleet node's staging list (protocol/stage.hpp): other nodes ask its
  // allocator of record for chunks of its device memory there.
  std::string stage(std::string_view scope) const { return prefix_ + "memcuda:stage@" + std::string(scope); }
  // Which node pulls a tensor now (a hint with a TTL: the others pull it
  // later, from that node's replica).
  std::string pulling(std::string_view name) const { return prefix_ + "memcuda:pulling:" + std::string(name); }
  // The leader's pool statistics, readable by any process.
  std::string pool_stats() const { return prefix_ + "memcuda:pool_stats" + scope_; }
  // SCAN pattern of every named record, and the name a record key is the
  // record of ("" for any other key: an unlinked record's).
  std::string tensor_pattern() const { return tensor_prefix() + "*"; }
  std::string name_of(std::string_view record_key) const {
    const std::string tp = tensor_prefix();
    return record_key.starts_with(tp) ? std::string(record_key.substr(tp.size())) : std::string();
  }
  // Whether `key` is one of the registries' reply lists (reply(), request_reply(), ...).
  // Keys of a Redis Cluster (hash-tagged).
  bool cluster() const { return prefix_.starts_with('{'); }
  bool is_reply(std::string_view key) const { return key.starts_with(prefix_ + "memcuda:reply:"); }
  // SCAN pattern of every unlinked-but-held record.
  std::string removed_pattern() const { return prefix_ + "memcuda:removed:*"; }
  // The prefixes of the keys written only when a name stops meaning its
  // generation (remove, migration, loss): the reference cache's
  // invalidation connection tracks them (holdings.hpp, invalidation.hpp).
  std::string removed_prefix() const { return prefix_ + "memcuda:removed:"; }
  std::string moved_prefix() const { return prefix_ + "memcuda:moved:"; }
  std::string lost_prefix() const { return prefix_ + "memcuda:lost:"; }
  // Where a malformed record is moved aside (detail/store/quarantine.hpp):
  // `record_key` is one of this namespace's record keys (tensor(), removed()),
  // kept under its own suffix ("tensor:X", "removed:42"); and the Hash that
  // indexes them (that suffix -> why).
  std::string quarantine(std::string_view record_key) const {
    std::string_view k = record_key;
    const std::string own = own_prefix();
    if (k.starts_with(own)) k.remove_prefix(own.size());
    return own + "quarantine:" + std::string(k);
  }
  std::string quarantined() const { return prefix_ + "memcuda:quarantined"; }
  // The quarantine key of a quarantined record by its id (its suffix, "tensor:X").
  std::string quarantine_of_id(std::string_view id) const { return own_prefix() + "quarantine:" + std::string(id); }
  // The prefix every key of the registry itself starts with.
  std::string own_prefix() const { return prefix_ + "memcuda:"; }

 // "@<node>" in a fleet, else empty.
  const std::string& node_scope() const noexcept { return scope_; }

 private:
  std::string scope_;
  std::string prefix_;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
