// A record's memory fields are data that anyone who can write Redis
// controls. The registry opens, adopts and unlinks only what it made
// itself (host backend, against a real redis-server and real processes):
//  * a host record that names a shm object instead of a memfd key is
//    refused (Unavailable), and the object is never opened or unlinked:
//    not by `memcuda rm`, not by the garbage collector, not by a
//    takeover, which does not adopt it either;
//  * a cuda_vmm_fd fd source is fetched only from the fd server of the
//    owner's process under the registry's naming (standby holders here;
//    opens are the same check, run on a GPU host).
#include <fcntl.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/detail/backend/select.hpp"
#include "memcuda/detail/fd/fd_server.hpp"
#include "memcuda/detail/fd/fd_source.hpp"
#include "memcuda/detail/fd/fd_table.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/lease/lease.hpp"
#include "memcuda/detail/registry/takeover/standby.hpp"
#include "memcuda/memcuda.hpp"
#include "memcuda/protocol.hpp"
#include "support/gpu.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/skip.hpp"
#include "support/text.hpp"
#include "support/worker.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

RegistryOptions host_opts(const test::RedisServer& srv, bool control = true) {
  auto o = test::host_options(srv, control);
  o.lease_ttl = 300ms;
  o.request_timeout = 3s;
  o.gc_interval = std::chrono::hours(1);  // rounds run when the test asks (collect_garbage)
  return o;
}

using test::cli_path;
using test::contains;
using test::hget;

// A shm object of another program: created here, with known bytes, removed
// by the destructor (whatever the registry did).
class ForeignObject {
 public:
  ForeignObject(std::string name, std::size_t size, unsigned char fill) : name_(std::move(name)), size_(size) {
    ::shm_unlink(name_.c_str());
    int fd = ::shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, static_cast<off_t>(size)) == 0);
    std::vector<unsigned char> bytes(size, fill);
    REQUIRE(::pwrite(fd, bytes.data(), size, 0) == static_cast<ssize_t>(size));
    fd_ = fd;
    fill_ = fill;
  }
  ~ForeignObject() {
    ::close(fd_);
    ::shm_unlink(name_.c_str());
  }
  const std::string& name() const { return name_; }
  int fd() const { return fd_; }
  // Still in /dev/shm under its name, and still holding exactly its bytes.
  bool intact() const {
    int fd = ::shm_open(name_.c_str(), O_RDONLY, 0);
    if (fd < 0) return false;
    struct stat st {};
    std::vector<unsigned char> got(size_);
    const bool ok = ::fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) == size_ &&
                    ::pread(fd, got.data(), size_, 0) == static_cast<ssize_t>(size_) &&
                    std::all_of(got.begin(), got.end(), [&](unsigned char b) { return b == fill_; });
    ::close(fd);
    return ok;
  }

 private:
  std::string name_;
  std::size_t size_;
  int fd_ = -1;
  unsigned char fill_ = 0;
};

// A pid that no process has any more (a child that exited and was reaped).
pid_t dead_pid() {
  pid_t p = ::fork();
  REQUIRE(p >= 0);
  if (p == 0) ::_exit(0);
  REQUIRE(::waitpid(p, nullptr, 0) == p);
  return p;
}

// A ready, persistent host record of a dead allocator of record, written
// by hand: only its name holds it.
void write_dead_owner_record(redis::Connection& c, const TensorRegistry& reg, const std::string& name,
                             const std::string& ipc_handle, std::uint64_t alloc_bytes, std::uint64_t generation) {
  const pid_t pid = dead_pid();
  TensorInfo t;
  t.name = name;
  t.dtype = DType::f32;
  t.shape = {4};
  t.node = reg.node_id();
  t.bytes = 16;
  t.backend = BackendKind::host;
  t.alloc_kind = "host_shm";
  t.ipc_handle = ipc_handle;
  t.alloc_bytes = alloc_bytes;
  t.alloc_id = 1;
  t.refcount = 1;
  t.state = TensorState::ready;
  t.generation = generation;
  t.epoch = 1;
  t.owner = std::to_string(pid) + "-00000000deadbeef";
  t.owner_pid = pid;
  t.holders["@name"] = 1;
  redis::Command hset{"HSET", "memcuda:tensor:" + name};
  for (auto& [k, v] : protocol::encode_record(t)) {
    hset.push_back(k);
    hset.push_back(v);
  }
  c.command(hset);
  c.command({"ZADD", "memcuda:names", "0", name});
}

int run_cli(const test::RedisServer& srv, std::vector<std::string> args) {
  args.insert(args.begin(), {cli_path(), "--url", srv.unix_url()});
  test::Child p(args);
  while (p.read_line(30s)) {
  }
  return p.wait();
}

}  // namespace

TEST_CASE("get refuses a record pointed at a shm object instead of a memfd", "[security][redis]") {
  test::RedisServer srv;
  auto c = srv.connect();
  TensorRegistry leader(host_opts(srv));
  TensorRegistry reader(host_opts(srv, false));
  const std::string owner = leader.session_id();
  auto t = leader.create<float>("t", {4});
  const std::string key = "memcuda:tensor:t";
  const std::string refcount = hget(c, key, "refcount");
  // a fresh alloc_id: no mapping of this process is found for it, the
  // reader opens what the record names. Host memory is shared by fd only:
  // a record naming a shm object, of the registry's old naming or any
  // other, is another build's, and nothing is opened.
  for (const char* kind : {"host_shm", ""}) {
    for (const std::string& name : {"/memcuda." + owner + ".9001", "/trust-foreign-" + std::to_string(::getpid())}) {
      INFO(name << " as '" << kind << "'");
      ForeignObject obj(name, 4096, 0x5C);
      c.command({"HSET", key, "ipc_handle", name, "alloc_bytes", "4096", "alloc_id", "9001"});
      if (*kind) c.command({"HSET", key, "alloc_kind", kind});
      else c.command({"HDEL", key, "alloc_kind"});
      c.command({"HDEL", key, "fd_source"});
      try {
        (void)reader.get<float>("t");
        FAIL("opened a shm object");
      } catch (const Unavailable& e) {
        // a kind no build writes is unknown; an untyped host record reads
        // as host_memfd and names no fd source
        CHECK(contains(e.what(), *kind ? "a kind this mem-cuda version does not know" : "has no fd_source"));
      }
      CHECK(obj.intact());
    }
  }
  CHECK(hget(c, key, "refcount") == refcount);  // a refused get keeps no reference
}

// Records of a dead allocator of record pointed at another program's
// object: a takeover's round does not adopt it (the tensor is given up:
// nobody can serve it), `memcuda rm` and the garbage collector leave the
// object alone. Before, the round adopted the object into the leader's
// pool and the free unlinked it.
TEST_CASE("rm and garbage collection and takeover never adopt or unlink a foreign shm object",
          "[security][redis][takeover]") {
  test::RedisServer srv;
  auto c = srv.connect();
  ForeignObject foreign("/trust-foreign-" + std::to_string(::getpid()), 4096, 0x6D);
  TensorRegistry leader(host_opts(srv));
  REQUIRE(leader.is_leader());

  // the takeover round: its dead owner's record is not adopted
  write_dead_owner_record(c, leader, "adopt_me", foreign.name(), 4096, 1000);
  auto r = leader.collect_garbage();
  CHECK(r.tensors_migrated == 0);
  CHECK(hget(c, "memcuda:tensor:adopt_me", "owner") != leader.session_id());
  CHECK_THROWS_AS(leader.get<float>("adopt_me"), Lost);
  leader.collect_garbage();
  CHECK(foreign.intact());
  for (const auto& p : leader.stats().pools) CHECK(p.adopted_bytes == 0);

  // a record of the registry's naming whose owner is not the name's: the same
  ForeignObject named("/memcuda." + leader.session_id() + ".1", 4096, 0x6E);
  write_dead_owner_record(c, leader, "adopt_named", named.name(), 4096, 1001);
  r = leader.collect_garbage();
  CHECK(r.tensors_migrated == 0);
  leader.collect_garbage();
  CHECK(named.intact());

  // rm: the free of a dead owner's record reclaims only the registry's own
  write_dead_owner_record(c, leader, "rm_me", foreign.name(), 4096, 1002);
  CHECK(run_cli(srv, {"rm", "rm_me"}) == 0);
  CHECK(c.command({"EXISTS", "memcuda:tensor:rm_me"}).integer() == 0);
  leader.collect_garbage();
  leader.collect_garbage();
  CHECK(foreign.intact());
}

// A standby fetches an allocation's fd only from the fd server of the
// owner's process under the registry's naming: an entry pointed at another
// server (here one that would serve) is refused before any connection.
TEST_CASE("standby: an fd source that is not the owner's registry fd server is not fetched",
          "[security][fd][vmm][redis]") {
  test::RedisServer srv;
  RegistryOptions o;
  o.redis = srv.options();
  o.name_space = "tr";
  detail::Context ca(o), cb(o);
  detail::Lease lb(cb);
  detail::Standby sb(cb, lb);
  auto c = srv.connect();
  const std::string hkey = "tr:memcuda:allocations";

  const std::string addr = "@trust-foreign-fd-" + std::to_string(::getpid());
  detail::FdServer server(detail::FdServerOptions{addr});
  detail::UniqueFd mem(::memfd_create("trust", MFD_CLOEXEC));
  REQUIRE(mem);
  server.add(1, mem.get());
  std::jthread serving([&](std::stop_token st) {
    while (!st.stop_requested() && server.serve_once(100ms) != detail::ServeResult::stopped) {
    }
  });
  const std::string pid = std::to_string(::getpid());
  const std::vector<std::pair<std::string, std::string>> entries{
      {"vmm:" + ca.session + ":1", ca.session + " v1;1;" + pid + ";-1;0;0;" + addr},  // another server's name
      {"vmm:" + ca.session + ":2", ca.session + " v1;1;1;-1;0;0;@memcuda-fd-1-00000000000000ab"},  // another pid
  };
  for (const auto& [k, v] : entries) c.command({"HSET", hkey, k, v});
  c.command({"SET", "tr:memcuda:allocations_version", "by-hand"});
  auto p = sb.sync_once(c, true);
  CHECK(p.fetched == 0);
  CHECK(p.failed == 2);
  for (const auto& [k, v] : entries) CHECK_FALSE(detail::Process::get().fds().held(k));
  CHECK(server.served() == 0);  // nothing was asked of it
  server.stop();
  c.command({"DEL", hkey, "tr:memcuda:allocations_version"});
}

#if MEMCUDA_HAS_CUDA()

// The open path of cuda_vmm_fd: a record whose fd source names another
// server, or a process other than its owner, is refused before anything
// is connected to (a fresh alloc_id: nothing of this process maps it).
TEST_CASE("cuda vmm: get refuses an fd source that is not the owner's registry fd server", "[gpu][security]") {
  MEMCUDA_REQUIRE_GPU();
  if (!detail::vmm_fd_supported(0)) MEMCUDA_SKIP("device 0 does not support cuMem allocations exported as POSIX fds");
  test::RedisServer srv;
  auto c = srv.connect();
  RegistryOptions o;
  o.redis = srv.options();
  o.lease_ttl = 400ms;
  o.default_backend = BackendKind::cuda;
  o.cuda_allocation = CudaAllocation::vmm;
  TensorRegistry leader(o);
  o.control_thread = false;
  TensorRegistry reader(o);
  auto t = leader.create<float>("v", {1024});
  const std::string key = "memcuda:tensor:v";
  const std::string pid = hget(c, key, "owner_pid");
  REQUIRE(hget(c, key, "alloc_kind") == "cuda_vmm_fd");
  const std::string addr = "@trust-foreign-fd-" + std::to_string(::getpid());
  detail::FdServer server(detail::FdServerOptions{addr});
  for (const std::string& src : {"v1;1;" + pid + ";-1;0;0;" + addr,
                                 std::string("v1;1;1;-1;0;0;@memcuda-fd-1-00000000000000ab")}) {
    INFO(src);
    c.command({"HSET", key, "fd_source", src, "alloc_id", "9001"});
    try {
      (void)reader.get<float>("v");
      FAIL("fetched an fd from a source that is not the owner's");
    } catch (const ProtocolError& e) {
      CHECK(e.errc() == ProtocolErrc::bad_record);
    }
  }
  CHECK(server.served() == 0);
  CHECK(server.refused() == 0);
}

#endif  // MEMCUDA_HAS_CUDA()
