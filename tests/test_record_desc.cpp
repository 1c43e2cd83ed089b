// The desc field (protocol/record_desc.hpp): its codec against
// decode_record, the batch get's use of it against a real redis-server
// (used only when it names the record's generation and epoch; a malformed
// one is that name's typed error and leaks no reference), and a record
// republished by a takeover read correctly by a batch get (real processes:
// memcuda_test_worker, the memcuda CLI).
#include <signal.h>
#include <limits.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "memcuda/protocol.hpp"
#include "memcuda/protocol/record_desc.hpp"
#include "memcuda/redis/connection.hpp"
#include "support/standby_sync.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/timing.hpp"
#include "support/worker.hpp"

using namespace memcuda;
using namespace std::chrono_literals;
namespace p = memcuda::protocol;

namespace {

TensorInfo host_record() {
  TensorInfo t;
  t.name = "m/layer.0/w";
  t.dtype = DType::bf16;
  t.shape = {64, 32};
  t.ctime_ms = 1795452580426;
  t.node = "vm/3c82b4be";
  t.device = -1;
  t.bytes = 64 * 32 * 2;
  t.backend = BackendKind::host;
  t.ipc_handle = "host:9949-f10d2887daff886b:1";
  t.offset = 4096;
  t.alloc_bytes = 33554432;
  t.alloc_id = 7;
  t.alloc_kind = "host_memfd";
  t.refcount = 3;
  t.state = TensorState::ready;
  t.generation = 1795452580450673;
  t.epoch = 4;
  t.owner = "9949-f10d2887daff886b";
  t.owner_pid = 9949;
  t.create_id = "9949-f10d2887daff886b:b1:5";
  t.event_version = 0;
  return t;
}

TensorInfo cuda_record() {
  TensorInfo t = host_record();
  t.backend = BackendKind::cuda;
  t.device = 3;
  t.device_uuid = "GPU-8d1d9a2e-0000-4000-8000-000000000001";
  t.ipc_handle = std::string(64, '\0');
  for (int i = 0; i < 64; ++i) t.ipc_handle[i] = static_cast<char>(i * 7);  // NULs and ':' inside
  t.ipc_handle[10] = ':';
  t.alloc_kind = "cuda_ipc";
  t.event_handle = std::string(64, '\x3a');
  t.event_version = 12;
  t.create_id.clear();  // an empty field travels as absent and reads back empty
  return t;
}

// What the batch get reads next to the desc, for `t`.
p::LiveFields live_of(const TensorInfo& t, std::string& gen, std::string& epoch, std::string& ev) {
  gen = std::to_string(t.generation);
  epoch = std::to_string(t.epoch);
  ev = std::to_string(t.event_version);
  p::LiveFields l;
  l.refcount = t.refcount;
  l.event_handle = std::string_view(t.event_handle);
  l.event_version = std::string_view(ev);
  l.generation = gen;
  l.epoch = epoch;
  return l;
}

TensorInfo via_desc(const TensorInfo& t) {
  std::string gen, epoch, ev;
  const std::string d = p::encode_desc(t);
  return p::decode_desc(d, live_of(t, gen, epoch, ev));
}

ProtocolErrc desc_error(const std::string& d, const TensorInfo& t) {
  std::string gen, epoch, ev;
  try {
    (void)p::decode_desc(d, live_of(t, gen, epoch, ev));
  } catch (const ProtocolError& e) {
    INFO(e.what());
    CHECK(std::strstr(e.what(), "desc") != nullptr);
    return e.errc();
  }
  FAIL("decode_desc accepted a malformed desc: " << d);
  return ProtocolErrc::bad_json;
}

}  // namespace

TEST_CASE("desc: a record read through its desc equals the record decode_record reads", "[protocol][desc]") {
  for (TensorInfo t : {host_record(), cuda_record()}) {
    INFO(to_string(t.backend));
    const TensorInfo back = via_desc(t);
    TensorInfo expect = p::decode_record(p::encode_record(t));
    expect.holders.clear();  // not in a desc: they change all the time
    CHECK(back == expect);
    CHECK(back.ipc_handle == t.ipc_handle);
    CHECK(back.refcount == t.refcount);
  }
  // A desc is compact: about 200 bytes for a host record, 250 for a cuda one.
  CHECK(p::encode_desc(host_record()).size() < 240);
  CHECK(p::encode_desc(cuda_record()).size() < 300);
  // The body is the desc without its generation, which the create script appends.
  const TensorInfo t = host_record();
  const std::string gen = std::to_string(t.generation);
  CHECK(p::encode_desc(t) == p::encode_desc_body(t) + std::to_string(gen.size()) + ":" + gen);
  // Nothing that changes is in it.
  const p::DescView v = p::parse_desc(p::encode_desc(cuda_record()));
  CHECK(v.extras.empty());
  CHECK(v.generation == std::to_string(cuda_record().generation));
  CHECK(v.epoch == "4");
}

TEST_CASE("desc: a field it does not know travels in the extras and is decoded as decode_record does",
          "[protocol][desc]") {
  p::Fields f = p::encode_record(host_record());
  f.emplace_back("future_field", "@memcuda-x:12:34");  // a field added by a later version
  std::string body = p::encode_desc_body(f);
  const std::string gen = std::to_string(host_record().generation);
  body += std::to_string(gen.size()) + ":" + gen;
  const p::DescView v = p::parse_desc(body);
  REQUIRE(v.extras.size() == 1);
  CHECK(v.extras[0].first == "future_field");
  CHECK(v.extras[0].second == "@memcuda-x:12:34");
  std::string g, e, ev;
  TensorInfo t = host_record();
  const TensorInfo back = p::decode_desc(body, live_of(t, g, e, ev));
  t.holders.clear();
  CHECK(back == p::decode_record(p::encode_record(t)));

  // fd_source (cuda_vmm_fd) came after version 1: an extra, read straight into the record
  TensorInfo vmm = cuda_record();
  vmm.alloc_kind = "cuda_vmm_fd";
  vmm.ipc_handle = std::string(64, 'k');
  vmm.fd_source = "v1;7;9949;12;64768;131;@memcuda-ns-9949";
  const std::string vd = p::encode_desc(vmm);
  REQUIRE(p::parse_desc(vd).extras.size() == 1);
  CHECK(p::parse_desc(vd).extras[0].first == "fd_source");
  const TensorInfo vback = via_desc(vmm);
  CHECK(vback.fd_source == vmm.fd_source);
  vmm.holders.clear();
  CHECK(vback == p::decode_record(p::encode_record(vmm)));
  // its rule is decode_record's
  TensorInfo bad = vmm;
  bad.fd_source = std::string("v1;\x01", 4);
  CHECK(desc_error(p::encode_desc(bad), vmm) == ProtocolErrc::bad_record);
}

TEST_CASE("desc: RecordReader fed an HGETALL decodes as decode_record, errors included", "[protocol][desc]") {
  TensorInfo t = cuda_record();
  t.holders = {{"123-abc", 2}, {"@name", 1}};
  p::Fields f = p::encode_record(t);
  f.emplace_back("desc", p::encode_desc(t));  // ignored
  p::RecordReader r;
  for (const auto& [k, v] : f) r.add(k, v);
  CHECK(r.finish() == p::decode_record(f));
  CHECK(r.finish() == t);

  // Each rule of decode_record: the same verdict (a ProtocolError, bad_record).
  auto both_reject = [](p::Fields g) {
    p::RecordReader rr;
    for (const auto& [k, v] : g) rr.add(k, v);
    CHECK_THROWS_AS(p::decode_record(g), ProtocolError);
    try {
      (void)rr.finish();
      FAIL("RecordReader accepted what decode_record rejects");
    } catch (const ProtocolError& e) {
      CHECK(e.errc() == ProtocolErrc::bad_record);
    }
  };
  auto with = [&](std::string_view key, std::string value) {
    p::Fields g = f;
    for (auto& [k, v] : g)
      if (k == key) v = value;
    return g;
  };
  auto without = [&](std::string_view key) {
    p::Fields g;
    for (const auto& kv : f)
      if (kv.first != key) g.push_back(kv);
    return g;
  };
  both_reject(with("bytes", "4097"));
  both_reject(with("device", "-1"));
  both_reject(with("ipc_handle", "short"));
  both_reject(with("event_handle", "x"));
  both_reject(with("alloc_bytes", "10"));
  both_reject(with("alloc_kind", "Bad Kind"));
  both_reject(with("holder:@name", "-1"));
  both_reject(with("refcount", "x"));
  {
    p::Fields g = f;
    g.emplace_back("fd_source", std::string(600, 'a'));
    both_reject(g);
  }
  both_reject(without("name"));
  both_reject(without("alloc_bytes"));
  p::Fields twice = f;
  twice.emplace_back("shape", "[1]");
  both_reject(twice);
}

TEST_CASE("desc: a malformed or stale desc is a typed ProtocolError naming desc", "[protocol][desc]") {
  const TensorInfo t = host_record();
  const std::string good = p::encode_desc(t);
  CHECK(desc_error("M2" + good.substr(2), t) == ProtocolErrc::bad_record);  // another version
  CHECK(desc_error("", t) == ProtocolErrc::bad_record);
  CHECK(desc_error(good.substr(0, good.size() - 3), t) == ProtocolErrc::bad_record);  // cut
  CHECK(desc_error(good + "x", t) == ProtocolErrc::bad_record);                       // trailing bytes
  CHECK(desc_error("M199999999:x", t) == ProtocolErrc::bad_record);                   // length too long
  CHECK(desc_error("M1" + std::string("x:") + good.substr(2), t) == ProtocolErrc::bad_record);
  // an extra carrying a field that changes (it would hide the live value)
  {
    p::Fields f = p::encode_record(t);
    f.emplace_back("weird", "1");
    std::string body = p::encode_desc_body(f);
    const std::string from = "5:weird1:1";
    const auto at = body.find(from);
    REQUIRE(at != std::string::npos);
    body.replace(at, from.size(), "8:refcount1:9");
    const std::string gen = std::to_string(t.generation);
    CHECK(desc_error(body + std::to_string(gen.size()) + ":" + gen, t) == ProtocolErrc::bad_record);
  }
  // stale: describes another generation, or another epoch
  TensorInfo other = t;
  other.generation += 1;
  CHECK(desc_error(p::encode_desc(other), t) == ProtocolErrc::bad_record);
  other = t;
  other.epoch += 1;
  CHECK(desc_error(p::encode_desc(other), t) == ProtocolErrc::bad_record);
  // a desc whose fields break the record's rules
  other = t;
  other.bytes = 1;
  CHECK(desc_error(p::encode_desc(other), t) == ProtocolErrc::bad_record);
}

namespace {

RegistryOptions desc_opts(const test::RedisServer& srv, bool control) {
  auto o = test::host_options(srv, control);
  o.lease_ttl = control ? 30s : 300ms;
  o.request_timeout = 5s;
  return o;
}

using test::cli_path;
using test::hget;
using test::ready;

std::vector<float> read_floats(const SharedTensor<void>& t) {
  std::vector<float> v(t.bytes() / sizeof(float));
  SharedTensor<float>(t.handle()).copy_to_host(v);
  return v;
}

}  // namespace

TEST_CASE("desc: create_many writes it, create does not, and a batch get uses it only when current",
          "[redis][batch][desc]") {
  test::RedisServer srv;
  TensorRegistry leader(desc_opts(srv, true));
  REQUIRE(leader.is_leader());
  auto made = leader.create_many({{"d/a", DType::f32, {4}, {}}, {"d/b", DType::f32, {2, 3}, {}},
                                  {"d/c", DType::f32, {8}, {}}});
  auto single = leader.create<float>("d/single", {5});
  for (auto& [n, t] : made) {
    std::vector<float> v(t.bytes() / 4, static_cast<float>(n.back()));
    SharedTensor<float>(t.handle()).copy_from_host(v);
  }
  redis::Connection raw(srv.options());
  CHECK(raw.command({"HEXISTS", "memcuda:tensor:d/single", "desc"}).integer() == 0);
  for (const auto& [n, t] : made) {
    INFO(n);
    const std::string d = hget(raw, "memcuda:tensor:" + n, "desc");
    REQUIRE_FALSE(d.empty());
    const p::DescView v = p::parse_desc(d);
    CHECK(v.generation == std::to_string(t.generation()));
    CHECK(v.epoch == hget(raw, "memcuda:tensor:" + n, "epoch"));
  }

  TensorRegistry reader(desc_opts(srv, false));
  {
    auto got = reader.get_many({"d/a", "d/b", "d/c", "d/single"});
    REQUIRE(got.ok());
    for (const auto& [n, t] : got.tensors) {
      INFO(n);
      TensorInfo expect = reader.info(n);
      TensorInfo seen = t.info();
      if (n != "d/single") CHECK(seen.holders.empty());  // read through the desc
      seen.holders.clear();
      expect.holders.clear();
      seen.refcount = expect.refcount = 0;  // both taken at other times
      CHECK(seen == expect);
      if (n != "d/single") CHECK(read_floats(t) == std::vector<float>(t.bytes() / 4, static_cast<float>(n.back())));
    }
    CHECK(got.tensors.at("d/b").shape() == Shape{2, 3});
  }

  // The desc is what a batch get reads: a field rewritten behind the desc's
  // back (only a test does that) does not show while the desc is current...
  const TensorInfo b = reader.info("d/b");
  REQUIRE(b.ctime_ms != 12345);
  raw.command({"HSET", "memcuda:tensor:d/b", "ctime", "12345"});
  CHECK(reader.get_many({"d/b"}).tensors.at("d/b").info().ctime_ms == b.ctime_ms);
  // ...and shows once the desc is stale (another generation's) or of a
  // version this reader does not know: the fields are read instead.
  TensorInfo older = b;
  older.generation -= 1;
  raw.command({"HSET", "memcuda:tensor:d/b", "desc", p::encode_desc(older)});
  CHECK(reader.get_many({"d/b"}).tensors.at("d/b").info().ctime_ms == 12345);
  TensorInfo other_epoch = b;
  other_epoch.epoch += 1;
  raw.command({"HSET", "memcuda:tensor:d/b", "desc", p::encode_desc(other_epoch)});
  CHECK(reader.get_many({"d/b"}).tensors.at("d/b").info().ctime_ms == 12345);
  raw.command({"HSET", "memcuda:tensor:d/b", "desc", "M9" + p::encode_desc(b).substr(2)});
  CHECK(reader.get_many({"d/b"}).tensors.at("d/b").info().ctime_ms == 12345);
  raw.command({"HSET", "memcuda:tensor:d/b", "desc", p::encode_desc(b)});
  CHECK(reader.get_many({"d/b"}).tensors.at("d/b").info().ctime_ms == b.ctime_ms);
}

TEST_CASE("desc: a malformed desc is that name's ProtocolError, and its reference is given back", "[redis][batch][desc]") {
  test::RedisServer srv;
  TensorRegistry leader(desc_opts(srv, true));
  REQUIRE(leader.is_leader());
  auto made = leader.create_many({{"e/a", DType::f32, {4}, {}}, {"e/b", DType::f32, {4}, {}}});
  redis::Connection raw(srv.options());
  const std::string key = "memcuda:tensor:e/b";
  const std::string gen = hget(raw, key, "generation"), epoch = hget(raw, key, "epoch");
  const std::string rc_before = hget(raw, key, "refcount");
  // It ends with the record's epoch and generation (so the script passes it
  // on) but its body is cut.
  raw.command({"HSET", key, "desc",
               "M13:e/b" + std::to_string(epoch.size()) + ":" + epoch + std::to_string(gen.size()) + ":" + gen});
  TensorRegistry reader(desc_opts(srv, false));
  auto got = reader.get_many({"e/a", "e/b"});
  CHECK(got.tensors.count("e/a") == 1);
  REQUIRE(got.errors.count("e/b") == 1);
  CHECK(got.errors.at("e/b").code == std::string("protocol_error"));
  CHECK(got.errors.at("e/b").message.find("desc") != std::string::npos);
  CHECK_THROWS_AS(got.errors.at("e/b").rethrow(), ProtocolError);
  CHECK(hget(raw, key, "refcount") == rc_before);  // given back
  CHECK(raw.command({"HEXISTS", key, "holder:" + reader.session_id()}).integer() == 0);
}

namespace {

constexpr int kTtlMs = 400;

std::unique_ptr<test::Child> worker(const test::RedisServer& srv) {
  return std::make_unique<test::Child>(std::vector<std::string>{test::sibling_program("memcuda_test_worker"), "--url",
                                                                srv.unix_url(), "--ttl", std::to_string(kTtlMs),
                                                                "--backend", "host"});
}

using test::eventually;

}  // namespace

// The allocator of record (a worker) creates a model with create_many
// (through the CLI: one create_many command), persistent, so only the
// names hold it; the test writes each tensor's values. The worker is
// killed with SIGKILL; its standby adopts every record under a new
// generation and epoch (the migrate script drops the desc). A batch get
// then reads the republished records: new generation, new owner, the same
// bytes. A desc of the old generation put back by hand is not used.
TEST_CASE("desc: a record republished by a takeover is read correctly by a batch get",
          "[redis][multiprocess][takeover][desc]") {
  test::RedisServer srv;
  redis::Connection c(srv.options());
  auto a = worker(srv);
  REQUIRE(ready(*a));
  auto s = worker(srv);
  CHECK_FALSE(ready(*s));
  const std::vector<std::string> names{"k/w0", "k/w1", "k/w2"};
  {
    test::Child cli({cli_path(), "--url", srv.unix_url(), "create-many", "k/w0=f32:16", "k/w1=f32:3,5",
                     "k/w2=f32:1000"});
    std::string out;
    while (auto l = cli.read_line(30s)) out += *l + "\n";
    INFO(out);
    REQUIRE(cli.wait() == 0);
  }
  std::map<std::string, std::string> old_desc, old_gen;
  const std::string a_pid = std::to_string(a->pid()), s_pid = std::to_string(s->pid());
  {
    TensorRegistry w(desc_opts(srv, false));
    auto got = w.get_all(names);
    float base = 1;
    for (auto& [n, t] : got) {
      std::vector<float> v(t.bytes() / 4);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = base + static_cast<float>(i);
      SharedTensor<float>(t.handle()).copy_from_host(v);
      base += 100;
      const std::string k = "memcuda:tensor:" + n;
      old_desc[n] = hget(c, k, "desc");
      old_gen[n] = hget(c, k, "generation");
      CHECK_FALSE(old_desc[n].empty());
      CHECK(hget(c, k, "owner_pid") == a_pid);
    }
  }  // released: only the names hold them
  // their memory outlives a only in the fd the standby holds
  REQUIRE(eventually([&] { return test::standby_synced(c, s->pid(), names); }));
  a->kill(SIGKILL);
  a->wait();
  REQUIRE(eventually([&] { return s->ask("leader") == "OK leader=1"; }));
  REQUIRE(eventually([&] {
    for (const auto& n : names)
      if (hget(c, "memcuda:tensor:" + n, "owner_pid") != s_pid) return false;
    return true;
  }));
  for (const auto& n : names) {
    INFO(n);
    const std::string k = "memcuda:tensor:" + n;
    CHECK(hget(c, k, "generation") != old_gen[n]);
    CHECK(c.command({"HEXISTS", k, "desc"}).integer() == 0);  // the migrate script dropped it
  }
  auto check_read = [&](const char* what) {
    INFO(what);
    TensorRegistry r(desc_opts(srv, false));
    auto got = r.get_many(names);
    REQUIRE(got.ok());
    float base = 1;
    for (const auto& n : names) {
      INFO(n);
      const auto& t = got.tensors.at(n);
      const std::string k = "memcuda:tensor:" + n;
      CHECK(std::to_string(t.generation()) == hget(c, k, "generation"));
      CHECK(t.info().owner_pid == std::stoll(s_pid));
      CHECK(std::to_string(t.info().epoch) == hget(c, k, "epoch"));
      auto v = read_floats(t);
      bool intact = true;
      for (std::size_t i = 0; i < v.size(); ++i) intact = intact && v[i] == base + static_cast<float>(i);
      CHECK(intact);
      base += 100;
    }
  };
  check_read("after the takeover");
  for (const auto& n : names) c.command({"HSET", "memcuda:tensor:" + n, "desc", old_desc[n]});
  check_read("with the old generation's desc put back");
  for (const auto& n : names) {
    TensorRegistry r(desc_opts(srv, false));
    r.remove(n);
  }
  CHECK(s->ask("exit") == "OK");
}
