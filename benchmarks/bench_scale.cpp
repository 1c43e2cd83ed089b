// memcuda_bench_scale: how the registry's costs grow with the number of
// tensors (docs/benchmarks.md, "Scale"; benchmarks/run_scale.sh runs it
// beside an older tree's build).
//
// Setup: a private redis-server (unix socket), `memcuda serve` (the
// allocator of record) and a standby `memcuda serve`, host backend, a
// namespace of its own. This process is a client registry (control thread
// off, no reference sharing). For each size N (ascending; the registry grows
// from one to the next by create_many of 1000 persistent float32[4] tensors
// named t/0000000...), measured at N:
//   create  200 single creates through the allocator of record (ms)
//   get     2000 gets of random names (each release in Redis before the
//           next get; µs), beside a Redis PING from this process
//   py_get  the same loop in a Python client process (the memcuda package;
//           bench_scale_python.hpp): p50/p99, and p50 / the C++ get's p50
//   ls      `memcuda ls` of everything: wall time and the CLI's peak RSS
//   list    list("*") in a worker process: wall time of the call
//   memory  Redis used_memory after the fill minus before it, / N
//   GC K    (N >= K, K in --gc-counts) a worker takes a reference to each of
//           the first K names and is kill -9'd: time from the kill until
//           every one of those K records' refcount is back (polled every 20 ms)
//   rm C    (N >= C, --rm-count) C more tensors under rm/, then
//           remove_prefix("rm/") in a worker: time until the records are gone
//           and the pools' bytes in use are back to before the fill
// Once, at the smallest N: get+release pairs/s from P processes (--procs)
// over --window seconds, C++ and Python clients, beside Redis PINGs/s from
// as many processes. --no-python (or no python, package or libmemcuda_c.so:
// the reason is printed) leaves the Python cells "skipped".
// Each step stops at --step-timeout (or what is left of --budget) and says
// "timeout"; one that does not fit the budget says "skipped".
//
//   memcuda_bench_scale [--sizes 1000,10000,100000] [--procs 1,16,64]
//       [--json FILE] [--budget 1800] [--step-timeout 120] [--window 2]
//       [--gc-counts 10000,100000] [--rm-count 100000] [--cli PATH]
//       [--label TEXT] [--url URL | --redis-server PATH]
//       [--python PY | --no-python]
#include <sys/utsname.h>

#include "bench_scale_config.hpp"
#include "bench_scale_python.hpp"
#include "bench_scale_report.hpp"

namespace {

using namespace memcuda;
namespace mb = memcuda::bench;
namespace sc = memcuda::bench::scale;
namespace json = boost::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr std::size_t kBatch = 1000;  // create_many per call
constexpr int kCreates = 200, kGets = 2000;

class ScaleBench {
 public:
  ScaleBench(sc::Config cfg, mb::RedisTarget& redis)
      : cfg_(std::move(cfg)), redis_(redis), deadline_(mb::Clock::now() + seconds(cfg_.budget_s)) {}

  int run() {
    ns_ = "bs" + std::to_string(::getpid());
    std::cerr << "memcuda_bench_scale: namespace " << ns_ << ", CLI " << cfg_.cli << ", budget " << cfg_.budget_s
              << " s\n";
    serve_a_ = serve("allocator of record");
    serve_b_ = serve("follower");
    auto ro = redis_.options();
    ro.command_timeout = sc::kCommandTimeout;
    conn_.emplace(ro);
    reg_.emplace(sc::client_options(redis_.options(), ns_));
    used_empty_ = sc::used_memory(*conn_);
    py_ = sc::python_client(cfg_.python, cfg_.no_python, redis_.url(), ns_);
    std::cerr << "memcuda_bench_scale: Python client: "
              << (py_.skip.empty() ? json::serialize(py_.info) : "skipped (" + py_.skip + ")") << "\n";
    auto sizes = cfg_.sizes;
    std::sort(sizes.begin(), sizes.end());
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      rows_.push_back(measure_size(sizes[i]));
      if (i == 0) throughput(sizes[0]);
    }
    cleanup();
    return failed_ ? 1 : 0;
  }

  json::object result() const {
    utsname u{};
    ::uname(&u);
    auto arr = [](const std::vector<std::uint64_t>& v) {
      json::array a;
      for (auto x : v) a.emplace_back(x);
      return a;
    };
    return {{"program", "memcuda_bench_scale"},
            {"label", cfg_.label},
            {"memcuda_version", kVersionString},
            {"date_utc", mb::utc_now_iso()},
            {"host", std::string(u.sysname) + " " + u.release + " " + u.machine},
            {"cpus", std::thread::hardware_concurrency()},
            {"redis", redis_.origin() + ", " + redis_.transport() + ", redis " + redis_.server_version()},
            {"cli", cfg_.cli},
            {"python", python_info()},
            {"config",
             {{"sizes", arr(cfg_.sizes)},
              {"procs", arr(cfg_.procs)},
              {"gc_counts", arr(cfg_.gc_counts)},
              {"rm_count", cfg_.rm_count},
              {"budget_s", cfg_.budget_s},
              {"step_timeout_s", cfg_.step_timeout_s},
              {"window_s", cfg_.window_s},
              {"python", cfg_.python},
              {"no_python", cfg_.no_python},
              {"creates", kCreates},
              {"gets", kGets}}},
            {"create_many_batches_split", split_batches_},
            {"sizes", rows_},
            {"throughput", tput_}};
  }

  std::string tables() const {
    return "### Per registry size\n\n" + sc::size_table(rows_, cfg_.gc_counts, cfg_.rm_count) +
           "\n### Throughput at N = " + std::to_string(*std::min_element(cfg_.sizes.begin(), cfg_.sizes.end())) +
           "\n\n" + sc::throughput_table(tput_) + "\n" + sc::python_line(python_info()) + "\n";
  }

 private:
  json::object python_info() const { return py_.skip.empty() ? py_.info : sc::status("skipped", py_.skip); }

  std::int64_t left_ms() const {
    return std::max<std::int64_t>(
        0, std::chrono::duration_cast<milliseconds>(deadline_ - mb::Clock::now()).count());
  }
  // The end of a step: its own cap, or the budget's end if sooner.
  mb::Clock::time_point step_end(int cap_s) const {
    return std::min(deadline_, mb::Clock::now() + seconds(cap_s));
  }
  mb::Clock::time_point step_end() const { return step_end(cfg_.step_timeout_s); }

  std::unique_ptr<mb::ChildProcess> serve(const std::string& want) {
    auto c = std::make_unique<mb::ChildProcess>(std::vector<std::string>{
        cfg_.cli, "--url", redis_.url(), "--namespace", ns_, "serve", "--backend", "host"});
    const auto end = mb::Clock::now() + seconds(30);
    while (auto l = c->read_line(sc::until(end)))
      if (l->find(want) != std::string::npos) return c;
    throw std::runtime_error("`memcuda serve` did not say '" + want + "' within 30 s");
  }

  std::unique_ptr<mb::ChildProcess> worker(const std::string& role, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv{mb::self_exe().string(), "--child", role, "--ns", ns_};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<mb::ChildProcess>(argv, std::vector<std::string>{std::string(redis::kUrlEnv) + "=" +
                                                                             redis_.url()});
  }
  // Runs one step into row[key]: "skipped" when under `need_ms` of the budget
  // is left, "error" (and a failed run) when it throws.
  void step(json::object& row, const char* key, std::int64_t need_ms, const std::function<json::object()>& f) {
    if (left_ms() < need_ms) {
      row[key] = sc::status("skipped", "budget");
      return;
    }
    std::cerr << "  " << key << "\n";
    try {
      row[key] = f();
    } catch (const std::exception& e) {
      std::cerr << "memcuda_bench_scale: " << key << " failed: " << e.what() << "\n";
      failed_ = true;
      row[key] = sc::status("error", e.what());
    }
  }

  // create_many of [from, to) under `prefix`, 1000 a call; false when `end` came first.
  bool fill(const std::string& prefix, std::uint64_t from, std::uint64_t to, mb::Clock::time_point end) {
    CreateOptions o;
    o.persistent = true;  // held by the name: outlives this process's handles
    std::vector<TensorSpec> specs;
    for (std::uint64_t i = from; i < to; i += kBatch) {
      if (mb::Clock::now() >= end) return false;
      specs.clear();
      for (std::uint64_t j = i; j < std::min(to, i + kBatch); ++j)
        specs.push_back({sc::tensor_name(prefix, j), DType::f32, {4}, o});
      create_batch(specs.begin(), specs.end());
    }
    reg_->flush();
    return true;
  }

  // A create_many over the JSON command limit (64 KiB: 1000 names of 9 bytes
  // fit, of 10 not) is refused before anything is sent: it goes in halves.
  void create_batch(std::vector<TensorSpec>::const_iterator b, std::vector<TensorSpec>::const_iterator e) {
    try {
      reg_->create_many(std::vector<TensorSpec>(b, e));  // the handles go at once: only the name holds them
    } catch (const InvalidArgument&) {
      if (e - b < 2) throw;
      ++split_batches_;
      create_batch(b, b + (e - b) / 2);
      create_batch(b + (e - b) / 2, e);
    }
  }

  json::object measure_size(std::uint64_t n) {
    json::object row{{"n", n}};
    std::cerr << "memcuda_bench_scale: N = " << n << " (" << left_ms() / 1000 << " s of budget left)\n";
    auto skip_all = [&](const char* why) {
      for (const char* k : {"fill", "memory", "create", "get", "get_ws", "py_get", "ls", "list", "rm"})
        row[k] = sc::status("skipped", why);
      json::array gcs;
      for (auto k : cfg_.gc_counts) {
        json::object g = sc::status("skipped", why);
        g["k"] = k;
        if (n >= k) gcs.push_back(std::move(g));
      }
      row["gc"] = std::move(gcs);
      return row;
    };
    if (stop_growing_) return skip_all("a smaller size's fill did not fit the budget");
    {  // the fill: stops the run's growth when it does not fit the budget
      const auto t0 = mb::now_ns();
      const auto from = filled_;
      const bool done = fill("t/", filled_, n, deadline_ - seconds(5));
      const double s = static_cast<double>(mb::now_ns() - t0) / 1e9;
      if (!done) {
        stop_growing_ = true;
        return skip_all("the fill did not fit the budget");
      }
      filled_ = n;
      row["fill"] = {{"status", "ok"}, {"s", s}, {"tensors", n - from}, {"tensors_per_s", (n - from) / s}};
    }
    step(row, "memory", 1000, [&] { return memory(n); });
    step(row, "create", 3000, [&] { return creates(); });
    step(row, "get", 3000, [&] { return gets(n); });
    // the same loop over the first 1000 names at every N: records this
    // client has seen (its cache of 4096 says 'same'), as at N = 1000
    step(row, "get_ws", 3000, [&] { return gets(std::min<std::uint64_t>(n, 1000)); });
    step(row, "py_get", 5000, [&] { return sc::python_gets(py_, n, kGets, step_end(), row["get"]); });
    step(row, "ls", 3000, [&] { return ls(); });
    step(row, "list", 3000, [&] { return list(n); });
    json::array gcs;
    for (auto k : cfg_.gc_counts) {
      if (n < k) continue;
      json::object g;
      step(g, "gc", 5000, [&] { return gc(k); });
      json::object r = g["gc"].as_object();
      r["k"] = k;
      gcs.push_back(std::move(r));
    }
    row["gc"] = std::move(gcs);
    if (n >= cfg_.rm_count) step(row, "rm", 10000, [&] { return rm(); });
    return row;
  }

  json::object memory(std::uint64_t n) {
    const auto after = sc::used_memory(*conn_);
    const double per = (static_cast<double>(after) - static_cast<double>(used_empty_)) / static_cast<double>(n);
    return {{"status", "ok"}, {"used_empty", used_empty_}, {"used_after", after}, {"bytes_per_tensor", per}};
  }

  json::object creates() {
    const auto end = step_end();
    CreateOptions o;
    o.persistent = true;
    std::vector<std::string> names;
    mb::Samples s;
    std::string stop;
    for (int i = -5; i < kCreates; ++i) {  // 5 untimed first
      if (mb::Clock::now() >= end) {
        stop = "timeout";
        break;
      }
      names.push_back(sc::tensor_name("c/", names.size()));
      try {
        const auto t0 = mb::now_ns();
        auto t = reg_->create_any(names.back(), DType::f32, {4}, o);
        if (i >= 0) s.push_back(mb::now_ns() - t0);
      } catch (const TimeoutError&) {
        stop = "timeout";
        break;
      }
      reg_->flush();  // the handle's release, untimed
    }
    if (!names.empty()) reg_->remove_many(names);  // untimed; a name never made is in .errors
    reg_->flush();
    json::object r = sc::status(stop.empty() ? "ok" : stop);
    r["n"] = s.size();
    if (!s.empty()) r["p50_ms"] = sc::p_ms(s, 0.5), r["p99_ms"] = sc::p_ms(s, 0.99);
    return r;
  }

  json::object gets(std::uint64_t n) {
    const auto end = step_end();
    std::mt19937_64 rng(42);
    std::uniform_int_distribution<std::uint64_t> pick(0, n - 1);
    mb::Samples get, pair, ping;
    conn_->command({"CONFIG", "RESETSTAT"});  // Redis's own time per script call, below
    for (int i = -20; i < kGets && mb::Clock::now() < end; ++i) {  // 20 untimed first
      const std::string name = sc::tensor_name("t/", pick(rng));
      const auto t0 = mb::now_ns();
      auto t = reg_->get<void>(name);
      const auto t1 = mb::now_ns();
      t.release();
      reg_->flush();
      const auto t2 = mb::now_ns();
      conn_->command({"PING"});
      const auto t3 = mb::now_ns();
      if (i < 0) continue;
      get.push_back(t1 - t0), pair.push_back(t2 - t0), ping.push_back(t3 - t2);
    }
    json::object r = sc::status(get.size() == kGets ? "ok" : "timeout");
    r["n"] = get.size();
    if (get.empty()) return r;
    const auto g = mb::summarize(get), p = mb::summarize(ping);
    r["p50_us"] = g.p50_us, r["p99_us"] = g.p99_us, r["pair_p50_us"] = mb::summarize(pair).p50_us;
    r["ping_p50_us"] = p.p50_us, r["get_over_ping"] = g.p50_us / p.p50_us;
    const auto [calls, usec] = sc::command_usec(*conn_, "evalsha");  // acquire and release scripts
    if (calls) r["redis_script_us"] = static_cast<double>(usec) / static_cast<double>(calls);
    return r;
  }

  json::object ls() {
    const auto r = sc::run_program({cfg_.cli, "--url", redis_.url(), "--namespace", ns_, "ls"}, sc::until(step_end()));
    if (r.timed_out) return sc::status("timeout");
    if (r.exit_code != 0) return sc::status("error", "memcuda ls exited " + std::to_string(r.exit_code));
    return {{"status", "ok"},
            {"wall_s", static_cast<double>(r.wall_ns) / 1e9},
            {"max_rss_mib", static_cast<double>(r.max_rss_bytes) / (1 << 20)}};
  }

  json::object list(std::uint64_t n) {
    const auto end = step_end();
    auto w = worker("list");
    if (!sc::expect(*w, "READY", end)) return sc::status("timeout");
    w->write("GO\n");
    auto done = sc::expect(*w, "DONE ", end);
    if (!done) return sc::status("timeout");
    std::int64_t ns = 0;
    std::uint64_t records = 0;
    std::istringstream(*done) >> ns >> records;
    json::object r{{"status", "ok"}, {"wall_s", static_cast<double>(ns) / 1e9}, {"records", records}};
    if (records != n) r["note"] = "listed " + std::to_string(records) + " records, not " + std::to_string(n);
    return r;
  }

  std::vector<redis::Command> hgets(const std::string& prefix, std::uint64_t k, const char* field) {
    std::vector<redis::Command> v;
    v.reserve(k);
    for (std::uint64_t i = 0; i < k; ++i) v.push_back({"HGET", sc::tensor_key(ns_, sc::tensor_name(prefix, i)), field});
    return v;
  }

  json::object gc(std::uint64_t k) {
    auto cmds = hgets("t/", k, "refcount");
    std::vector<std::string> before;
    before.reserve(k);
    for (std::size_t from = 0; from < k; from += 10000) {
      std::vector<redis::Command> part(cmds.begin() + from, cmds.begin() + std::min<std::size_t>(k, from + 10000));
      for (auto& r : conn_->pipeline(part)) before.push_back(r.is_nil() ? "" : std::string(r.str()));
    }
    auto w = worker("hold", {"--count", std::to_string(k)});
    auto ready = sc::expect(*w, "READY ", step_end());
    if (!ready) return sc::status("timeout", "the worker did not take its references in time");
    const auto took = conn_->command(cmds.front());
    json::object r{{"refcount_before", before.front()}, {"refcount_held", std::string(took.str())}};
    const auto t0 = mb::now_ns();
    w->kill(SIGKILL);
    w->wait();
    const auto t1 = sc::poll_until(
        *conn_, cmds, [&](const redis::Reply& rep, std::size_t i) { return !rep.is_nil() && rep.str() == before[i]; },
        {}, step_end());
    r["status"] = t1 ? "ok" : "timeout";
    if (t1) r["s"] = static_cast<double>(*t1 - t0) / 1e9;
    return r;
  }

  json::object rm() {
    const std::uint64_t c = cfg_.rm_count;
    const std::uint64_t in_use_before = sc::settled_in_use(*conn_, ns_);
    const auto f0 = mb::now_ns();
    if (!fill("rm/", 0, c, step_end())) {
      reg_->remove_prefix("rm/");
      return sc::status("timeout", "the rm/ fill did not finish in time");
    }
    json::object r{{"fill_s", static_cast<double>(mb::now_ns() - f0) / 1e9}, {"in_use_before", in_use_before}};
    std::vector<redis::Command> cmds;
    for (std::uint64_t i = 0; i < c; ++i) cmds.push_back({"EXISTS", sc::tensor_key(ns_, sc::tensor_name("rm/", i))});
    const auto end = step_end();
    auto w = worker("rm", {"--prefix", "rm/"});
    if (!sc::expect(*w, "READY", end)) return sc::status("timeout", "the worker did not start in time");
    const auto t0 = mb::now_ns();
    w->write("GO\n");
    std::int64_t gone = 0;
    const auto t1 = sc::poll_until(
        *conn_, cmds, [](const redis::Reply& rep, std::size_t) { return rep.integer() == 0; },
        [&] {
          auto v = sc::pool_in_use(*conn_, ns_);
          return v && *v <= in_use_before;
        },
        step_end(), &gone);
    r["status"] = t1 ? "ok" : "timeout";
    if (t1) r["s"] = static_cast<double>(*t1 - t0) / 1e9;
    if (gone) r["records_gone_s"] = static_cast<double>(gone - t0) / 1e9;
    if (auto d = sc::expect(*w, "DONE ", std::min(end, mb::Clock::now() + seconds(10)))) {
      std::int64_t at = 0;
      std::uint64_t removed = 0;
      std::istringstream(*d) >> at >> removed;
      r["remove_call_s"] = static_cast<double>(at - t0) / 1e9, r["removed"] = removed;
    }
    return r;
  }

  // Get+release pairs/s of C++ workers, then PINGs/s, then Python workers.
  void throughput(std::uint64_t n) {
    auto spawn = [&](const char* role) -> sc::Spawn {
      return [=, this](std::uint64_t i) {
        return worker(role, {"--count", std::to_string(n), "--seed", std::to_string(1000 + i)});
      };
    };
    for (auto p : cfg_.procs) {
      json::object r, py;
      const std::int64_t need = 10000 + static_cast<std::int64_t>(p) * 500;
      std::cerr << "memcuda_bench_scale: throughput, " << p << " processes\n";
      step(r, "throughput", need, [&] {
        auto g = sc::rate(spawn("tput"), p, cfg_.window_s, step_end());
        auto q = g ? sc::rate(spawn("ping"), p, cfg_.window_s, step_end()) : std::nullopt;
        json::object o = sc::status(g && q ? "ok" : "timeout");
        if (g) o["get_release_per_s"] = *g;
        if (q) o["ping_per_s"] = *q;
        if (g && q) o["ratio"] = *g / *q;
        return o;
      });
      json::object flat = r["throughput"].as_object();
      if (!py_.skip.empty()) py["python"] = sc::status("skipped", py_.skip);
      else step(py, "python", need, [&] { return sc::python_rate(py_, n, p, cfg_.window_s, step_end(), flat); });
      flat["python"] = py["python"];
      flat["procs"] = p, flat["n"] = n;
      tput_.push_back(std::move(flat));
    }
  }

  // Everything removed (so the allocator frees its shm), then both servers
  // stopped with SIGTERM (a clean lease release) and the namespace deleted.
  void cleanup() {
    try {
      for (const char* p : {"t/", "c/", "rm/"}) {
        try {
          reg_->remove_prefix(p);
        } catch (const std::exception& e) {
          std::cerr << "memcuda_bench_scale: cleanup of " << p << ": " << e.what() << "\n";
        }
      }
      reg_->flush();
      for (int i = 0; i < 50; ++i) {
        auto v = sc::pool_in_use(*conn_, ns_);
        if (v && *v == 0) break;
        std::this_thread::sleep_for(milliseconds(200));
      }
    } catch (const std::exception& e) {
      std::cerr << "memcuda_bench_scale: cleanup: " << e.what() << "\n";
    }
    reg_.reset();
    for (auto* s : {&serve_b_, &serve_a_}) {
      (*s)->kill(SIGTERM);
      (*s)->wait();
    }
    if (!redis_.is_private()) mb::delete_namespace(*conn_, ns_);  // a private server goes as a whole
  }

  sc::Config cfg_;
  mb::RedisTarget& redis_;
  mb::Clock::time_point deadline_;
  std::string ns_;
  std::unique_ptr<mb::ChildProcess> serve_a_, serve_b_;
  std::optional<redis::Connection> conn_;
  std::optional<TensorRegistry> reg_;
  sc::PythonClient py_;
  std::uint64_t used_empty_ = 0, filled_ = 0, split_batches_ = 0;
  json::array rows_, tput_;
  bool stop_growing_ = false, failed_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  mb::Args args(argc, argv);
  try {
    if (args.get("--child")) return sc::run_worker(args);
    if (args.has("--help") || args.has("-h")) {
      std::cout << sc::kUsage;
      return 0;
    }
    ::signal(SIGPIPE, SIG_IGN);
    const sc::Config cfg = sc::parse_config(args);
    std::thread([b = cfg.budget_s] {  // the last resort: children die with us (PR_SET_PDEATHSIG)
      std::this_thread::sleep_for(seconds(b + 120));
      std::fprintf(stderr, "memcuda_bench_scale: --budget exceeded by 120 s, exiting\n");
      std::_Exit(1);
    }).detach();
    mb::RedisTarget redis(args);
    ScaleBench bench(cfg, redis);
    const int rc = bench.run();
    std::cout << bench.tables();
    if (!cfg.json_path.empty()) mb::write_file(cfg.json_path, json::serialize(bench.result()) + "\n");
    return rc;
  } catch (const std::exception& e) {
    std::cerr << "memcuda_bench_scale" << (args.get("--child") ? " (child " + *args.get("--child") + ")" : "")
              << ": " << e.what() << "\n";
    return 1;
  }
}
