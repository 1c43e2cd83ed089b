// Takeover without loss on the host backend: when
// the allocator of record dies, its successor adopts the dead owner's POSIX
// shm objects in place (no byte copied) and republishes every record, so
// tensors held by nobody, persistent ones, survive. Real processes
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

using test::shm_objects_of;

// The inode of a shm object (0 when it does not exist).
ino_t inode_of(const std::string& shm_name) {
  struct stat st {};
  return ::stat(("/dev/shm" + shm_name).c_str(), &st) == 0 ? st.st_ino : 0;
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
// standby takes the lease and adopts a's shm objects: every record names it
// as owner (new generation) and still points at the same object and
// offset. A process started after the kill reads every tensor back
// byte-identical; the leader's pool statistics show every byte adopted and
// none copied. The standby's successor adopts them again when the standby
// is killed in turn. With `holder`, a process maps every tensor before the
// first kill and reads them through the same pointers, intact, after each
// takeover; what it writes afterwards is what a new reader sees (one
// memory, not a copy). At the end every tensor is removed and no shm object
// of any of these processes is left in /dev/shm.
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

  auto tensors = sample_tensors();
  std::uint64_t total = 0;
  std::map<std::string, std::string> handle, offset, gen, ptr;
  std::map<std::string, ino_t> inode;  // of each tensor's shm object: adoption keeps the object
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
    inode[t.name] = inode_of(handle[t.name]);
    offset[t.name] = hget(c, k, "offset");
    gen[t.name] = hget(c, k, "generation");
    CHECK(hget(c, k, "alloc_kind") == "host_shm");
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
  CHECK(shm_objects_of({a_pid}) == 2);
  // a also keeps an empty slab (retain_empty_slabs): three 15 MiB tensors
  // need a second slab, and all three go again
  const std::vector<std::string> fills{"t_fill1", "t_fill2", "t_fill3"};
  for (const auto& n : fills) REQUIRE(starts_with(a->ask("create " + n + " 3932160 1", 20s), "OK"));
  for (const auto& n : fills) REQUIRE(a->ask("release " + n) == "OK");
  CHECK(eventually([&] { return c.command({"EXISTS", "memcuda:tensor:t_fill3"}).integer() == 0; }));
  CHECK(shm_objects_of({a_pid}) == 3);

  // kill -9 the allocator of record; the standby takes over and adopts
  auto takeover = [&](test::Child& dead, test::Child& next) {
    const std::string dead_pid = std::to_string(dead.pid()), next_pid = std::to_string(next.pid());
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
      // the same object, adopted (not copied), now under a name of the adopter's
      const std::string now = hget(c, k, "ipc_handle");
      CHECK(starts_with(now, "/memcuda." + next_pid + "-"));
      CHECK(inode_of(now) == inode[t.name]);
      CHECK(hget(c, k, "offset") == offset[t.name]);
      CHECK(hget(c, k, "generation") != gen[t.name]);      // republished under a new generation
      CHECK(hget(c, k, "alloc_kind") == "host_shm");
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
  // the dead owner's objects its records used are adopted under the
  // adopter's names; every name of the dead owner (those, and the empty
  // slab no record uses) is unlinked a round after all its records settled
  CHECK(eventually([&] { return shm_objects_of({a_pid}) == 0; }));
  CHECK(shm_objects_of({s1->pid()}) == 2);

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
  CHECK(eventually([&] { return shm_objects_of(pids) == 0; }));
  INFO(shm_objects_of(pids) << " shm object(s) left");
  auto st = e->ask("stats");
  INFO(st);
  CHECK(field(st, "copied_bytes") == "0");
  for (auto* w : {s2.get(), d.get(), e.get(), h.get()})
    if (w) CHECK(w->ask("exit") == "OK");
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
// answer "was lost"). Removing w and stopping the standby leaves no shm
// object of either serve behind.
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
  CHECK(eventually([&] { return shm_objects_of({a_id, b_id}) == 0; }));
  b->kill(SIGINT);
  CHECK(b->wait() == 0);
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
  t.ipc_handle = "/memcuda.test-kind.1";
  t.alloc_bytes = 256;
  t.alloc_kind = "host_shm";
  auto f = protocol::encode_record(t);
  CHECK(std::count(f.begin(), f.end(), std::pair<std::string, std::string>{"alloc_kind", "host_shm"}) == 1);
  CHECK(protocol::decode_record(f) == t);

  // written before the field existed: absent, read as the legacy kind
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
    CHECK(contains(e.what(), "host_shm"));
  }
  CHECK_FALSE(detail::backend_for(BackendKind::host).can_adopt(vmm));
  CHECK(detail::backend_for(BackendKind::host).can_adopt(t));
  CHECK(detail::backend_for(BackendKind::host).can_adopt(old));

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

// The host backend adopts an object another process created: the adopter
// maps the same object and links it under its own name (records then name
// it as any allocation of the adopter); freeing the adoption unlinks only
// that name, the dead owner's name is left to the sweep (reclaim_owner,
// which unlinks that owner's objects except those kept).
TEST_CASE("host backend: adopt maps the same object under the adopter's name", "[takeover]") {
  auto& hb = detail::backend_for(BackendKind::host);
  const std::string tag = std::to_string(::getpid()) + "-00000000adad7e57";
  const std::string me = std::to_string(::getpid()) + "-00000000adad7e58";
  detail::Allocation orig = hb.allocate(4096, -1, 1, tag);
  detail::Allocation spare = hb.allocate(4096, -1, 2, tag);
  std::memset(orig.base, 0x5A, 4096);
  TensorInfo t;
  t.name = "x";
  t.backend = BackendKind::host;
  t.ipc_handle = orig.handle;
  t.alloc_bytes = orig.size;
  t.alloc_kind = "host_shm";
  t.owner = tag;
  t.alloc_id = 1;
  auto exists = [](const std::string& name) { return std::filesystem::exists("/dev/shm" + name); };
  auto inode = [](const std::string& name) {
    struct stat st {};
    REQUIRE(::stat(("/dev/shm" + name).c_str(), &st) == 0);
    return st.st_ino;
  };

  detail::Allocation a = hb.adopt(t, 77, me);
  CHECK(a.alloc_id == 77);
  CHECK(a.handle == "/memcuda." + me + ".77");
  CHECK(inode(a.handle) == inode(orig.handle));  // the same object
  CHECK(a.alloc_kind == "host_shm");
  REQUIRE(a.adopted());
  CHECK(static_cast<unsigned char*>(a.base)[4095] == 0x5A);
  hb.deallocate(a);  // its own name goes, the dead owner's stays
  CHECK_FALSE(exists(a.handle));
  CHECK(exists(orig.handle));

  detail::Allocation b = hb.adopt(t, 78, me);
  b.adopted_committed->store(true);
  CHECK(hb.reclaim_owner(tag, {orig.handle}) == 1);  // the spare one, no record uses it
  CHECK_FALSE(exists(spare.handle));
  CHECK(exists(orig.handle));
  CHECK(hb.reclaim_owner(tag, {}) == 1);  // the dead owner's name: the memory lives on under b's
  CHECK_FALSE(exists(orig.handle));
  CHECK(static_cast<unsigned char*>(b.base)[0] == 0x5A);
  hb.deallocate(b);
  CHECK_FALSE(exists(b.handle));
  ::munmap(orig.base, orig.size);
  ::munmap(spare.base, spare.size);

  TensorInfo gone = t;
  CHECK_THROWS_AS(hb.adopt(gone, 79, me), Lost);
}
