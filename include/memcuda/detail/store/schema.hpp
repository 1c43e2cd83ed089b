// Every key of the schema, in one table: what builds it (a Keys member),
// its Redis type, who writes it and how it is repaired when another Redis
// client writes it with another type (or, for a counter, a value that does
// not parse). docs/protocol.md lists the same keys; tests/test_schema.cpp
// checks that every key Keys can build is here and that the two lists
// agree, so a key cannot be added without saying how it is repaired.
//
// A fixed key (one per namespace) names its repair in `fix`: the allocator
// of record checks them all (one pipelined TYPE) when it takes the lease
// and at every garbage collection round, moves a key of the wrong type
// aside (quarantine, listed by `memcuda quarantine`) and rebuilds it
// (schema_repair.hpp). A key with a part (a name, a session, a
// generation) is handled where it is read or written: `rebuilt` says how,
// or that it is not repaired yet.
#pragma once

#include "memcuda/config.hpp"

#include <string>
#include <string_view>
#include <vector>

#include "memcuda/detail/store/keys.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::schema {

// How a fixed key of the wrong type is rebuilt once moved aside.
enum class Fix {
  none,              // not a fixed key: handled where read (see `rebuilt`)
  drop,              // nothing to rebuild: its writers fill it again
  names,             // from the records (SCAN of the record keys)
  usage,             // counted from the records, in the script that moves it
  owners,            // the live sessions that may lead (the leader's part)
  owner_uid,         // the repairing process's effective uid (the leader's part)
  lease,             // the holder's token again (the leader's part)
  dicts,             // from the state-dict links (SCAN memcuda:dictlink:*)
  dict_ids,          // from the state-dict records (SCAN memcuda:dict:*)
  generation,        // past the highest generation of every record (and the clock)
  epoch,             // past the epoch of the lease and of every processing list
  processing_lists,  // from the processing lists there are (SCAN)
  version_token,     // a new token when the allocations Hash exists
};

struct Key {
  std::string_view builder;  // the Keys member that builds it
  std::string_view pattern;  // as docs/protocol.md spells it
  std::string_view type;     // Redis TYPE ("string", "list", ...; "any", "channel")
  std::string_view writers;
  Fix fix;
  std::string_view rebuilt;
};

inline constexpr Key kKeys[] = {
    {"lifecycle", "tensor_lifecycle", "list", "any client (LPUSH), the leader (BLMOVE)", Fix::drop,
     "moved aside; a client's push waits for the repair"},
    {"quarantined", "memcuda:quarantined", "hash", "the leader's repairs", Fix::drop,
     "starts anew, its first entry naming the old one"},
    {"names", "memcuda:names", "zset", "scripts", Fix::names, "from the records"},
    {"usage", "memcuda:usage", "hash", "scripts", Fix::usage, "counted from the records"},
    {"holders", "memcuda:holders", "set", "scripts, GC", Fix::drop, "GC's sweep writes the records' holders back"},
    {"owners", "memcuda:owners", "set", "the leader", Fix::owners, "the live sessions that may lead"},
    {"sessions", "memcuda:sessions", "set", "registries, GC", Fix::drop, "each heartbeat adds its session back"},
    {"generation", "memcuda:generation", "string", "create, migrate, republish, dict scripts", Fix::generation,
     "past every record's generation and the clock"},
    {"epoch", "memcuda:epoch", "string", "lease script", Fix::epoch, "past every epoch in use"},
    {"leader", "memcuda:leader", "string", "lease scripts", Fix::lease,
     "the holder's token again; a campaign that fails on it repairs it first"},
    {"owner_uid", "memcuda:owner_uid", "string", "the lease winner", Fix::owner_uid, "the leader's uid again"},
    {"processing_lists", "memcuda:processing_lists", "set", "lease takeover", Fix::processing_lists,
     "from the processing lists there are"},
    {"dicts", "memcuda:dicts", "set", "dict scripts", Fix::dicts, "from the state-dict links"},
    {"dict_ids", "memcuda:dict_ids", "set", "dict scripts, GC", Fix::dict_ids, "from the state-dict records"},
    {"pool_stats", "memcuda:pool_stats", "string", "the leader", Fix::drop, "written again at the next round"},
    {"allocations", "memcuda:allocations", "hash", "each allocation's owner", Fix::drop,
     "each owner writes its fields back at its next pass"},
    {"allocations_version", "memcuda:allocations_version", "string", "whoever changes memcuda:allocations",
     Fix::version_token, "a new token"},
    // Keys with a part: checked where read or written.
    {"tensor", "memcuda:tensor:<name>", "hash", "scripts", Fix::none, "GC's sweep quarantines it, unlinks the name"},
    {"removed", "memcuda:removed:<generation>", "hash", "scripts", Fix::none, "GC's sweep quarantines it"},
    {"moved", "memcuda:moved:<generation>", "string", "migrate script", Fix::none, "a release through it fails"},
    {"freed_ack", "memcuda:freed_ack:<session>", "string", "the owner of held frees", Fix::none,
     "SET replaces it"},
    {"claim", "memcuda:claim:<generation>", "hash", "re-register script", Fix::none,
     "the next claim replaces it; the owner reads it as none"},
    {"lost", "memcuda:lost:<name>", "hash", "mark-lost script", Fix::none,
     "deleted by the next create of the name; a get of it fails until then"},
    {"inbox", "memcuda:inbox:<session>", "list", "the leader", Fix::none,
     "its session moves it aside when a read meets WRONGTYPE; the next message makes it again"},
    {"refs", "memcuda:refs:<holder>", "set", "scripts, GC", Fix::none,
     "moved aside where GC reads or writes it; the sweep writes it back"},
    {"processing", "memcuda:processing:<epoch>", "list", "the leader of that epoch", Fix::none,
     "the leader moves its own aside when a move into it meets WRONGTYPE"},
    {"session", "memcuda:session:<session>", "string", "each registry's thread", Fix::none,
     "its registry moves it aside when its heartbeat meets WRONGTYPE, and writes it again"},
    {"request_reply", "memcuda:reply:<session>:<n>", "list", "the leader", Fix::none,
     "the reply is not delivered: that one request fails"},
    {"batch_reply", "memcuda:reply:<session>:batch:<n>", "list", "the leader", Fix::none,
     "the reply is not delivered: that one batch fails"},
    {"stage_reply", "memcuda:reply:<session>:stage:<n>", "list", "a fleet node's stager", Fix::none,
     "the answer is not delivered: that pull fails"},
    {"migrate_reply", "memcuda:reply:<session>:migrate", "list", "holders", Fix::none,
     "the answer is not delivered: the migration is retried"},
    {"wait_list", "memcuda:reply:<session>:wait:<n>", "list", "create script", Fix::none,
     "skipped by the create; that wait() fails"},
    {"waiters", "memcuda:waiters:<name>", "set", "wait(), create script", Fix::none,
     "the next create of the name moves it aside"},
    {"model", "memcuda:model:<prefix>", "hash", "publish-version script", Fix::none,
     "not repaired: a publish of the model fails (WRONGTYPE)"},
    {"model_waiters", "memcuda:model_waiters:<prefix>", "set", "wait_version(), publish-version script", Fix::none,
     "not repaired: wait_version() and publishes of the model fail (WRONGTYPE)"},
    {"model_wait_list", "memcuda:reply:<session>:model_wait:<n>", "list", "publish-version script", Fix::none,
     "skipped by the publish; that wait_version() fails"},
    {"ready_channel", "memcuda:ready:<name>", "channel", "create script", Fix::none, "a channel, not a key"},
    {"dict", "memcuda:dict:<id>", "hash", "dict scripts", Fix::none,
     "not repaired: what reads it fails (WRONGTYPE)"},
    {"dict_link", "memcuda:dictlink:<prefix>", "string", "dict link script, unlinks", Fix::none,
     "not repaired: a script that reads it fails (WRONGTYPE)"},
    {"quarantine", "memcuda:quarantine:<id>", "any", "the leader's repairs", Fix::none, "kept as it is"},
    {"standby_synced", "memcuda:standby:<session>", "string", "that session's standby", Fix::none,
     "its next pass's SET replaces it"},
    {"standby_wake", "memcuda:standby_wake:<session>", "list", "the leader", Fix::none,
     "not repaired: the leader's wake of that standby fails"},
    {"stage", "memcuda:stage@<node scope>", "list", "other nodes' pulls (RPUSH), that node's allocator of record",
     Fix::none, "that node's stager deletes it when its pop meets WRONGTYPE; the pulls waiting on it fail"},
    {"pulling", "memcuda:pulling:<name>", "string", "a pulling node's allocator of record", Fix::none,
     "no claim: a pull meets it as another node's and goes on (a TTL is waited out, none is not)"},
    {"node", "memcuda:node:<node>", "hash", "that node's publisher", Fix::none,
     "its publisher's next refresh fails and it publishes again (DEL first); a read meets WRONGTYPE until then"},
};

// The Keys members that build no key of their own: a prefix, a pattern,
// a name taken apart, another spelling of a key above.
inline constexpr std::string_view kNotKeys[] = {"tensor_prefix", "tensor_pattern", "name_of",     "removed_pattern",
                                                "removed_prefix", "moved_prefix",  "lost_prefix", "own_prefix",
                                                "quarantine_of_id", "dict_of_holder", "reply",   "prefix",
                                                "node_scope"};

// A fixed key as this namespace spells it, with its entry.
struct Fixed {
  std::string key;
  const Key* spec;
};
inline std::string fixed_key(const Keys& k, std::string_view builder) {
  if (builder == "lifecycle") return k.lifecycle();
  if (builder == "quarantined") return k.quarantined();
  if (builder == "names") return k.names();
  if (builder == "usage") return k.usage();
  if (builder == "holders") return k.holders();
  if (builder == "owners") return k.owners();
  if (builder == "sessions") return k.sessions();
  if (builder == "generation") return k.generation();
  if (builder == "epoch") return k.epoch();
  if (builder == "leader") return k.leader();
  if (builder == "owner_uid") return k.owner_uid();
  if (builder == "processing_lists") return k.processing_lists();
  if (builder == "dicts") return k.dicts();
  if (builder == "dict_ids") return k.dict_ids();
  if (builder == "pool_stats") return k.pool_stats();
  if (builder == "allocations") return k.allocations();
  if (builder == "allocations_version") return k.allocations_version();
  return {};
}
// Every fixed key, in table order (the quarantine index first: each move
// notes itself there; the names before the counters counted from them).
inline std::vector<Fixed> fixed(const Keys& k) {
  std::vector<Fixed> out;
  for (const auto& e : kKeys)
    if (e.fix != Fix::none) out.push_back({fixed_key(k, e.builder), &e});
  return out;
}
inline const Key* find(std::string_view builder) {
  for (const auto& e : kKeys)
    if (e.builder == builder) return &e;
  return nullptr;
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::schema
