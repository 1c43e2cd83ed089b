// The process object (detail/process/process.hpp): ProcessOptions::from_env
// reads every process-wide MEMCUDA_* variable, configure() reaches the parts
// it sets, and the parts are the same objects for every caller.
#include <catch2/catch.hpp>

#include <sys/mman.h>

#include <cstdlib>
#include <set>
#include <string>

#include "memcuda/detail/backend/process_cache.hpp"
#include "memcuda/detail/fd/fd_table.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/error.hpp"

using namespace memcuda;
using namespace memcuda::detail;
using namespace std::chrono_literals;

namespace {
// Sets one variable for a scope and unsets it after (none is set in tests).
struct Env {
  const char* name;
  Env(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~Env() { ::unsetenv(name); }
};
}  // namespace

TEST_CASE("ProcessOptions::from_env reads the process-wide variables and names a bad one", "[process][options]") {
  const ProcessOptions d = ProcessOptions::from_env();
  CHECK(d.fd_prefetch == 64);
  CHECK(d.fd_park_window == 1500ms);
  CHECK(d.import_cache == 16);
  CHECK(d.log == LogLevel::warn);
  CHECK(d.faults.empty());
  {
    Env a("MEMCUDA_FD_PREFETCH", "8"), b("MEMCUDA_FD_PARK_MS", "300"), c("MEMCUDA_IMPORT_CACHE", "3"),
        l("MEMCUDA_LOG", "debug"), f("MEMCUDA_FAULTS", "nowhere=2");
    const ProcessOptions e = ProcessOptions::from_env();
    CHECK(e.fd_prefetch == 8);
    CHECK(e.fd_park_window == 300ms);
    CHECK(e.import_cache == 3);
    CHECK(e.log == LogLevel::debug);
    CHECK(e.faults == "nowhere=2");
  }
  {
    Env l("MEMCUDA_LOG", "loud");
    CHECK(ProcessOptions::from_env().log == LogLevel::warn);  // an unknown level: the default
  }
  Env bad("MEMCUDA_FD_PREFETCH", "254");
  CHECK_THROWS_AS(ProcessOptions::from_env(), InvalidArgument);
  CHECK_THROWS_WITH(ProcessOptions::from_env(), Catch::Contains("MEMCUDA_FD_PREFETCH is '254'"));
}

TEST_CASE("Process::configure sets fd parking and the import cache of the one process object, the last call winning",
          "[process]") {
  Process& p = Process::get();
  CHECK(&p == &Process::get());
  CHECK(&p.fds() == &Process::get().fds());
  ProcessOptions o;
  o.fd_prefetch = 5;
  o.fd_park_window = 200ms;
  o.import_cache = 0;
  p.configure(o);
  CHECK(p.fds().offer() == 5);
  CHECK(p.fds().window() == 200ms);
  CHECK(p.cache().idle_imports() == 0);
  o.fd_prefetch = 300;  // clamped to what one answer can carry
  p.configure(o);
  CHECK(p.fds().offer() == 253);
  p.configure(ProcessOptions{});  // the defaults again, for the cases after this one
  CHECK(p.fds().offer() == FdTable::kDefaultOffer);
  CHECK(p.fds().window() == FdTable::kDefaultWindow);
}

TEST_CASE("the fd table holds a key until its last holder lets go, and parks fds beside it", "[process][fd]") {
  FdTable& t = Process::get().fds();
  auto memfd = [] { return UniqueFd(::memfd_create("process-test", MFD_CLOEXEC)); };
  t.hold("s1", "host:owner-x:1", memfd());
  t.hold("s2", "host:owner-x:1", memfd());  // same memory: the first fd stays
  t.park("addr-x", 7, "host:owner-x:2", memfd());
  CHECK(t.holds("s1", "host:owner-x:1"));
  CHECK(t.keys("s2") == std::set<std::string>{"host:owner-x:1"});
  t.drop("s1", "host:owner-x:1");
  CHECK(t.held("host:owner-x:1"));
  CHECK(t.dup("host:owner-x:1"));
  t.drop("s2", "host:owner-x:1");
  CHECK_FALSE(t.held("host:owner-x:1"));
  CHECK_FALSE(t.dup("host:owner-x:1"));
  t.drop_owner("owner-x");  // parked fds go with their owner; held ones are not parked
  CHECK_FALSE(t.take("addr-x", 7));
}
