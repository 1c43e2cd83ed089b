// Errors keep their type across processes: an error the allocator of record
// throws travels as a reply's error object (make_error_reply, encode_reply)
// and the process that asked re-throws it (decode_reply, throw_reply_error /
// throw_for_code) as exactly the same class, with what that class carries.
// Needs neither Redis nor a GPU.
#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <string>
#include <typeinfo>
#include <vector>

#include "memcuda/error.hpp"
#include "memcuda/protocol/reply.hpp"

using namespace memcuda;

namespace {

struct Thrown {
  std::string type;  // typeid name of what was caught
  std::string what;
  std::optional<ProtocolErrc> errc;
  std::optional<int> cuda_status;
  std::string cuda_api;
};

template <class F>
Thrown catch_it(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    Thrown t{typeid(e).name(), e.what(), std::nullopt, std::nullopt, ""};
    if (const auto* pe = dynamic_cast<const ProtocolError*>(&e)) t.errc = pe->errc();
    if (const auto* ce = dynamic_cast<const CudaError*>(&e)) {
      t.cuda_status = ce->status();
      t.cuda_api = ce->api();
    }
    return t;
  } catch (...) {
    return {"not a memcuda::Error", "", std::nullopt, std::nullopt, ""};
  }
  return {"nothing thrown", "", std::nullopt, std::nullopt, ""};
}

// One instance of every class of error.hpp. A class added there must be
// added here (and to throw_for_code): the count below fails otherwise.
std::vector<std::function<void()>> every_error() {
  return {
      [] { throw Error("plain"); },
      [] { throw InvalidArgument("bad argument"); },
      [] { throw NotFound("no tensor named 'w'"); },
      [] { throw AlreadyExists("'w' exists"); },
      [] { throw TypeMismatch("f32, not i64"); },
      [] { throw StaleHandle("'w' was removed"); },
      [] { throw BudgetExceeded("over 1 GiB on cuda:0"); },
      [] { throw Lost("died with its allocator"); },
      [] { throw NotLeader("no allocator of record"); },
      [] { throw Unavailable("lives on another node"); },
      [] { throw InternalError("impossible state"); },
      [] { throw ProtocolError(ProtocolErrc::bad_dim, "field \"shape\"[0]: dimension -1 is negative"); },
      [] { throw ProtocolError(ProtocolErrc::bad_record, "tensor record \"w\": field \"bytes\" is missing"); },
      [] { throw CudaError(2, "cudaMalloc", "cudaMalloc failed: out of memory (2)"); },
      [] { throw RedisError("redis went away"); },
      [] { throw ConnectionError("no Redis at redis://127.0.0.1:1"); },
      [] { throw AuthError("WRONGPASS invalid username-password pair"); },
      [] { throw TimeoutError("command timed out after 100 ms"); },
      [] { throw ReplyError("ERR unknown command"); },
  };
}

}  // namespace

TEST_CASE("every error class survives a reply: same dynamic type, message and details",
          "[protocol]") {
  const auto errors = every_error();
  CHECK(errors.size() == 19);
  for (const auto& raise : errors) {
    const Thrown original = catch_it(raise);
    INFO("original: " << original.type << " \"" << original.what << "\"");
    protocol::Reply rep;
    try {
      raise();
    } catch (const std::exception& e) {
      rep = protocol::make_error_reply(nullptr, e);
    }
    REQUIRE(rep.error);
    const std::string json = protocol::encode_reply(rep);
    INFO("reply: " << json);
    const protocol::Reply back = protocol::decode_reply(json);
    CHECK(back == rep);
    REQUIRE(back.error);
    const Thrown remote = catch_it([&] { protocol::throw_reply_error(*back.error); });
    CHECK(remote.type == original.type);
    CHECK(remote.what == original.what);
    CHECK(remote.errc == original.errc);
    CHECK(remote.cuda_status == original.cuda_status);
    CHECK(remote.cuda_api == original.cuda_api);
  }
}

TEST_CASE("the error object carries errc and the CUDA status and API", "[protocol]") {
  auto pe = protocol::make_error_reply(nullptr, ProtocolError(ProtocolErrc::too_large, "big"));
  CHECK(protocol::encode_reply(pe) ==
        R"({"ok":false,"error":{"code":"protocol_error","message":"too_large: big","errc":"too_large"}})");
  auto ce = protocol::make_error_reply(nullptr, CudaError(700, "cudaMemcpy", "illegal address"));
  CHECK(protocol::encode_reply(ce) ==
        R"({"ok":false,"error":{"code":"cuda_error","message":"illegal address","cuda_status":700,"cuda_api":"cudaMemcpy"}})");

  // A newer sender's errc is ignored, the message prefix still gives it.
  auto r = protocol::decode_reply(
      R"({"ok":false,"error":{"code":"protocol_error","message":"bad_name: x","errc":"from_the_future"}})");
  REQUIRE(r.error);
  CHECK_FALSE(r.error->errc);
  auto t = catch_it([&] { protocol::throw_reply_error(*r.error); });
  CHECK(t.type == typeid(ProtocolError).name());
  CHECK(t.errc == ProtocolErrc::bad_name);
  CHECK(t.what == "x");

  struct Case {
    std::string json;
    ProtocolErrc errc;
  };
  const Case cases[] = {
      {R"({"ok":false,"error":{"code":"x","message":"m","errc":1}})", ProtocolErrc::wrong_type},
      {R"({"ok":false,"error":{"code":"x","message":"m","errc":null}})", ProtocolErrc::wrong_type},
      {R"({"ok":false,"error":{"code":"x","message":"m","cuda_status":"2"}})", ProtocolErrc::wrong_type},
      {R"({"ok":false,"error":{"code":"x","message":"m","cuda_status":2147483648}})", ProtocolErrc::bad_value},
      {R"({"ok":false,"error":{"code":"x","message":"m","cuda_status":1.0}})", ProtocolErrc::wrong_type},
      {R"({"ok":false,"error":{"code":"x","message":"m","cuda_api":""}})", ProtocolErrc::bad_value},
      {R"({"ok":false,"error":{"code":"x","message":"m","cuda_api":"a\u0001"}})", ProtocolErrc::bad_value},
      {R"({"ok":false,"error":{"code":"x","message":"m","cuda_api":[]}})", ProtocolErrc::wrong_type},
      {R"({"ok":false,"error":{"code":"x","message":"m","errc":"bad_dim","errc":"bad_dim"}})", ProtocolErrc::bad_json},
  };
  for (const Case& c : cases) {
    INFO(c.json);
    try {
      (void)protocol::decode_reply(c.json);
      FAIL("decoded");
    } catch (const ProtocolError& e) {
      CHECK(to_string(e.errc()) == std::string(to_string(c.errc)));
    }
  }
}

TEST_CASE("throw_for_code maps every wire code to its class", "[protocol]") {
  struct Case {
    const char* code;
    const std::type_info& type;
  };
  const Case cases[] = {
      {"error", typeid(Error)},
      {"invalid_argument", typeid(InvalidArgument)},
      {"protocol_error", typeid(ProtocolError)},
      {"not_found", typeid(NotFound)},
      {"already_exists", typeid(AlreadyExists)},
      {"type_mismatch", typeid(TypeMismatch)},
      {"stale_handle", typeid(StaleHandle)},
      {"budget_exceeded", typeid(BudgetExceeded)},
      {"lost", typeid(Lost)},
      {"not_leader", typeid(NotLeader)},
      {"unavailable", typeid(Unavailable)},
      {"not_zero_copy", typeid(NotZeroCopy)},
      {"internal", typeid(InternalError)},
      {"cuda_error", typeid(CudaError)},
      {"redis_error", typeid(RedisError)},
      {"redis_io", typeid(IoError)},
      {"redis_connection", typeid(ConnectionError)},
      {"redis_auth", typeid(AuthError)},
      {"redis_reply", typeid(ReplyError)},
      {"timeout", typeid(TimeoutError)},
      {"redis_from_the_future", typeid(RedisError)},
      {"from_the_future", typeid(Error)},
      {"", typeid(Error)},
  };
  for (const Case& c : cases) {
    INFO("code: " << c.code);
    CHECK(catch_it([&] { throw_for_code(c.code, "m"); }).type == c.type.name());
  }
  // "The command may have run" is one catch clause: both link failures are IoErrors, a reply is not.
  auto io = [](auto thrower) {
    try {
      thrower();
    } catch (const IoError&) {
      return true;
    } catch (const RedisError&) {
      return false;
    }
    return false;
  };
  CHECK(io([] { throw ConnectionError("c"); }));
  CHECK(io([] { throw TimeoutError("t"); }));
  CHECK(io([] { throw AuthError("a"); }));
  CHECK_FALSE(io([] { throw ReplyError("r"); }));
  CHECK_FALSE(io([] { throw RedisError("e"); }));
  // An older sender's protocol error: errc from the message's prefix.
  auto t = catch_it([] { throw_for_code("protocol_error", "unknown_dtype: f128"); });
  CHECK(t.errc == ProtocolErrc::unknown_dtype);
  CHECK(t.what == "f128");
  t = catch_it([] { throw_for_code("protocol_error", "no prefix"); });
  CHECK(t.errc == ProtocolErrc::bad_value);
  CHECK(t.what == "no prefix");
  t = catch_it([] { throw_for_code("cuda_error", "m"); });
  CHECK(t.cuda_status == -1);
  CHECK(t.cuda_api == "remote");
}
