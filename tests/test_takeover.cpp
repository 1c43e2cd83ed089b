// Takeover without loss on the host backend: when
// the allocator of record dies, its successor adopts the dead owner's
// memfds in place through the fds its standby thread holds (no byte copied)
// and republishes every record, so tensors held by nobody, persistent
// ones, survive. Real processes
// (memcuda_test_worker, the memcuda CLI) against a real redis-server.
// Also the pieces that adoption stands on: BlockAllocator::allocate_at, the
// records' "alloc_kind" and the pool statistics' adopted/copied counters.
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/detail/backend/select.hpp"
#include "memcuda/detail/registry/core.hpp"
#include "memcuda/memcuda.hpp"
#include "memcuda/protocol.hpp"
#include "support/standby_sync.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/text.hpp"
#include "support/timing.hpp"
#include "support/worker.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

constexpr int kTtlMs = 400;

std::unique_ptr<test::Child> worker(const test::RedisServer& srv, std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(), {"--ttl", std::to_string(kTtlMs), "--backend", "host"});
  return test::start_worker(srv.unix_url(), extra);
}

using test::cli_path;
using test::contains;
using test::field;
using test::hget;
using test::ready;
using test::starts_with;

using test::memfds_of;
using test::shm_objects_of;

// The parts of a record's fd_source ("v1;<id>;<pid>;<fd>;<dev>;<ino>;<address>").
std::vector<std::string> source_parts(const std::string& fd_source) {
  std::vector<std::string> parts;
  std::size_t at = 0;
  for (int i = 0; i < 6; ++i) {
    auto semi = fd_source.find(';', at);
    if (semi == std::string::npos) return parts;
    parts.push_back(fd_source.substr(at, semi - at));
    at = semi + 1;
  }
  parts.push_back(fd_source.substr(at));
  return parts;
}
// The memfd a record's fd_source names ("<st_dev>:<st_ino>"): adoption keeps it.
std::string file_of(const std::string& fd_source) {
  auto p = source_parts(fd_source);
  return p.size() == 7 ? p[4] + ":" + p[5] : std::string();
}
std::string source_pid(const std::string& fd_source) {
  auto p = source_parts(fd_source);
  return p.size() == 7 ? p[2] : std::string();
}

using test::eventually;

struct Tensor {
  std::string name;
  std::string dims;
  std::uint64_t elements;
  std::string digest;  // fnv of its bytes as written
};

// Three tensors in one slab (the small ones, the empty one) and one in an
// allocation of its own (over half the 32 MiB host slab).
std::vector<Tensor> sample_tensors() {
  return {{"t_small", "1000", 1000, {}},
          {"t_tiny", "3", 3, {}},
          {"t_empty", "0", 0, {}},
          {"t_big", "5000000", 5000000, {}}};
}

// The allocator of record `a` creates persistent tensors, writes a
// distinct pattern into each and drops its own references: only their
// names hold them. A standby is alive. `a` is killed with SIGKILL. The
// standby takes the lease and adopts a's memfds through the fds it holds:
// every record names it as owner (new generation), as the fd's source, and
// still points at the same memory (its key, the file's identity) and
// offset. A process started after the kill reads every tensor back
// byte-identical; the leader's pool statistics show every byte adopted and
// none copied. The standby's successor adopts them again when the standby
// is killed in turn. With `holder`, a process maps every tensor before the
// first kill and reads them through the same pointers, intact, after each
// takeover; what it writes afterwards is what a new reader sees (one
// memory, not a copy). At the end every tensor is removed and no memfd of
// any of these processes is left anywhere (nor anything in /dev/shm).
void takeover_adopts(bool holder) {
  test::RedisServer srv;
  auto c = srv.connect();
  auto a = worker(srv);
  REQUIRE(ready(*a));
  auto s1 = worker(srv);
  CHECK_FALSE(ready(*s1));  // the standby
  std::unique_ptr<test::Child> h;
  if (holder) {
    h = worker(srv, {"--no-control"});
    CHECK_FALSE(ready(*h));
  }
  const pid_t a_pid = a->pid();  // Child::pid() is -1 once it was waited for
  std::vector<pid_t> pids{a_pid, s1->pid()};
  if (h) pids.push_back(h->pid());
  REQUIRE(shm_objects_of(pids) == 0);
  REQUIRE(memfds_of(pids).empty());

  auto tensors = sample_tensors();
  std::uint64_t total = 0;
  std::map<std::string, std::string> handle, offset, gen, ptr;
  std::map<std::string, std::string> file;  // of each tensor's memfd: adoption keeps it
  std::uint64_t seed = 11;
  for (auto& t : tensors) {
    INFO(t.name);
    REQUIRE(starts_with(a->ask("createp " + t.name + " " + t.dims + " 0", 20s), "OK"));
    REQUIRE(a->ask("pattern " + t.name + " " + std::to_string(seed++)) == "OK");
    auto d = a->ask("digest " + t.name);
    REQUIRE(starts_with(d, "OK fnv="));
    t.digest = field(d, "fnv");
    REQUIRE(a->ask("release " + t.name) == "OK");  // only the name holds it now
    const std::string k = "memcuda:tensor:" + t.name;
    handle[t.name] = hget(c, k, "ipc_handle");
    file[t.name] = file_of(hget(c, k, "fd_source"));
    CHECK_FALSE(file[t.name].empty());
    CHECK(source_pid(hget(c, k, "fd_source")) == std::to_string(a->pid()));
    offset[t.name] = hget(c, k, "offset");
    gen[t.name] = hget(c, k, "generation");
    CHECK(hget(c, k, "alloc_kind") == "host_memfd");
    CHECK(starts_with(handle[t.name], "host:" + std::to_string(a->pid()) + "-"));
    CHECK(hget(c, k, "refcount") == "1");
    total += t.elements * sizeof(float);
    if (h) {
      REQUIRE(starts_with(h->ask("get " + t.name, 20s), "OK"));
      auto hd = h->ask("digest " + t.name);
      CHECK(field(hd, "fnv") == t.digest);
      ptr[t.name] = field(hd, "ptr");
    }
  }
  CHECK(handle["t_small"] == handle["t_tiny"]);  // one slab, several tensors
  CHECK(handle["t_small"] != handle["t_big"]);
  CHECK(memfds_of({a_pid}).size() == 2);
  CHECK(shm_objects_of({a_pid}) == 0);  // nothing named in /dev/shm
  // a also keeps an empty slab (retain_empty_slabs): three 15 MiB tensors
  // need a second slab, and all three go again
  const std::vector<std::string> fills{"t_fill1", "t_fill2", "t_fill3"};
  for (const auto& n : fills) REQUIRE(starts_with(a->ask("create " + n + " 3932160 1", 20s), "OK"));
  for (const auto& n : fills) REQUIRE(a->ask("release " + n) == "OK");
  CHECK(eventually([&] { return c.command({"EXISTS", "memcuda:tensor:t_fill3"}).integer() == 0; }));
  CHECK(memfds_of({a_pid}).size() == 3);

  // kill -9 the allocator of record; the standby takes over and adopts
  auto takeover = [&](test::Child& dead, test::Child& next) {
    const std::string dead_pid = std::to_string(dead.pid()), next_pid = std::to_string(next.pid());
    // the memory outlives `dead` only in the fds the standby holds
    std::vector<std::string> names;
    for (const auto& t : tensors) names.push_back(t.name);
    REQUIRE(eventually([&] { return test::standby_synced(c, next.pid(), names); }));
    dead.kill(SIGKILL);
    dead.wait();
    REQUIRE(eventually([&] { return next.ask("leader") == "OK leader=1"; }));
    REQUIRE(eventually([&] {
      for (const auto& t : tensors)
        if (hget(c, "memcuda:tensor:" + t.name, "owner_pid") != next_pid) return false;
      return true;
    }));
    for (const auto& t : tensors) {
      INFO(t.name);
      const std::string k = "memcuda:tensor:" + t.name;
      // the same memfd, adopted (not copied), its fd now served by the adopter
      CHECK(hget(c, k, "ipc_handle") == handle[t.name]);
      CHECK(file_of(hget(c, k, "fd_source")) == file[t.name]);
      CHECK(source_pid(hget(c, k, "fd_source")) == next_pid);
      CHECK(hget(c, k, "offset") == offset[t.name]);
      CHECK(hget(c, k, "generation") != gen[t.name]);      // republished under a new generation
      CHECK(hget(c, k, "alloc_kind") == "host_memfd");
      CHECK(hget(c, k, "refcount") == (h ? "2" : "1"));
      CHECK(c.command({"EXISTS", "memcuda:lost:" + t.name}).integer() == 0);
      gen[t.name] = hget(c, k, "generation");
    }
  };
  auto read_back = [&](test::Child& reader) {
    for (const auto& t : tensors) {
      INFO(t.name);
      auto r = reader.ask("get " + t.name, 20s);
      REQUIRE(starts_with(r, "OK gen=" + gen[t.name] + " "));
      CHECK(field(reader.ask("digest " + t.name), "fnv") == t.digest);
    }
  };
  auto holder_intact = [&] {
    if (!h) return;
    for (const auto& t : tensors) {
      INFO(t.name);
      auto hd = h->ask("digest " + t.name);
      CHECK(field(hd, "fnv") == t.digest);
      CHECK(field(hd, "ptr") == ptr[t.name]);  // the same mapping throughout
    }
  };
  auto stats_show_adoption = [&](test::Child& reader) {
    // the leader publishes its pool statistics at each lease renewal
    std::string st;
    eventually([&] {
      st = reader.ask("stats");
      return field(st, "adopted_bytes") == std::to_string(total);
    });
    INFO(st);
    CHECK(field(st, "adopted_bytes") == std::to_string(total));
    CHECK(field(st, "copied_bytes") == "0");
  };

  takeover(*a, *s1);
  holder_intact();
  auto d = worker(srv, {"--no-control"});  // started after the kill
  CHECK_FALSE(ready(*d));
  pids.push_back(d->pid());
  read_back(*d);
  stats_show_adoption(*d);
  if (h) {
    // what the holder writes through its old pointer, a new reader sees
    REQUIRE(h->ask("fill t_tiny 9") == "OK");
    CHECK(d->ask("sum t_tiny") == "OK sum=27 valid=1");
    REQUIRE(h->ask("pattern t_tiny 12") == "OK");
    CHECK(field(d->ask("digest t_tiny"), "fnv") == tensors[1].digest);
  }
  // the dead owner's memfds its records use live on in the adopter; the
  // empty slab no record uses is freed a round after all its records
  // settled (its field leaves the allocations Hash, the standbys close
  // their fds)
  CHECK(eventually([&] { return memfds_of({a_pid}).size() == 2; }));
  CHECK(memfds_of({a_pid}).size() == 2);
  CHECK(memfds_of({s1->pid()}).empty());
  CHECK(shm_objects_of(pids) == 0);

  // adoption is repeatable: the adopter dies too, its standby adopts again
  auto s2 = worker(srv);
  CHECK_FALSE(ready(*s2));
  pids.push_back(s2->pid());
  for (const auto& t : tensors) REQUIRE(d->ask("release " + t.name) == "OK");
  takeover(*s1, *s2);
  holder_intact();
  auto e = worker(srv, {"--no-control"});
  CHECK_FALSE(ready(*e));
  pids.push_back(e->pid());
  read_back(*e);
  stats_show_adoption(*e);

  // everything removed: the last reference frees each object, once
  for (const auto& t : tensors) {
    REQUIRE(e->ask("release " + t.name) == "OK");
    if (h) REQUIRE(h->ask("release " + t.name) == "OK");  // an old generation: forwarded
    REQUIRE(e->ask("remove " + t.name) == "OK");
  }
  CHECK(eventually([&] { return c.command({"ZCARD", "memcuda:names"}).integer() == 0; }));
  // the owner frees each one (a queued free when the last release was not its own)
  CHECK(eventually([&] { return c.command({"KEYS", "memcuda:removed:*"}).size() == 0; }));
  auto left = c.command({"KEYS", "memcuda:removed:*"});
  for (std::size_t i = 0; i < left.size(); ++i) {
    auto f = c.command({"HGETALL", left[i].str()});
    for (std::size_t j = 0; j + 1 < f.size(); j += 2)
      if (f[j].str() != "ipc_handle") UNSCOPED_INFO(left[i].str() << " " << f[j].str() << "=" << f[j + 1].str());
  }
  CHECK(eventually([&] { return memfds_of(pids).empty(); }));
  for (const auto& m : memfds_of(pids)) UNSCOPED_INFO("left: " << m);
  CHECK(shm_objects_of(pids) == 0);
  auto st = e->ask("stats");
  INFO(st);
  CHECK(field(st, "copied_bytes") == "0");
  for (auto* w : {s2.get(), d.get(), e.get(), h.get()})
    if (w) CHECK(w->ask("exit") == "OK");
  CHECK(memfds_of(pids).empty());
  CHECK(shm_objects_of(pids) == 0);
}

// Runs the tool to its end; returns {exit code, stdout}.
std::pair<int, std::string> run_cli(const test::RedisServer& srv, std::vector<std::string> args) {
  args.insert(args.begin(), {cli_path(), "--url", srv.unix_url()});
  test::Child p(args);
  std::string out;
  while (auto l = p.read_line(30s)) out += *l + "\n";
  return {p.wait(), out};
}

}  // namespace

TEST_CASE("takeover: a killed allocator of record's host tensors, held by nobody, are adopted by its standby",
          "[redis][multiprocess][takeover]") {
  takeover_adopts(false);
}

TEST_CASE("takeover: a holder's mappings of adopted host tensors stay valid and intact throughout",
          "[redis][multiprocess][takeover]") {
  takeover_adopts(true);
}

// The issue's scenario with the tool: `memcuda serve`, a standby
// `memcuda serve`, `memcuda create w`, kill -9 of the first serve. The
// standby takes over, and `memcuda cat w` prints w's values (it used to
// answer "was lost"). Removing w and stopping the standby leaves no memory
// of either serve behind.
TEST_CASE("takeover: memcuda serve killed with -9, its standby serves w on, nothing lost",
          "[redis][cli][takeover]") {
  test::RedisServer srv;
  auto c = srv.connect();
  auto serve = [&] {
    return std::make_unique<test::Child>(std::vector<std::string>{
        cli_path(), "--url", srv.unix_url(), "serve", "--backend", "host", "--lease-ttl", std::to_string(kTtlMs)});
  };
  auto until = [](test::Child& p, const std::string& part) {
    std::string seen;
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < 15s) {
      auto l = p.read_line(1s);
      if (!l) continue;
      seen += *l + "\n";
      if (starts_with(*l, part)) return seen;
    }
    FAIL("no line with '" << part << "'; got:\n" << seen);
    return seen;
  };
  auto a = serve();
  until(*a, "allocator of record");
  auto b = serve();
  until(*b, "follower");

  auto [code, out] = run_cli(srv, {"create", "w", "--dtype", "f32", "--shape", "3", "--backend", "host"});
  INFO(out);
  REQUIRE(code == 0);
  {
    RegistryOptions o;
    o.redis = srv.options();
    o.control_thread = false;
    o.default_backend = BackendKind::host;
    TensorRegistry reg(o);
    auto t = reg.get<float>("w");
    const std::vector<float> v{1, 2, 3};
    t.copy_from_host(v);
  }  // only the name holds w now
  const pid_t a_id = a->pid(), b_id = b->pid();  // Child::pid() is -1 once it was waited for
  const std::string a_pid = std::to_string(a_id), b_pid = std::to_string(b_id);
  CHECK(hget(c, "memcuda:tensor:w", "owner_pid") == a_pid);
  // w's memory outlives a only in the fd the standby holds
  REQUIRE(eventually([&] { return test::standby_synced(c, b_id, {"w"}); }));

  a->kill(SIGKILL);
  a->wait();
  until(*b, "allocator of record");
  REQUIRE(eventually([&] { return hget(c, "memcuda:tensor:w", "owner_pid") == b_pid; }));
  CHECK(c.command({"EXISTS", "memcuda:lost:w"}).integer() == 0);

  std::tie(code, out) = run_cli(srv, {"cat", "w"});
  INFO(out);
  CHECK(code == 0);
  CHECK(contains(out, "\n1 2 3\n"));
  CHECK_FALSE(contains(out, "lost"));

  std::tie(code, out) = run_cli(srv, {"rm", "w"});
  CHECK(code == 0);
  // (this process read w: its import cache may keep an idle mapping)
  CHECK(eventually([&] { return memfds_of({a_id, b_id}, false).empty(); }));
  b->kill(SIGINT);
  CHECK(b->wait() == 0);
  CHECK(memfds_of({a_id, b_id}, false).empty());
  CHECK(shm_objects_of({a_id, b_id}) == 0);
}

// ---- the pieces adoption stands on ----

TEST_CASE("BlockAllocator::allocate_at claims exactly a free range, splitting around it", "[pool][takeover]") {
  detail::BlockAllocator b;
  b.add_slab(1, 4096);
  auto x = b.allocate_at(1, 1024, 300);  // rounded to 512
  REQUIRE(x);
  CHECK(*x == detail::Block{1, 1024, 512});
  b.validate();
  CHECK(b.free_ranges(1) == std::vector<detail::FreeRange>{{0, 1024}, {1536, 2560}});
  CHECK_FALSE(b.allocate_at(1, 1280, 256));  // inside the live block
  CHECK_FALSE(b.allocate_at(1, 1000, 256));  // not aligned
  CHECK_FALSE(b.allocate_at(1, 3840, 512));  // past the end
  CHECK_FALSE(b.allocate_at(2, 0, 256));     // no such slab
  auto y = b.allocate_at(1, 0, 0);           // an empty tensor takes one unit
  REQUIRE(y);
  CHECK(*y == detail::Block{1, 0, 256});
  auto z = b.allocate_at(1, 1536, 2560);  // the whole tail
  REQUIRE(z);
  b.validate();
  CHECK(b.free_ranges(1) == std::vector<detail::FreeRange>{{256, 768}});
  b.deallocate(*x);
  b.deallocate(*y);
  b.deallocate(*z);
  b.validate();
  CHECK(b.free_ranges(1) == std::vector<detail::FreeRange>{{0, 4096}});
  CHECK(b.counters().in_use == 0);
}

TEST_CASE("records say their allocation kind, and a reader of another kind gets a clear error", "[protocol][takeover]") {
  TensorInfo t;
  t.name = "k";
  t.dtype = DType::f32;
  t.shape = {4};
  t.bytes = 16;
  t.backend = BackendKind::host;
  t.device = -1;
  t.state = TensorState::ready;
  t.ipc_handle = "host:test-kind:1";
  t.alloc_bytes = 256;
  t.alloc_kind = "host_memfd";
  auto f = protocol::encode_record(t);
  CHECK(std::count(f.begin(), f.end(), std::pair<std::string, std::string>{"alloc_kind", "host_memfd"}) == 1);
  CHECK(protocol::decode_record(f) == t);

  // without the field: absent, read back empty
  TensorInfo old = t;
  old.alloc_kind.clear();
  auto fo = protocol::encode_record(old);
  CHECK(std::none_of(fo.begin(), fo.end(), [](const auto& kv) { return kv.first == "alloc_kind"; }));
  CHECK(protocol::decode_record(fo).alloc_kind.empty());

  // a kind this version cannot open decodes (listings show it) ...
  TensorInfo vmm = t;
  vmm.alloc_kind = "cuda_vmm_fd";
  CHECK(protocol::decode_record(protocol::encode_record(vmm)).alloc_kind == "cuda_vmm_fd");
  // ... and opening it is a clear, typed error naming both kinds
  try {
    (void)detail::backend_for(BackendKind::host).open(vmm);
    FAIL("opened a cuda_vmm_fd record with the host backend");
  } catch (const Unavailable& e) {
    CHECK(contains(e.what(), "cuda_vmm_fd"));
    CHECK(contains(e.what(), "host_memfd"));
  }
  CHECK_FALSE(detail::backend_for(BackendKind::host).can_adopt(vmm));
  // a record naming no fd this process holds is never adopted (the copy path saves it)
  CHECK_FALSE(detail::backend_for(BackendKind::host).can_adopt(t));
  CHECK_FALSE(detail::backend_for(BackendKind::host).can_adopt(old));
  TensorInfo memfd = t;
  memfd.alloc_kind = "host_memfd";
  memfd.ipc_handle = "host:1-00000000000000aa:1";
  CHECK_FALSE(detail::backend_for(BackendKind::host).can_adopt(memfd));  // this process holds no fd of it

  // a malformed kind is a bad record
  auto bad = f;
  for (auto& [k, v] : bad)
    if (k == "alloc_kind") v = "Host SHM";
  CHECK_THROWS_AS(protocol::decode_record(bad), ProtocolError);
}

TEST_CASE("pool statistics carry adopted and copied bytes, optional on the wire", "[protocol][takeover]") {
  PoolStats p;
  p.adopted_bytes = 4096;
  p.copied_bytes = 7;
  auto text = protocol::encode_pool_stats({p});
  CHECK(contains(text, "\"adopted_bytes\":4096"));
  auto back = protocol::decode_pool_stats(text);
  REQUIRE(back.size() == 1);
  CHECK(back[0].adopted_bytes == 4096);
  CHECK(back[0].copied_bytes == 7);
  // a leader of an older version publishes neither: read as 0
  auto old = protocol::decode_pool_stats(
      R"([{"backend":"host","device":-1,"device_uuid":"","in_use":0,"reserved":0,"peak_in_use":0,"budget":0,)"
      R"("slabs":0,"allocations":0,"frees":0,"largest_free":0}])");
  REQUIRE(old.size() == 1);
  CHECK(old[0].adopted_bytes == 0);
  CHECK(old[0].copied_bytes == 0);
}

// The host backend adopts a memfd whose owner freed it (as its death
// would) through an fd this process holds (a standby's): the adopter maps
// the same file, serves it from its own fd server under the same key, and a
// reader then fetches it from there. Without a held fd there is nothing to
// adopt; once the adopter frees it and no fd or mapping is left, the
// memory is gone.
TEST_CASE("host backend: adopt maps the same memfd through a held fd and serves it", "[takeover][fd]") {
  auto& hb = detail::backend_for(BackendKind::host);
  const std::string tag = std::to_string(::getpid()) + "-00000000adad7e57";
  const std::string label = "memcuda." + tag + ".1";
  detail::Allocation orig = hb.allocate(4096, -1, 1, tag);
  CHECK(orig.alloc_kind == "host_memfd");
  CHECK(orig.handle == "host:" + tag + ":1");
  REQUIRE(orig.served);
  CHECK(memfds_of({::getpid()}).count(label) == 1);
  CHECK_FALSE(std::filesystem::exists("/dev/shm/" + label));
  std::memset(orig.base, 0x5A, 4096);
  TensorInfo t;
  t.name = "x";
  t.backend = BackendKind::host;
  t.ipc_handle = orig.handle;
  t.alloc_bytes = orig.size;
  t.alloc_kind = "host_memfd";
  t.owner = tag;
  t.owner_pid = ::getpid();
  t.alloc_id = 1;
  t.fd_source = orig.fd_source;
  CHECK_FALSE(hb.can_adopt(t));  // no fd of it held: nothing to adopt from
  CHECK_THROWS_AS(hb.adopt(t, 76, tag), Lost);

  // a standby's hold, fetched from the owner's fd server as the standby thread does
  auto& holds = detail::Process::get().fds();
  const auto src = detail::decode_fd_source(orig.fd_source);
  holds.hold("test-standby", orig.handle, detail::fetch(src.source, src.id).fd);
  CHECK(hb.can_adopt(t));
  hb.deallocate(orig);  // the owner lets go: the held fd keeps the memory
  CHECK(memfds_of({::getpid()}).count(label) == 1);

  detail::Allocation a = hb.adopt(t, 77, tag);
  CHECK(a.alloc_id == 77);
  CHECK(a.handle == orig.handle);  // the key names the memory for good
  CHECK(a.alloc_kind == "host_memfd");
  REQUIRE(a.adopted());
  REQUIRE(a.served);
  CHECK(static_cast<unsigned char*>(a.base)[4095] == 0x5A);
  const auto as = detail::decode_fd_source(a.fd_source);
  CHECK(as.source.identity == src.source.identity);  // the same file
  CHECK(as.id != src.id);                             // served anew
  holds.drop("test-standby", orig.handle);

  // a reader fetches it from the adopter's source
  t.fd_source = a.fd_source;
  {
    auto m = hb.open(t);
    CHECK(static_cast<unsigned char*>(m->base())[0] == 0x5A);
    static_cast<unsigned char*>(m->base())[1] = 0x11;  // one memory
    CHECK(static_cast<unsigned char*>(a.base)[1] == 0x11);
  }
  hb.deallocate(a);
  CHECK(memfds_of({::getpid()}).count(label) == 0);  // the last fd and mapping went: so did the memory
  CHECK_THROWS(hb.open(t));
}
