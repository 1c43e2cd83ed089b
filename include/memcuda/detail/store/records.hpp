// Typed access to the records of the schema (docs/protocol.md, "Keys"):
// tensor records (named, unlinked), state-dict records and model records,
// read and written field by field outside the scripts. Each function sends
// exactly the one command its name says; the *_cmd forms build that command
// for a caller's pipeline. Field names are protocol/'s constants.
#pragma once

#include "memcuda/config.hpp"

#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>

#include "memcuda/detail/store/keys.hpp"
#include "memcuda/protocol/model_record.hpp"
#include "memcuda/protocol/record.hpp"
#include "memcuda/redis/connection.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::store {

namespace field = protocol::record_field;

// ---- any record key ----

// Every field of a record (HGETALL): an empty array when it is absent.
inline redis::Reply read_record(redis::Connection& c, std::string_view key) { return c.command({"HGETALL", key}); }
inline redis::Command read_record_cmd(std::string key) { return {"HGETALL", std::move(key)}; }

// One field (HGET): nil when the record or the field is absent.
inline redis::Reply read_field(redis::Connection& c, std::string_view key, std::string_view f) {
  return c.command({"HGET", key, f});
}
inline redis::Command read_field_cmd(std::string key, std::string_view f) {
  return {"HGET", std::move(key), std::string(f)};
}

// Some fields, in the order given (HMGET): one element each, nil when absent.
template <class... F>
inline redis::Reply read_fields(redis::Connection& c, std::string_view key, F... f) {
  return c.command({"HMGET", key, std::string_view(f)...});
}
inline redis::Command read_fields_cmd(std::string key, std::initializer_list<std::string_view> fs) {
  redis::Command cmd{"HMGET", std::move(key)};
  for (auto f : fs) cmd.emplace_back(f);
  return cmd;
}

// The field names of a record (HKEYS).
inline redis::Reply field_names(redis::Connection& c, std::string_view key) { return c.command({"HKEYS", key}); }
inline redis::Command field_names_cmd(std::string key) { return {"HKEYS", std::move(key)}; }

// Deletes a record (DEL).
inline void delete_record(redis::Connection& c, std::string_view key) { c.command({"DEL", key}); }
inline redis::Command delete_record_cmd(std::string key) { return {"DEL", std::move(key)}; }

// The Redis type of a key ("hash", "none", ...): TYPE.
inline std::string key_type(redis::Connection& c, std::string_view key) {
  return std::string(c.command({"TYPE", key}).str());
}
inline redis::Command key_type_cmd(std::string key) { return {"TYPE", std::move(key)}; }

// Whether a key exists (EXISTS).
inline bool exists(redis::Connection& c, std::string_view key) { return c.command({"EXISTS", key}).integer() == 1; }
inline redis::Command exists_cmd(std::string key) { return {"EXISTS", std::move(key)}; }

// A holder's count is stored in the field "holder:<id>": the holder of a
// field name, or "" when the field is none of those.
inline bool is_holder_field(std::string_view f) { return f.starts_with(field::holder_prefix); }
inline std::string_view holder_of_field(std::string_view f) {
  return f.starts_with(field::holder_prefix) ? f.substr(field::holder_prefix.size()) : std::string_view();
}

// ---- SCAN of record keys (events and bounded sweeps only) ----

// One SCAN page of the unlinked records: {cursor, [keys]}.
inline redis::Reply scan_unlinked(redis::Connection& c, const Keys& k, std::string_view cursor, std::size_t count) {
  return c.command({"SCAN", cursor, "MATCH", k.removed_pattern(), "COUNT", count});
}

// ---- tensor records ----

// The generation a name has now (nil: no such name).
inline redis::Reply read_generation(redis::Connection& c, const Keys& k, std::string_view name) {
  return read_field(c, k.tensor(name), field::generation);
}
// The state a name has now (nil: no such name).
inline redis::Reply read_state(redis::Connection& c, const Keys& k, std::string_view name) {
  return read_field(c, k.tensor(name), field::state);
}
// The refcount of an unlinked record (nil: none of that generation).
inline redis::Reply read_unlinked_refcount(redis::Connection& c, const Keys& k, std::uint64_t gen) {
  return read_field(c, k.removed(gen), field::refcount);
}
inline redis::Command read_unlinked_refcount_cmd(const Keys& k, std::uint64_t gen) {
  return read_field_cmd(k.removed(gen), field::refcount);
}
// {create_id, generation} of a record: whether a lost create attempt made it.
inline redis::Reply read_create_id(redis::Connection& c, std::string_view key) {
  return read_fields(c, key, field::create_id, field::generation);
}

// ---- model records (detail/registry/ops/model_version.hpp) ----

namespace model_field = protocol::model_field;

inline redis::Reply read_model_version(redis::Connection& c, const Keys& k, std::string_view prefix) {
  return read_field(c, k.model(prefix), model_field::version);
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::store
