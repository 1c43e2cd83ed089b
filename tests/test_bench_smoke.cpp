// memcuda_bench runs end to end: a --quick run on the host backend, against
// the harness's own redis-server, exits 0 and writes JSON with the keys that
// benchmarks/run_all.sh and docs/benchmarks.md are made from. No timing is
// checked anywhere: this is a smoke test of the benchmark, not a benchmark.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <boost/json.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>

#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/skip.hpp"

using namespace memcuda;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
namespace json = boost::json;

namespace {

// Next to this test binary (a flattened bundle on a GPU host), else in the
// build tree's benchmarks/ beside tests/.
std::optional<std::string> find_memcuda_bench() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return std::nullopt;
  buf[n] = 0;
  const fs::path dir = fs::path(buf).parent_path();
  for (const auto& cand : {dir / "memcuda_bench", dir / ".." / "benchmarks" / "memcuda_bench"})
    if (::access(cand.c_str(), X_OK) == 0) return fs::weakly_canonical(cand).string();
  return std::nullopt;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/memcuda-bench-smoke-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

TEST_CASE("memcuda_bench --quick runs on the host backend and writes its JSON", "[bench][redis]") {
  auto exe = find_memcuda_bench();
  if (!exe)
    MEMCUDA_SKIP("memcuda_bench not found next to the tests or in ../benchmarks (built with MEMCUDA_BUILD_BENCHMARKS=OFF?)");
  test::RedisServer srv;
  TempDir tmp;
  const fs::path json_path = tmp.path / "bench.json";
  const fs::path log_path = tmp.path / "bench.log";

  // Progress (stderr) goes to a file, shown only when something fails.
  test::Child bench({"/bin/sh", "-c", "log=$1; shift; exec \"$@\" 2>\"$log\"", "sh", log_path.string(), *exe,
                     "--quick", "--backend", "host", "--clients", "1,4", "--url", srv.unix_url(), "--json",
                     json_path.string(), "--no-torch"});
  std::string table;
  while (auto line = bench.read_line(240s)) table += *line + "\n";
  const int rc = bench.wait();
  INFO("memcuda_bench stdout:\n" << table << "\nstderr:\n" << slurp(log_path));
  REQUIRE(rc == 0);
  CHECK(table.find("### Latency and throughput") != std::string::npos);
  CHECK(table.find("### Targets") != std::string::npos);

  REQUIRE(fs::exists(json_path));
  json::value doc;
  REQUIRE_NOTHROW(doc = json::parse(slurp(json_path)));
  REQUIRE(doc.is_object());
  const auto& o = doc.as_object();
  for (const char* key : {"tool", "environment", "config", "results", "baselines", "pool", "targets", "failures"}) {
    INFO("key " << key);
    CHECK(o.contains(key));
  }
  CHECK(o.at("tool").as_string() == "memcuda_bench");
  CHECK(o.at("failures").to_number<int>() == 0);
  CHECK(o.at("config").as_object().at("quick").as_bool());

  std::set<std::string> ops;
  for (const auto& r : o.at("results").as_array()) {
    const auto& row = r.as_object();
    for (const char* key : {"backend", "group", "op", "label", "size", "procs", "n", "p50_us", "p99_us", "p999_us",
                            "mean_us", "ops_per_s"}) {
      INFO("result key " << key);
      CHECK(row.contains(key));
    }
    CHECK(row.at("n").to_number<std::uint64_t>() > 0);
    ops.insert(std::string(row.at("op").as_string()));
  }
  for (const char* op : {"get_warm", "release", "get_reopen", "get_cold", "create_leader", "create_follower", "remove",
                         "release_last", "get_release_tput", "get_release_linger_tput", "redis_ping", "naive_create",
                         "naive_open_close"}) {
    INFO("operation " << op);
    CHECK(ops.count(op) == 1);
  }

  const auto& targets = o.at("targets").as_array();
  CHECK(targets.size() >= 8);
  for (const auto& t : targets) {
    std::string status(t.as_object().at("status").as_string());
    CHECK((status == "met" || status == "missed" || status == "n/a"));
  }
  CHECK(o.at("baselines").as_object().contains("torch"));
  CHECK(o.at("pool").as_object().contains("host"));
}
