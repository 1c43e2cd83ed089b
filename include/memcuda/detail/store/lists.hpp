// Typed access to the lists of the schema (docs/protocol.md, "Keys"): the
// lifecycle list of JSON commands, the allocator of record's processing
// list, the reply lists and inboxes that carry answers and messages, and
// the waiter sets of wait() and wait_version(). Each function sends exactly
// the commands its name says, in one round trip; the *_cmd forms build a
// blocking pop for a caller that runs it interruptibly.
#pragma once

#include "memcuda/config.hpp"

#include <chrono>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "memcuda/detail/store/keys.hpp"
#include "memcuda/detail/store/reply.hpp"
#include "memcuda/redis/connection.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail::store {

// ---- the lifecycle list ----

// Queues a JSON command for the allocator of record (LPUSH). A lifecycle
// list of the wrong type (another client's) is moved aside by the
// allocator of record at its next GC round (schema.hpp): waits for that.
inline void push_command(redis::Connection& c, const Keys& k, std::string_view payload) {
  for (int tries = 0;; ++tries) {
    try {
      c.command({"LPUSH", k.lifecycle(), payload});
      return;
    } catch (const ReplyError& e) {
      if (e.prefix() != "WRONGTYPE") throw;
      if (tries == 60)
        throw ReplyError("the lifecycle list '" + k.lifecycle() +
                             "' is not a list (written by another Redis client?) and no allocator of record moved it "
                             "aside within 3 s: is one serving (`memcuda leader`)? Its GC round does so "
                             "(docs/operations.md, \"Keys of the wrong type\")",
                         "WRONGTYPE");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
}
// Takes a queued command back if no leader has picked it up: true when it was still there (LREM).
inline bool retract_command(redis::Connection& c, const Keys& k, std::string_view payload) {
  return c.command({"LREM", k.lifecycle(), 1, payload}).integer() == 1;
}
// Moves one command of a processing list back to the end of the lifecycle
// list that is served next: false when the list is empty (LMOVE).
inline bool requeue_one(redis::Connection& c, const Keys& k, std::string_view processing) {
  return !c.command({"LMOVE", processing, k.lifecycle(), "LEFT", "RIGHT"}).is_nil();
}
// The blocking move of the next command onto the processing list, less its
// timeout argument (BLMOVE): the control loop runs it interruptibly.
inline std::vector<std::string> take_command_cmd(const Keys& k, std::string processing) {
  return {"BLMOVE", k.lifecycle(), std::move(processing), "RIGHT", "LEFT"};
}

// ---- reply lists and inboxes ----

// Waits up to `wait` for one element of a list (BLPOP): nil, or {list, element}.
inline redis::Reply pop_wait(redis::Connection& c, std::string_view list, std::chrono::milliseconds wait) {
  return c.blocking(wait, {"BLPOP", list, seconds_arg(wait)});
}
// A session's inbox pop, less its timeout argument (BLPOP): the control loop runs it interruptibly.
inline std::vector<std::string> inbox_pop_cmd(const Keys& k, std::string_view sid) { return {"BLPOP", k.inbox(sid)}; }
// One message of a session's inbox without waiting (LPOP): nil when empty.
inline redis::Reply inbox_take(redis::Connection& c, const Keys& k, std::string_view sid) {
  return c.command({"LPOP", k.inbox(sid)});
}

// Pushes a message onto a list that expires a minute later (LPUSH, PEXPIRE):
// an inbox or a reply list that nobody reads goes away.
inline void push_expiring(redis::Connection& c, std::string_view list, std::string body) {
  c.pipeline({{"LPUSH", std::string(list), std::move(body)}, {"PEXPIRE", std::string(list), "60000"}});
}

// ---- waiters of a name (wait()) ----

// Registers a private list in a name's waiter set, the set kept `ttl_ms`.
inline void add_waiter(redis::Connection& c, const std::string& waiters, const std::string& list, std::string ttl_ms) {
  c.pipeline({{"SADD", waiters, list}, {"PEXPIRE", waiters, std::move(ttl_ms)}});
}
// Unregisters it and deletes the list (a push may have arrived meanwhile).
inline void remove_waiter(redis::Connection& c, const std::string& waiters, const std::string& list) {
  c.pipeline({{"SREM", waiters, list}, {"DEL", list}});
}

// ---- waiters of a model (wait_version()) ----

// Registers a private list in the model's waiter set and reads the model
// record, one pipeline: [SADD, PEXPIRE, HGETALL].
inline std::vector<redis::Reply> add_model_waiter_and_read(redis::Connection& c, const std::string& waiters,
                                                           const std::string& list, std::string ttl_ms,
                                                           const std::string& model) {
  return c.pipeline({{"SADD", waiters, list}, {"PEXPIRE", waiters, std::move(ttl_ms)}, {"HGETALL", model}});
}
// Reads the model record and unregisters, one pipeline: [HGETALL, SREM, DEL].
inline std::vector<redis::Reply> read_model_and_remove_waiter(redis::Connection& c, const std::string& waiters,
                                                              const std::string& list, const std::string& model) {
  return c.pipeline({{"HGETALL", model}, {"SREM", waiters, list}, {"DEL", list}});
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail::store
