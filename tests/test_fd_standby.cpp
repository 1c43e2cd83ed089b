// The host-side pieces of the cuMem backend that need no GPU:
// the records' fd_source and its text form, the vmm handle, the
// cuda_allocation option, the process's FdService, and the standby holders'
// sync through the allocations Hash (detail/registry/takeover/standby.hpp) against a
// real redis-server. The fds are memfds: the standby layer does not care
// what an fd refers to (the GPU suite, tests/test_gpu_vmm.cpp, runs it on
// cuMem fds).
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "memcuda/detail/backend/select.hpp"
#include "memcuda/detail/fd/fd_service.hpp"
#include "memcuda/detail/fd/fd_source.hpp"
#include "memcuda/detail/fd/fd_table.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/lease/lease.hpp"
#include "memcuda/detail/registry/gc/orphan_scan.hpp"
#include "memcuda/detail/registry/takeover/standby.hpp"
#include "memcuda/memcuda.hpp"
#include "memcuda/protocol.hpp"
#include "support/redis_server.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

detail::UniqueFd memfd_with(const std::string& text) {
  detail::UniqueFd fd(::memfd_create("memcuda-test", MFD_CLOEXEC));
  REQUIRE(fd);
  REQUIRE(::write(fd.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  return fd;
}

std::string read_fd(int fd, std::size_t n) {
  std::string s(n, '\0');
  REQUIRE(::pread(fd, s.data(), n, 0) == static_cast<ssize_t>(n));
  return s;
}

TensorInfo vmm_record() {
  TensorInfo t;
  t.name = "w";
  t.dtype = DType::f32;
  t.shape = {4};
  t.bytes = 16;
  t.backend = BackendKind::cuda;
  t.device = 0;
  t.state = TensorState::ready;
  t.generation = 5;
  t.ipc_handle = detail::vmm_handle("123-00000000000000ab", 7);
  t.alloc_bytes = 2 << 20;
  t.alloc_kind = "cuda_vmm_fd";
  t.fd_source = "v1;3;123;17;14;9001;@memcuda-fd-123-00000000000000ab";
  return t;
}

}  // namespace

TEST_CASE("fd source: text form round-trips, malformed ones are clear errors", "[fd][vmm]") {
  detail::ServedSource s;
  s.id = 42;
  s.source.address = "@memcuda-fd-77-0123456789abcdef";
  s.source.pid = 77;
  s.source.remote_fd = 12;
  s.source.identity = {15, 123456};
  const std::string text = detail::encode_fd_source(s);
  CHECK(text == "v1;42;77;12;15;123456;@memcuda-fd-77-0123456789abcdef");
  CHECK(detail::decode_fd_source(text) == s);
  // a path address may contain ';': it is the last part
  s.source.address = "/run/a;b";
  CHECK(detail::decode_fd_source(detail::encode_fd_source(s)).source.address == "/run/a;b");
  for (const char* bad : {"", "v2;1;2;3;4;5;@x", "v1;1;2;3;4;5", "v1;x;2;3;4;5;@x", "v1;1;2;3;4;5;", "v1;1;2;3;-;5;@x",
                          "v1;1;2 ;3;4;5;@x"}) {
    INFO(bad);
    CHECK_THROWS_AS(detail::decode_fd_source(bad), ProtocolError);
  }
  try {
    detail::decode_fd_source("v1;x;2;3;4;5;@x");
  } catch (const ProtocolError& e) {
    CHECK(std::string(e.what()).find("served id") != std::string::npos);
  }
}

TEST_CASE("vmm handle: 64 bytes, NUL-padded, its key is the text before the padding", "[fd][vmm]") {
  auto h = detail::vmm_handle("4242-0123456789abcdef", 99);
  CHECK(h.size() == 64);
  CHECK(detail::vmm_key(h) == "vmm:4242-0123456789abcdef:99");
  CHECK(detail::vmm_key("vmm:x:1") == "vmm:x:1");
  CHECK_THROWS_AS(detail::vmm_handle(std::string(70, 'a'), 1), InternalError);
}

TEST_CASE("record: fd_source is written when set, read back, and absent from other kinds' records", "[fd][vmm]") {
  TensorInfo t = vmm_record();
  auto f = protocol::encode_record(t);
  CHECK(std::count(f.begin(), f.end(), std::pair<std::string, std::string>{"fd_source", t.fd_source}) == 1);
  TensorInfo back = protocol::decode_record(f);
  CHECK(back.fd_source == t.fd_source);
  CHECK(back.alloc_kind == "cuda_vmm_fd");
  CHECK(back.ipc_handle == t.ipc_handle);
  CHECK(back == t);
  // a legacy record: no field at all (round-trips through older codecs)
  TensorInfo old = t;
  old.fd_source.clear();
  old.alloc_kind = "cuda_ipc";
  auto fo = protocol::encode_record(old);
  CHECK(std::none_of(fo.begin(), fo.end(), [](const auto& kv) { return kv.first == "fd_source"; }));
  CHECK(protocol::decode_record(fo).fd_source.empty());
  // binary junk in the field is a bad record naming it
  for (auto& [k, v] : f)
    if (k == "fd_source") v = std::string("v1;\x01\x02", 5);
  try {
    protocol::decode_record(f);
    FAIL("decoded a record with a binary fd_source");
  } catch (const ProtocolError& e) {
    CHECK(std::string(e.what()).find("fd_source") != std::string::npos);
  }
}

TEST_CASE("cuda_allocation: option text, environment default, bad values refused", "[fd][vmm]") {
  CHECK(cuda_allocation_from_string("auto") == CudaAllocation::automatic);
  CHECK(cuda_allocation_from_string("vmm") == CudaAllocation::vmm);
  CHECK(cuda_allocation_from_string("ipc") == CudaAllocation::ipc);
  CHECK_FALSE(cuda_allocation_from_string("VMM"));
  CHECK_FALSE(cuda_allocation_from_string(""));
  CHECK(to_string(CudaAllocation::automatic) == "auto");

  const char* saved = std::getenv("MEMCUDA_CUDA_ALLOCATION");
  std::string keep = saved ? saved : "";
  RegistryOptions o;
  ::setenv("MEMCUDA_CUDA_ALLOCATION", "ipc", 1);
  // Only from_env reads the variable: a registry's options, not the run time.
  CHECK(detail::requested_cuda_allocation(o) == CudaAllocation::automatic);
  CHECK(RegistryOptions::from_env().cuda_allocation == CudaAllocation::ipc);
  o.cuda_allocation = CudaAllocation::vmm;
  CHECK(detail::requested_cuda_allocation(o) == CudaAllocation::vmm);
  o.cuda_allocation.reset();
  ::setenv("MEMCUDA_CUDA_ALLOCATION", "cumem", 1);
  try {
    (void)RegistryOptions::from_env();
    FAIL("accepted MEMCUDA_CUDA_ALLOCATION=cumem");
  } catch (const InvalidArgument& e) {
    CHECK(std::string(e.what()).find("auto, vmm or ipc") != std::string::npos);
    CHECK(std::string(e.what()).find("MEMCUDA_CUDA_ALLOCATION") != std::string::npos);
  }
  ::unsetenv("MEMCUDA_CUDA_ALLOCATION");
  CHECK_FALSE(RegistryOptions::from_env().cuda_allocation);
  // vmm cannot take memory from a user resource
  struct Dummy final : DeviceMemoryResource {
    void* do_allocate(std::size_t, int) override { return nullptr; }
    void do_deallocate(void*, std::size_t, int) noexcept override {}
  };
  o.pool.upstream = std::make_shared<Dummy>();
  o.cuda_allocation = CudaAllocation::vmm;
  CHECK_THROWS_AS(detail::Context(o), InvalidArgument);
  if (saved) ::setenv("MEMCUDA_CUDA_ALLOCATION", keep.c_str(), 1);
}

TEST_CASE("fd service: serves an fd to this process, withdraws it, stops with its last user", "[fd][vmm]") {
  std::string address;
  {
    auto svc = detail::FdService::acquire();
    CHECK(detail::FdService::acquire() == svc);  // one per process
    CHECK(detail::FdService::existing() == svc);
    address = svc->address();
    // A socket of this process in the process's runtime directory (the default here).
    const std::string dir = detail::FdService::access().runtime_dir;
    CHECK(dir == detail::default_runtime_dir());
    CHECK(address.rfind(dir + "/fd-" + std::to_string(::getpid()) + "-", 0) == 0);
    CHECK(detail::is_registry_fd_address(address, ::getpid(), dir));
    detail::ServedFd served(svc, memfd_with("hello"), "vmm:k:1", "tag-a");
    auto src = served.source();
    CHECK(svc->entries("tag-a").size() == 1);
    CHECK(svc->entries("tag-b").empty());
    detail::FetchOptions fo;
    fo.path = detail::FdPath::socket_only;
    auto got = detail::fetch(src.source, src.id, fo);
    CHECK(read_fd(got.fd.get(), 5) == "hello");
    served.retag("tag-b");
    CHECK(svc->entries("tag-b").size() == 1);
    const auto v = svc->version();
    served.withdraw();
    CHECK(svc->version() > v);
    CHECK(svc->size() == 0);
    try {
      detail::fetch(src.source, src.id, fo);
      FAIL("fetched a withdrawn fd");
    } catch (const detail::FdTransferError& e) {
      CHECK(e.reason() == detail::FdErrc::unknown_id);
    }
  }
  CHECK_FALSE(detail::FdService::existing());  // the last user went: thread joined, socket closed
  CHECK(::access(address.c_str(), F_OK) != 0);  // and its file removed
  detail::FetchOptions fo;
  fo.path = detail::FdPath::socket_only;
  CHECK_THROWS_AS(detail::fetch(detail::FdSource{address, 0, -1, {}}, 1, fo), detail::FdTransferError);
}

// Two registries' sessions of one namespace, A (the owner) and B (a
// standby), each with the Standby pass of its registry thread, against a
// real Redis: A publishes what it serves; B fetches and holds the fd (same
// file); A's withdraw deletes the field and B closes its fd; a dead
// owner's fields go when the leader sweeps them, and B lets go of them too.
TEST_CASE("standby: the owner publishes its fds, a standby holds them, both follow withdrawals and sweeps",
          "[fd][vmm][redis]") {
  test::RedisServer srv;
  RegistryOptions o;
  o.redis = srv.options();
  o.name_space = "sb";
  detail::Context ca(o), cb(o);
  detail::Lease la(ca), lb(cb);
  detail::Standby sa(ca, la), sb(cb, lb);
  auto c = srv.connect();
  auto& holds = detail::Process::get().fds();
  const std::string hkey = "sb:memcuda:allocations";

  auto svc = detail::FdService::acquire();
  const std::string key = detail::vmm_key(detail::vmm_handle(ca.session, 1));
  auto served = std::make_shared<detail::ServedFd>(svc, memfd_with("tensor-bytes"), key, ca.session);

  auto pa = sa.sync_once(c, false);
  CHECK(pa.published == 1);
  auto v = c.command({"HGET", hkey, key});
  REQUIRE_FALSE(v.is_nil());
  CHECK(std::string(v.str()) == ca.session + " " + served->source_text());
  CHECK(sa.sync_once(c, false).published == 0);  // nothing changed: nothing written

  auto pb = sb.sync_once(c, true);
  CHECK(pb.fetched == 1);
  CHECK(pb.failed == 0);
  CHECK(holds.holds(cb.session, key));
  {
    auto fd = holds.dup(key);
    REQUIRE(fd);
    CHECK(read_fd(fd.get(), 12) == "tensor-bytes");  // the owner's file itself
  }
  // B reports what it synced (what tests and tools wait on)
  auto synced = c.command({"GET", "sb:memcuda:standby:" + cb.session});
  REQUIRE_FALSE(synced.is_nil());
  CHECK(std::string(synced.str()) == std::string(c.command({"GET", "sb:memcuda:allocations_version"}).str()));
  CHECK(sb.sync_once(c, true).fetched == 0);  // held already

  // the owner stops serving it: its field goes, the standby closes its fd
  served.reset();
  CHECK(sa.sync_once(c, false).withdrawn == 1);
  CHECK(c.command({"HEXISTS", hkey, key}).integer() == 0);
  CHECK(sb.sync_once(c, true).dropped == 1);
  CHECK_FALSE(holds.held(key));

  // a dead owner's fields: swept by the leader (not in `keep`), then let go
  served = std::make_shared<detail::ServedFd>(svc, memfd_with("again"), key, ca.session);
  const std::string kept = detail::vmm_key(detail::vmm_handle(ca.session, 2));
  auto served2 = std::make_shared<detail::ServedFd>(svc, memfd_with("kept"), kept, ca.session);
  CHECK(sa.sync_once(c, false).published == 2);
  CHECK(sb.sync_once(c, true).fetched == 2);
  CHECK(detail::allocation_owners(c, ca.keys) == std::set<std::string>{ca.session});
  CHECK(detail::forget_allocations_of(c, ca.keys, ca.session, {detail::vmm_handle(ca.session, 2)}) == 1);
  CHECK(c.command({"HEXISTS", hkey, key}).integer() == 0);
  CHECK(c.command({"HEXISTS", hkey, kept}).integer() == 1);
  CHECK(sb.sync_once(c, true).dropped == 1);
  CHECK_FALSE(holds.held(key));
  CHECK(holds.held(kept));
  // an adopter retags what it took over: its field names the adopter now
  served2->retag(cb.session);
  CHECK(sb.sync_once(c, true).published == 1);
  CHECK(std::string(c.command({"HGET", hkey, kept}).str()).rfind(cb.session + " ", 0) == 0);
  CHECK(holds.held(kept));  // same allocation, still held

  // an fd source nobody serves any more is retried, not fatal
  served2.reset();
  served.reset();
  CHECK(sa.sync_once(c, false).withdrawn == 0);  // A's field of `key` was swept already
  c.command({"HSET", hkey, "vmm:gone:1", ca.session + " v1;999;1;-1;0;0;@memcuda-fd-nobody"});
  c.command({"SET", "sb:memcuda:allocations_version", "by-hand"});
  auto pf = sb.sync_once(c, true);
  CHECK(pf.withdrawn == 1);  // B no longer serves `kept`
  CHECK(pf.failed == 1);
  CHECK_FALSE(holds.held("vmm:gone:1"));
  c.command({"HDEL", hkey, "vmm:gone:1"});
  sb.sync_once(c, true);
  CHECK(holds.keys(cb.session).empty());
  // nothing allocated: no key of the standby layer is left but the markers
  CHECK(c.command({"EXISTS", hkey}).integer() == 0);
  served = std::make_shared<detail::ServedFd>(svc, memfd_with("last"), key, ca.session);
  CHECK(sa.sync_once(c, false).published == 1);
  served.reset();
  CHECK(sa.withdraw_stale(c) == 1);  // what trim() calls: no tick needed
  CHECK(c.command({"EXISTS", hkey}).integer() == 0);
  CHECK(c.command({"EXISTS", "sb:memcuda:allocations_version"}).integer() == 0);
}
