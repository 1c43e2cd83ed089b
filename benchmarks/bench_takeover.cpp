// memcuda_bench_takeover: the takeover rows, per
// allocation kind (cuda: vmm and legacy ipc; host: memfd adoption). Method and
// extras: docs/benchmarks.md, "Takeover after kill -9".
//   takeover_<kind>_first_open_us  another process's first get of each tensor
//                                  (a new mapping), p50 over the tensors
//   takeover_<kind>_warm_get_us    its gets while it holds them (one Redis
//                                  round trip, mapping reused)
//   takeover_<kind>_recovery_ms    SIGKILL of leader A (holding --total-gb)
//                                  at t0, standby B ready; a process C started
//                                  after the kill polls get_all until every
//                                  name opens (t1): t1 - t0, with bytes
//                                  copied / adopted, lost names, peak extra
//                                  device memory and the default timings
//
//   memcuda_bench_takeover [--backend auto|host|cuda] [--kinds vmm,ipc]
//       [--total-gb G] [--tensors N] [--reps 3] [--budget 120] [--device N]
//       [--url URL] [--strict] [--pods]
//
// --pods: every phase again with each process (leader, opener, standby,
// recovering process) in a pod of its own (bench_pods.hpp): rows
// takeover_<kind>_pods_*; legacy ipc is skipped there (one pid namespace).
//
// stdout: `row <name> <median> <min> n=<runs> [key=value ...]`, `skip <name>
// <reason>`. --budget S caps the whole run (phases that no longer fit are
// skipped; at S + 5 s the program exits 1). Exit 77 when nothing can run;
// 1 when something failed (a lost tensor, a child that died; with --strict
// also a skipped row).
#include <atomic>
#include <stop_token>
#include <thread>

#include "bench_common.hpp"
#include "bench_pods.hpp"
#include "memcuda/detail/store/keys.hpp"
#include "memcuda/memcuda.hpp"

#if MEMCUDA_HAS_CUDA()
#include <cuda_runtime_api.h>
#endif

namespace {

using namespace memcuda;
namespace mb = memcuda::bench;
namespace json = boost::json;
using std::chrono::milliseconds;

constexpr int kSkip = 77;
mb::Clock::time_point g_deadline;

std::int64_t left_ms() {
  return std::max<std::int64_t>(
      0, std::chrono::duration_cast<milliseconds>(g_deadline - mb::Clock::now()).count());
}
milliseconds upto(std::int64_t ms) { return milliseconds(std::min(ms, left_ms())); }
std::string tensor_name(std::size_t i) { return "t/" + std::to_string(i); }
std::vector<std::string> all_names(std::size_t n) {
  std::vector<std::string> v;
  for (std::size_t i = 0; i < n; ++i) v.push_back(tensor_name(i));
  return v;
}
double ms(std::int64_t ns) { return static_cast<double>(ns) / 1e6; }

void init_device(BackendKind b, int device) {
#if MEMCUDA_HAS_CUDA()
  if (b != BackendKind::cuda) return;
  MEMCUDA_CUDA_TRY(cudaSetDevice(device));
  MEMCUDA_CUDA_TRY(cudaFree(nullptr));  // the context, before any clock
#else
  (void)b, (void)device;
#endif
}

// Device memory in use (total - free), 0 without CUDA.
std::uint64_t device_used(std::uint64_t* free_out = nullptr) {
#if MEMCUDA_HAS_CUDA()
  std::size_t f = 0, t = 0;
  if (cudaMemGetInfo(&f, &t) != cudaSuccess) return 0;
  if (free_out) *free_out = f;
  return t - f;
#else
  if (free_out) *free_out = 0;
  return 0;
#endif
}

// ---- children ------------------------------------------------------------------------

struct ChildArgs {
  std::string role, ns, kind;
  BackendKind backend = BackendKind::host;
  int device = 0, reps = 3;
  std::size_t count = 0;
  std::uint64_t bytes = 0;
  bool hold = false;

  explicit ChildArgs(const mb::Args& a)
      : role(a.get_or("--child", "")), ns(a.get_or("--ns", "")), kind(a.get_or("--kind", "host")) {
    backend = kind == "host" ? BackendKind::host : BackendKind::cuda;
    device = std::stoi(a.get_or("--device", "0"));
    reps = std::stoi(a.get_or("--reps", "3"));
    count = std::stoull(a.get_or("--count", "0"));
    bytes = std::stoull(a.get_or("--bytes", "0"));
    hold = a.has("--hold");
  }
  RegistryOptions options(bool control) const {
    RegistryOptions o = RegistryOptions::from_env();  // the library's default timings throughout
    o.redis = redis::options_from_env();  // the parent passes MEMCUDA_REDIS_URL
    o.name_space = ns;
    o.control_thread = control;
    o.share_references = false;  // a warm get is a Redis round trip, not a cache hit
    o.default_backend = backend;
    o.default_device = device;
    o.pool.pack_batches_min_bytes = 0;  // one allocation per big tensor: one mapping each
    if (kind == "vmm") o.cuda_allocation = CudaAllocation::vmm;
    if (kind == "ipc") o.cuda_allocation = CudaAllocation::ipc;
    return o;
  }
};

void say(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

// A: the allocator of record; creates the persistent tensors, then waits to be killed.
int child_leader(const ChildArgs& c) {
  init_device(c.backend, c.device);
  TensorRegistry reg(c.options(true));
  for (int i = 0; i < 1000 && !reg.is_leader(); ++i) std::this_thread::sleep_for(milliseconds(10));
  if (!reg.is_leader()) throw std::runtime_error("the leader child did not get the lease");
  std::vector<TensorSpec> specs;
  CreateOptions o;
  o.persistent = true;  // held by their names: they outlive every handle
  for (std::size_t i = 0; i < c.count; ++i)
    specs.push_back({tensor_name(i), DType::u8, {static_cast<std::int64_t>(c.bytes)}, o});
  { auto made = reg.create_many(specs); }
  reg.flush();
  say("READY " + reg.leader().session);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}

// B: a standby (control thread on); with --hold it maps every tensor first.
// Answers "stats <bytes>" with its pools' adopted / copied bytes once they
// add up to <bytes> (the leader publishes them at its renewals), or after 3 s.
int child_standby(const ChildArgs& c) {
  init_device(c.backend, c.device);
  TensorRegistry reg(c.options(true));
  std::map<std::string, SharedTensor<void>> held;
  if (c.hold) held = reg.get_all(all_names(c.count));
  say("READY");
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.rfind("stats", 0) != 0) continue;
    const std::uint64_t want = std::stoull(line.substr(6));
    std::uint64_t adopted = 0, copied = 0;
    for (int i = 0; i < 300; ++i) {
      adopted = copied = 0;
      for (const auto& p : reg.stats().pools) adopted += p.adopted_bytes, copied += p.copied_bytes;
      if (adopted + copied >= want) break;
      std::this_thread::sleep_for(milliseconds(10));
    }
    say("STATS " + std::to_string(adopted) + " " + std::to_string(copied));
  }
  return 0;
}

// O: first gets (new mappings), then warm gets of held tensors.
int child_opener(const ChildArgs& c) {
  init_device(c.backend, c.device);
  TensorRegistry reg(c.options(false));
  const auto names = all_names(c.count);
  reg.info(names.front());  // untimed: connection up, scripts loaded, nothing mapped
  const auto before = reg.stats().process;
  json::array first, warm;
  std::vector<SharedTensor<void>> held;
  for (const auto& n : names) {
    const auto t0 = mb::now_ns();
    held.push_back(reg.get<void>(n));
    first.push_back((mb::now_ns() - t0) / 1000.0);
  }
  const auto opens = reg.stats().process.import_opens - before.import_opens;
  for (int r = 0; r < c.reps; ++r)
    for (const auto& n : names) {
      const auto t0 = mb::now_ns();
      auto t = reg.get<void>(n);
      warm.push_back((mb::now_ns() - t0) / 1000.0);
    }
  held.clear();
  reg.flush();  // every reference back before the kill: O holds nothing then
  say(json::serialize(json::object{{"first", first}, {"warm", warm}, {"opens", opens}}));
  std::string line;  // alive (its context too) until the parent closes stdin
  while (std::getline(std::cin, line)) {
  }
  return 0;
}

// C: started after the kill; polls get_all until every name opens, then
// until every record names a live owner (not --dead). Times are
// CLOCK_MONOTONIC ns (steady_clock), comparable with the parent's.
int child_recover(const ChildArgs& c, const std::string& dead, std::int64_t give_up_ns) {
  init_device(c.backend, c.device);
  TensorRegistry reg(c.options(false));
  const auto ready = mb::now_ns();
  const auto names = all_names(c.count);
  std::int64_t t1 = 0, t2 = 0;
  std::size_t tries = 0;
  std::string last_error;
  while (mb::now_ns() < give_up_ns) {
    ++tries;
    try {
      auto got = reg.get_all(names);
      t1 = mb::now_ns();
      break;
    } catch (const std::exception& e) {
      last_error = e.what();
      std::this_thread::sleep_for(milliseconds(2));
    }
  }
  redis::Connection r(redis::options_from_env());
  detail::Keys k(c.ns);
  while (t1 && mb::now_ns() < give_up_ns) {
    bool moved = true;
    for (const auto& n : names) {
      auto v = r.command({"HGET", k.tensor(n), "owner"});
      if (v.is_nil() || v.str() == dead) moved = false;
      if (!moved) break;
    }
    if (moved) {
      t2 = mb::now_ns();
      break;
    }
    std::this_thread::sleep_for(milliseconds(2));
  }
  reg.flush();
  if (!t1) std::cerr << "recover child: gave up after " << tries << " tries; last error: " << last_error << "\n";
  say("DONE " + std::to_string(ready) + " " + std::to_string(t1) + " " + std::to_string(t2) + " " +
      std::to_string(tries));
  return 0;
}

int run_child(const mb::Args& a) {
  ChildArgs c(a);
  if (c.role == "leader") return child_leader(c);
  if (c.role == "standby") return child_standby(c);
  if (c.role == "opener") return child_opener(c);
  if (c.role == "recover") return child_recover(c, a.get_or("--dead", ""), std::stoll(a.get_or("--until", "0")));
  std::cerr << "unknown child role '" << c.role << "'\n";
  return 2;
}

// Device memory in use, sampled every 1 ms from construction to stop():
// the peak over the takeover window.
class Sampler {
 public:
  explicit Sampler(bool on) {
    if (on) thread_ = std::jthread([this](std::stop_token st) {
        while (!st.stop_requested()) {
          peak_ = std::max(peak_.load(), device_used());
          std::this_thread::sleep_for(milliseconds(1));
        }
      });
  }
  std::uint64_t stop() {
    if (thread_.joinable()) thread_.request_stop(), thread_.join();
    return peak_;
  }

 private:
  std::atomic<std::uint64_t> peak_{0};
  std::jthread thread_;
};

// ---- the parent --------------------------------------------------------------------

struct Config {
  BackendKind backend = BackendKind::host;
  std::vector<std::string> kinds;
  std::optional<double> total_gb;
  std::size_t tensors = 0;
  int device = 0, reps = 3;
  bool strict = false;
  bool pods = false;  // --pods: the same phases again, every process in a pod of its own
};

class TakeoverBench {
 public:
  TakeoverBench(Config cfg, mb::RedisTarget& redis) : cfg_(std::move(cfg)), redis_(redis) {}

  int run() {
    signal(SIGPIPE, SIG_IGN);
    init_device(cfg_.backend, cfg_.device);
    const RegistryOptions d;
    timings_ = "lease_ttl_ms=" + std::to_string(d.lease_ttl.count()) +
               " session_ttl_ms=" + std::to_string(d.session_ttl.count()) +
               " gc_interval_ms=" + std::to_string(d.gc_interval.count());
    std::cerr << "memcuda_bench_takeover: default timings " << timings_ << " (the lease TTL is the floor of "
              << "recovery); " << left_ms() / 1000 << " s budget; Redis " << redis_.redacted() << "\n";
    for (const auto& k : cfg_.kinds) {
      try {
        phase(k);
      } catch (const std::exception& e) {
        fail("takeover_" + k, e.what());
      }
    }
    if (cfg_.pods) {
      const auto why = mb::pods_unavailable(redis_.url());
      pods_ = true;
      for (const auto& k : cfg_.kinds) {
        const std::string p = "takeover_" + k + "_pods";
        const std::string no = why ? *why
                               : k == "ipc" ? std::string("legacy CUDA IPC needs one pid namespace (cuda_vmm_fd crosses pods)")
                                            : std::string();
        if (!no.empty()) {
          for (const char* r : {"_first_open_us", "_warm_get_us", "_recovery_ms"}) skip(p + r, no);
          continue;
        }
        try {
          phase(k);
        } catch (const std::exception& e) {
          fail(p, e.what());
        }
      }
    }
    if (failed_) return 1;
    return cfg_.strict && skipped_ ? 1 : 0;
  }

 private:
  void row(const std::string& name, std::vector<double> v, const std::string& extra) {
    if (v.empty()) return skip(name, "no samples");
    std::sort(v.begin(), v.end());
    const double med = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
    std::printf("row %s %.3f %.3f n=%zu %s\n", name.c_str(), med, v.front(), v.size(), extra.c_str());
    std::fflush(stdout);
  }
  void skip(const std::string& name, const std::string& why) {
    skipped_ = true;
    std::printf("skip %s %s\n", name.c_str(), why.c_str());
    std::fflush(stdout);
  }
  void fail(const std::string& what, const std::string& why) {
    failed_ = true;
    std::cerr << "memcuda_bench_takeover: " << what << " failed: " << why << "\n";
    skip(what, "failed: " + why);
  }

  std::unique_ptr<mb::ChildProcess> spawn(const std::string& role, const std::string& kind,
                                          std::vector<std::string> extra = {}) {
    std::vector<std::string> argv{mb::self_exe().string(), "--child", role, "--ns", ns_, "--kind", kind,
                                  "--device", std::to_string(cfg_.device), "--count", std::to_string(count_),
                                  "--bytes", std::to_string(bytes_), "--reps", std::to_string(cfg_.reps)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    if (pods_) argv = mb::in_pod("bt-" + role, argv);
    return std::make_unique<mb::ChildProcess>(argv, std::vector<std::string>{std::string(redis::kUrlEnv) + "=" +
                                                                             redis_.url()});
  }
  static std::string expect(mb::ChildProcess& c, const std::string& prefix, std::int64_t timeout_ms) {
    auto l = c.read_line(upto(timeout_ms));
    if (!l || l->rfind(prefix, 0) != 0)
      throw std::runtime_error("child " + std::to_string(c.pid()) + " did not say " + prefix +
                               (l ? " (said: " + *l + ")" : " in time"));
    return l->substr(prefix.size());
  }

  // Sizes: --total-gb, else 100 GB (vmm), 20 GB (ipc: migration copies, so
  // twice the registry must fit), 0.2 GB (host); cuda clamped to free memory.
  std::string size_phase(const std::string& kind) {
    double gb = cfg_.total_gb.value_or(kind == "vmm" ? 100 : kind == "ipc" ? 20 : 0.2);
    std::string note = "total_gb=" + mb::fmt(gb, 3);
    if (kind != "host") {
      std::uint64_t free_b = 0;
      device_used(&free_b);
      const double room = (static_cast<double>(free_b) - 4e9) / (kind == "ipc" ? 2.0 : 1.0) / 1e9;
      if (gb > room) {
        note += " clamped_to_free_memory_gb=" + mb::fmt(std::max(room, 0.0), 3);
        gb = std::max(room, 0.0);
      }
    }
    count_ = cfg_.tensors ? cfg_.tensors : (kind == "host" ? 16 : 100);
    bytes_ = static_cast<std::uint64_t>(gb * 1e9 / static_cast<double>(count_)) / 256 * 256;
    if (bytes_ == 0) throw std::runtime_error("no room for the tensors (" + note + ")");
    return note + " tensors=" + std::to_string(count_) + " tensor_bytes=" + std::to_string(bytes_);
  }

  bool standbys_synced(redis::Connection& c, const detail::Keys& k, const std::string& except) {
    const auto v = c.command({"GET", k.own_prefix() + "allocations_version"});
    if (v.is_nil()) return false;
    auto keys = c.command({"KEYS", k.own_prefix() + "standby:*"});
    int n = 0;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const std::string key(keys[i].str());
      if (key == k.own_prefix() + "standby:" + except) continue;
      ++n;
      auto s = c.command({"GET", key});
      if (s.is_nil() || s.str() != v.str()) return false;
    }
    return n > 0;
  }

  void phase(const std::string& kind) {
    const std::string p = "takeover_" + kind + (pods_ ? "_pods" : "");
    if (left_ms() < 10000) {
      for (const char* r : {"_first_open_us", "_warm_get_us", "_recovery_ms"}) skip(p + r, "--budget exhausted");
      return;
    }
    ns_ = "bt" + std::to_string(::getpid()) + "-" + kind + (pods_ ? "-pods" : "");
    const std::string sizes = size_phase(kind);
    const std::string base = "kind=" + kind + " " + sizes;
    std::cerr << "memcuda_bench_takeover: " << kind << ": " << sizes << "\n";
    redis::Connection rc(redis_.options());
    detail::Keys k(ns_);

    auto a = spawn("leader", kind);
    const std::string a_session = expect(*a, "READY ", 120000);
    {  // first open / warm get, by a process that then releases everything and exits
      auto o = spawn("opener", kind);
      auto out = json::parse(expect(*o, "{", 60000).insert(0, "{")).as_object();
      std::vector<double> first, warm;
      for (auto& v : out["first"].as_array()) first.push_back(v.to_number<double>());
      for (auto& v : out["warm"].as_array()) warm.push_back(v.to_number<double>());
      const std::string opens = " import_opens=" + std::to_string(out["opens"].to_number<std::uint64_t>());
      row(p + "_first_open_us", first, base + opens);
      row(p + "_warm_get_us", warm, base + " refs=redis_round_trip");
      // What one more process's CUDA context costs (O holds nothing now):
      // C makes one during the takeover window, the sampler sees it.
      const std::uint64_t with_o = device_used();
      o->close_stdin();
      o->wait();
      std::this_thread::sleep_for(milliseconds(100));
      const std::uint64_t without_o = device_used();
      ctx_bytes_ = with_o > without_o ? with_o - without_o : 0;
    }
    auto b = spawn("standby", kind, kind == "ipc" ? std::vector<std::string>{"--hold"} : std::vector<std::string>{});
    expect(*b, "READY", 60000);
    if (kind != "ipc") {  // B holds every allocation's fd (cuMem and host memfds)
      while (!standbys_synced(rc, k, a_session)) {
        if (left_ms() < 5000) throw std::runtime_error("the standby did not sync its fds in time");
        std::this_thread::sleep_for(milliseconds(5));
      }
    }

    const std::uint64_t used_before = device_used();
    Sampler sampler(kind != "host");
    const auto t0 = mb::now_ns();
    a->kill(SIGKILL);
    const auto give_up = t0 + std::min<std::int64_t>(left_ms() - 2000, 60000) * 1'000'000;
    auto c = spawn("recover", kind, {"--dead", a_session, "--until", std::to_string(give_up)});
    a->wait();
    c->close_stdin();
    std::istringstream in(expect(*c, "DONE ", 70000));
    const std::uint64_t peak = sampler.stop();
    std::int64_t ready = 0, t1 = 0, t2 = 0, tries = 0;
    in >> ready >> t1 >> t2 >> tries;

    std::uint64_t lost = 0;
    for (std::size_t i = 0; i < count_; ++i)
      lost += rc.command({"EXISTS", k.lost(tensor_name(i))}).integer() > 0;
    b->write("stats " + std::to_string(count_ * bytes_) + "\n");
    std::istringstream st(expect(*b, "STATS ", 10000));
    std::uint64_t adopted = 0, copied = 0;
    st >> adopted >> copied;
    const std::uint64_t extra_dev = peak > used_before ? peak - used_before : 0;
    std::string extra = base + " bytes_copied=" + std::to_string(copied) + " adopted_bytes=" +
                        std::to_string(adopted) + " lost=" + std::to_string(lost) + " peak_extra_device_bytes=" +
                        (kind == "host" ? std::string("n/a")
                                         : std::to_string(extra_dev) + " c_context_bytes=" + std::to_string(ctx_bytes_)) +
                        " " + timings_ +
                        " c_ready_ms=" + mb::fmt(ms(ready - t0), 1) + " rehomed_ms=" +
                        (t2 ? mb::fmt(ms(t2 - t0), 1) : std::string("never")) + " get_all_tries=" +
                        std::to_string(tries);
    if (kind == "ipc") extra += " note=legacy_ipc_migration_copies_so_needs_free_device_memory_for_the_copy";
    if (!t1) {
      fail(p + "_recovery_ms", "not every tensor opened again within the time left (" + extra + ")");
    } else {
      row(p + "_recovery_ms", {ms(t1 - t0)}, extra);
      if (lost) failed_ = true;
    }
    b->close_stdin();
    b->wait();
    c->wait();
    mb::delete_namespace(rc, ns_);
  }

  Config cfg_;
  mb::RedisTarget& redis_;
  std::string ns_, timings_;
  std::size_t count_ = 0;
  std::uint64_t bytes_ = 0, ctx_bytes_ = 0;
  bool failed_ = false, skipped_ = false;
  bool pods_ = false;  // this phase runs every process in a pod of its own
};

int skip_all(const std::vector<std::string>& kinds, const std::string& why) {
  for (const auto& k : kinds)
    for (const char* r : {"_first_open_us", "_warm_get_us", "_recovery_ms"})
      std::printf("skip takeover_%s%s %s\n", k.c_str(), r, why.c_str());
  return kSkip;
}

}  // namespace

int main(int argc, char** argv) {
  mb::Args args(argc, argv);
  try {
    if (args.get("--child")) return run_child(args);
    if (args.has("--help") || args.has("-h")) {
      std::cout << "usage: memcuda_bench_takeover [--backend auto|host|cuda] [--kinds vmm,ipc] [--total-gb G]\n"
                   "       [--tensors N] [--reps 3] [--budget 120] [--device N] [--url URL] [--strict] [--pods]\n";
      return 0;
    }
    const auto budget = std::chrono::seconds(std::stoi(args.get_or("--budget", "120")));
    g_deadline = mb::Clock::now() + budget;
    std::thread([budget] {  // the cap: whatever still runs at budget + 5 s
      std::this_thread::sleep_for(budget + std::chrono::seconds(5));
      std::fprintf(stderr, "memcuda_bench_takeover: --budget exceeded, exiting\n");
      std::_Exit(1);  // children die with us (PR_SET_PDEATHSIG)
    }).detach();
    Config cfg;
    cfg.device = std::stoi(args.get_or("--device", "0"));
    cfg.reps = std::max(1, std::stoi(args.get_or("--reps", "3")));
    cfg.tensors = std::stoull(args.get_or("--tensors", "0"));
    cfg.strict = args.has("--strict");
    cfg.pods = args.has("--pods");
    if (auto g = args.get("--total-gb")) cfg.total_gb = std::stod(*g);
    const std::string backend = args.get_or("--backend", "auto");
    bool cuda = MEMCUDA_HAS_CUDA() && backend != "host";
    std::string why = "built without the CUDA backend";
#if MEMCUDA_HAS_CUDA()
    int n = 0;
    if (cuda && (cudaGetDeviceCount(&n) != cudaSuccess || n <= cfg.device)) {
      cuda = false;
      why = "no CUDA device " + std::to_string(cfg.device);
    }
#endif
    if (backend == "cuda" && !cuda) return skip_all({"vmm", "ipc"}, why);
    if (backend != "auto" && backend != "host" && backend != "cuda")
      throw std::invalid_argument("--backend must be auto, host or cuda");
    cfg.backend = cuda ? BackendKind::cuda : BackendKind::host;
    if (cuda) {
      std::istringstream ks(args.get_or("--kinds", "vmm,ipc"));
      for (std::string k; std::getline(ks, k, ',');) {
        if (k != "vmm" && k != "ipc") throw std::invalid_argument("--kinds takes vmm and ipc");
        cfg.kinds.push_back(k);
      }
    } else {
      cfg.kinds = {"host"};  // memfds: no /dev/shm room needed
    }
    if (!args.get("--url") && !std::getenv(redis::kUrlEnv) && !args.get("--redis-server") &&
        mb::find_on_path("redis-server").empty())
      return skip_all(cfg.kinds, "no Redis: redis-server is not on PATH and neither --url nor MEMCUDA_REDIS_URL is set");
    mb::RedisTarget redis(args);
    TakeoverBench bench(cfg, redis);
    return bench.run();
  } catch (const std::exception& e) {
    std::cerr << "memcuda_bench_takeover" << (args.get("--child") ? " (child " + *args.get("--child") + ")" : "")
              << ": " << e.what() << "\n";
    return 1;
  }
}
