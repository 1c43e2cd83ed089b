// memcuda_bench: latency (p50/p99/p99.9) and throughput of the registry's
// operations, on the host and cuda backends, against three baselines: a
// Redis PING (the floor of any registry lookup), the raw CUDA IPC (or shm)
// calls a user writes without mem-cuda, and a PyTorch queue handoff.
//
//   memcuda_bench [--backend host|cuda|both] [--sizes 4KiB,1MiB,64MiB,1GiB]
//                 [--iters 2000] [--clients 1,4,16] [--duration 2] [--quick] [--hot]
//                 [--url URL] [--json FILE] [--torch-script PATH] [--no-torch]
//                 [--bandwidth-json FILE] [--device N]
//
// Progress goes to stderr, a Markdown table (aligned) to stdout, every
// sample's summary to --json. Without --url or MEMCUDA_REDIS_URL a private
// redis-server (from PATH) is started on a unix socket and stopped at the end.
//
// This process is the allocator of record (it hosts the control thread in
// a namespace of its own); every measurement of a *client* runs in a child:
// this binary re-executed with --child ROLE, with its own TensorRegistry
// and control_thread=false, reporting its samples as one JSON line.
#include <sys/mman.h>
#include <sys/statvfs.h>

#include <functional>
#include <iomanip>
#include <map>
#include <memory>
#include <set>

#include "bench_common.hpp"
#include "bench_pods.hpp"
#include "memcuda/memcuda.hpp"
#include "memcuda/detail/registry/core.hpp"  // the reference cache's counters (the lingering row)

#if MEMCUDA_HAS_CUDA()
#include <cuda_runtime_api.h>
#endif

namespace {

using namespace memcuda;
namespace mb = memcuda::bench;
namespace json = boost::json;
using mb::Samples;
using std::chrono::milliseconds;

// ---- configuration -----------------------------------------------------------

struct Config {
  std::vector<BackendKind> backends;
  std::optional<std::vector<std::uint64_t>> sizes;  // --sizes, else per backend
  int iters = 2000;
  int warmup = 100;
  std::vector<int> clients{1, 4, 16};
  double duration_s = 2.0;    // per throughput configuration
  double max_seconds = 20.0;  // per timed loop: a guard, not a target
  double budget_s = 0;        // whole run; 0: none. Past it, every loop is cut short
  int cold_target = 1000;     // first-open samples per size
  int cold_max_rounds = 8;    // fresh consumer processes per size
  int device = 0;
  bool quick = false;
  // --hot: only the hot-path rows (create on the leader and from a
  // follower, warm get, release, get+release throughput): a before/after
  // comparison in well under a minute.
  bool hot = false;
  std::string json_path;
  std::optional<std::string> torch_script;
  bool torch = true;
  int torch_iters = 200;
  std::optional<std::string> bandwidth_json;
  bool pods = false;  // --pods: the first-open and warm-get consumers also run in a pod of their own
};

std::vector<std::uint64_t> default_sizes(BackendKind b, bool quick) {
  if (quick) return {4096, 1u << 20};
  if (b == BackendKind::cuda) return {4096, 1u << 20, 64u << 20, 1u << 30};
  // Host: a shm object is a file in /dev/shm; keep the default small.
  return {4096, 1u << 20, 16u << 20};
}

bool cuda_available(std::string* why = nullptr) {
#if MEMCUDA_HAS_CUDA()
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    return false;
  }
  if (n == 0 && why) *why = "no CUDA device";
  return n > 0;
#else
  if (why) *why = "memcuda_bench was built without the CUDA toolkit";
  return false;
#endif
}

// Creates the CUDA context now, so no timed call pays for it.
void init_device(BackendKind b, int device) {
#if MEMCUDA_HAS_CUDA()
  if (b != BackendKind::cuda) return;
  MEMCUDA_CUDA_TRY(cudaSetDevice(device));
  MEMCUDA_CUDA_TRY(cudaFree(nullptr));
#else
  (void)b;
  (void)device;
#endif
}

std::string hex(std::string_view bytes) {
  static constexpr char k[] = "0123456789abcdef";
  std::string o;
  for (unsigned char c : bytes) {
    o += k[c >> 4];
    o += k[c & 15];
  }
  return o;
}
std::string unhex(std::string_view h) {
  auto v = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  std::string o;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2) o += static_cast<char>(v(h[i]) * 16 + v(h[i + 1]));
  return o;
}

// Runs `op(record)` up to `iters` times after `warmup` untimed runs
// (`op` records its own samples when told to), stopping early once the loop
// has used `max_s` seconds. An iteration that fails with BudgetExceeded
// (the device or /dev/shm is full) is counted, not timed, and retried after
// a pause longer than the control thread's tick (ttl/3 by default), which is
// when the allocator of record returns empty slabs; more than
// kMaxBudgetErrors failures end the loop with the error.
struct LoopResult {
  int n = 0;
  int budget_errors = 0;
  std::string first_error;
};
constexpr int kMaxBudgetErrors = 100;

template <class F>
LoopResult timed_loop(int warmup, int iters, double max_s, F&& op) {
  LoopResult r;
  auto attempt = [&](bool rec) {
    for (;;) {
      try {
        op(rec);
        return;
      } catch (const BudgetExceeded& e) {
        if (++r.budget_errors > kMaxBudgetErrors) throw;
        if (r.first_error.empty()) {
          r.first_error = e.what();
          std::cerr << "  BudgetExceeded (waiting for the allocator of record to trim, then retrying): " << e.what()
                    << "\n";
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(700));
      }
    }
  };
  for (int i = 0; i < warmup; ++i) attempt(false);
  auto start = mb::Clock::now();
  for (; r.n < iters; ++r.n) {
    attempt(true);
    if ((r.n & 15) == 15 && std::chrono::duration<double>(mb::Clock::now() - start).count() > max_s) {
      ++r.n;
      std::cerr << "  (stopped after " << r.n << " iterations: --max-seconds " << max_s << ")\n";
      break;
    }
  }
  return r;
}

json::object loop_json(const LoopResult& r) {
  json::object o{{"budget_errors", r.budget_errors}};
  if (!r.first_error.empty()) o["first_error"] = r.first_error;
  return o;
}

// ---- child side --------------------------------------------------------------------

struct ChildCtx {
  mb::Args args;
  std::string role, ns, name, prefix;
  BackendKind backend = BackendKind::host;
  int device = 0, iters = 0, warmup = 0, count = 0;
  std::uint64_t size = 0;
  double max_s = 20, duration_s = 1;

  explicit ChildCtx(const mb::Args& a) : args(a) {
    role = a.get_or("--child", "");
    ns = a.get_or("--ns", "");
    name = a.get_or("--name", "");
    prefix = a.get_or("--prefix", "");
    backend = backend_from_string(a.get_or("--backend", "host")).value_or(BackendKind::host);
    device = std::stoi(a.get_or("--device", "0"));
    iters = std::stoi(a.get_or("--iters", "0"));
    warmup = std::stoi(a.get_or("--warmup", "0"));
    count = std::stoi(a.get_or("--count", "0"));
    size = std::stoull(a.get_or("--size", "0"));
    max_s = std::stod(a.get_or("--max-seconds", "20"));
    duration_s = std::stod(a.get_or("--duration", "1"));
  }

  RegistryOptions registry_options() const {
    RegistryOptions o = RegistryOptions::from_env();
    o.redis = redis::options_from_env();  // the parent passes MEMCUDA_REDIS_URL
    o.name_space = ns;
    o.control_thread = false;  // a client: the parent is the allocator of record
    o.share_references = false;  // every get is a Redis acquire, as these rows measure (get_held measures sharing)
    o.default_backend = backend;
    o.default_device = device;
    return o;
  }
};

void emit(const json::object& o) {
  std::string s = json::serialize(o);
  s += '\n';
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

// get+release of a tensor whose allocation stays mapped (a handle is held
// throughout), then the same loop with no handle kept between uses.
int child_warm(const ChildCtx& c) {
  TensorRegistry reg(c.registry_options());
  Samples get, rel, reget, unmap;
  {
    auto held = reg.get<void>(c.name);  // maps the allocation, keeps it mapped
    timed_loop(c.warmup, c.iters, c.max_s, [&](bool rec) {
      auto t0 = mb::now_ns();
      auto t = reg.get<void>(c.name);
      auto t1 = mb::now_ns();
      t.release();
      reg.flush();  // releases are queued: time until it is in Redis, as before
      auto t2 = mb::now_ns();
      if (rec) {
        get.push_back(t1 - t0);
        rel.push_back(t2 - t1);
      }
    });
  }
  // No handle held: today the process cache unmaps with the last handle, so
  // each get maps again.
  timed_loop(c.warmup / 4, c.iters, c.max_s, [&](bool rec) {
    auto t0 = mb::now_ns();
    auto t = reg.get<void>(c.name);
    auto t1 = mb::now_ns();
    t.release();
    reg.flush();  // releases are queued: time until it is in Redis, as before
    auto t2 = mb::now_ns();
    if (rec) {
      reget.push_back(t1 - t0);
      unmap.push_back(t2 - t1);
    }
  });
  auto st = reg.stats().process;
  emit({{"get_warm", mb::samples_to_json(get)},
        {"release", mb::samples_to_json(rel)},
        {"get_reopen", mb::samples_to_json(reget)},
        {"release_unmap", mb::samples_to_json(unmap)},
        {"import_opens", st.import_opens},
        {"import_hits", st.import_hits}});
  return 0;
}

// The first get of each of `count` tensors in this process.
int child_cold(const ChildCtx& c) {
  TensorRegistry reg(c.registry_options());
  // Untimed: loads the scripts, warms the connection and the IPC path.
  for (int i = 0; i < 3; ++i) reg.get<void>(c.prefix + "/warm").release();
  auto before = reg.stats().process;
  Samples get, rel;
  auto start = mb::Clock::now();
  for (int i = 0; i < c.count; ++i) {
    const std::string name = c.prefix + "/" + std::to_string(i);
    auto t0 = mb::now_ns();
    auto t = reg.get<void>(name);
    auto t1 = mb::now_ns();
    t.release();
    reg.flush();  // releases are queued: time until it is in Redis, as before
    auto t2 = mb::now_ns();
    get.push_back(t1 - t0);
    rel.push_back(t2 - t1);
    if (std::chrono::duration<double>(mb::Clock::now() - start).count() > c.max_s) break;
  }
  auto after = reg.stats().process;
  emit({{"get_cold", mb::samples_to_json(get)},
        {"release_unmap", mb::samples_to_json(rel)},
        {"import_opens", after.import_opens - before.import_opens},
        {"import_hits", after.import_hits - before.import_hits},
        // Requests to the owner's fd server (a pod has no pidfd_getfd):
        // fewer than opens where fds came along (docs/fd-transfer.md).
        {"fd_requests", after.fd_requests - before.fd_requests},
        {"fd_parked_hits", after.fd_parked_hits - before.fd_parked_hits}});
  return 0;
}

// create from a process that is not the allocator of record: the command
// goes through the lifecycle list; then remove and the last release (which
// queues a free for the allocator of record).
int child_create(const ChildCtx& c) {
  TensorRegistry reg(c.registry_options());
  Samples create, remove, release;
  int i = 0;
  auto loop = timed_loop(c.warmup, c.iters, c.max_s, [&](bool rec) {
    std::string name = c.prefix + "/" + std::to_string(i++);
    auto t0 = mb::now_ns();
    auto t = reg.create_any(name, DType::u8, {static_cast<std::int64_t>(c.size)});
    auto t1 = mb::now_ns();
    reg.remove(name);
    auto t2 = mb::now_ns();
    t.release();
    reg.flush();  // releases are queued: time until it is in Redis, as before
    auto t3 = mb::now_ns();
    if (rec) {
      create.push_back(t1 - t0);
      remove.push_back(t2 - t1);
      release.push_back(t3 - t2);
    }
  });
  emit({{"create_follower", mb::samples_to_json(create)},
        {"remove_follower", mb::samples_to_json(remove)},
        {"release_last_follower", mb::samples_to_json(release)},
        {"loop", loop_json(loop)}});
  return 0;
}

// One client of the throughput test: READY, wait for GO, then get+release
// for `duration` seconds. "tput": every get an acquire script and every
// release a release script, in Redis before the pair counts (sharing off,
// flush() per pair): the registry's Redis path. "tput_linger": the default
// path with sharing on and a release_linger window (kLingerMs): the first
// get takes the reference, the release lingers, and the next get within the
// window takes it back with no round trip; the reference goes back to Redis
// in the final flush(), which the elapsed time includes. It reports how
// many gets went to Redis ("acquires"), so the row says what it measured.
// "ping": a Redis PING per op.
constexpr int kLingerMs = 5;

int child_tput(const ChildCtx& c) {
  const bool ping = c.role == "ping";
  const bool linger = c.role == "tput_linger";
  std::optional<TensorRegistry> reg;
  std::optional<redis::Connection> conn;
  SharedTensor<void> held;
  if (ping) {
    conn.emplace(redis::options_from_env());
  } else if (linger) {
    auto o = c.registry_options();
    o.share_references = true;
    o.release_linger = milliseconds(kLingerMs);
    reg.emplace(o);
    // Sharing starts once the invalidation connection is subscribed (the
    // constructor waits for it); the warm-up below takes the first reference.
  } else {
    reg.emplace(c.registry_options());
    held = reg->get<void>(c.name);
  }
  auto op = [&] {
    if (ping) conn->command({"PING"});
    else if (linger) reg->get<void>(c.name).release();
    else {
      reg->get<void>(c.name).release();
      reg->flush();  // a get+release pair is done when the release is in Redis
    }
  };
  for (int i = 0; i < c.warmup; ++i) op();
  std::cout << "READY" << std::endl;
  std::string go;
  if (!std::getline(std::cin, go) || go != "GO") return 3;
  Samples lat;
  lat.reserve(1 << 20);
  const auto t_start = mb::now_ns();
  const auto t_end = t_start + static_cast<std::int64_t>(c.duration_s * 1e9);
  std::int64_t t = t_start;
  std::uint64_t ops = 0;
  // Gets answered by the cache (a held or lingering reference); the others
  // went to Redis (also every get while the cache was not live).
  const auto hits0 = linger ? detail::RegistryAccess::core(*reg).holdings.stats().hits : 0;
  while (t < t_end) {
    op();
    auto t2 = mb::now_ns();
    lat.push_back(t2 - t);
    t = t2;
    ++ops;
  }
  std::uint64_t acquires = ops;
  if (linger) {
    acquires = ops - (detail::RegistryAccess::core(*reg).holdings.stats().hits - hits0);
    reg->flush();  // the lingering reference back in Redis: part of the elapsed time
    t = mb::now_ns();
  }
  emit({{"ops", ops}, {"elapsed_ns", t - t_start}, {"acquires", acquires}, {"samples", mb::samples_to_json(lat)}});
  return 0;
}

// The path without mem-cuda: open (and close) raw handles read from stdin,
// one hex line each, the first a warm-up handle.
int child_naive(const ChildCtx& c) {
  std::vector<std::string> handles;
  std::string line;
  while (std::getline(std::cin, line))
    if (!line.empty()) handles.push_back(unhex(line));
  if (handles.empty()) return 3;
  Samples open_s, close_s, both;
  auto record = [&](std::int64_t t0, std::int64_t t1, std::int64_t t2) {
    open_s.push_back(t1 - t0);
    close_s.push_back(t2 - t1);
    both.push_back(t2 - t0);
  };
  if (c.backend == BackendKind::host) {
    auto once = [&](const std::string& h, bool rec) {
      auto t0 = mb::now_ns();
      int fd = ::shm_open(h.c_str(), O_RDWR, 0);
      if (fd < 0) throw std::runtime_error("shm_open " + h + ": " + std::strerror(errno));
      void* p = ::mmap(nullptr, c.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      ::close(fd);
      if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
      auto t1 = mb::now_ns();
      ::munmap(p, c.size);
      auto t2 = mb::now_ns();
      if (rec) record(t0, t1, t2);
    };
    for (int i = 0; i < 3; ++i) once(handles[0], false);
    for (std::size_t i = 1; i < handles.size(); ++i) once(handles[i], true);
  } else {
#if MEMCUDA_HAS_CUDA()
    init_device(BackendKind::cuda, c.device);
    auto once = [&](const std::string& h, bool rec) {
      cudaIpcMemHandle_t mh{};
      std::memcpy(&mh, h.data(), sizeof mh);
      void* p = nullptr;
      auto t0 = mb::now_ns();
      MEMCUDA_CUDA_TRY(cudaIpcOpenMemHandle(&p, mh, cudaIpcMemLazyEnablePeerAccess));
      auto t1 = mb::now_ns();
      MEMCUDA_CUDA_TRY(cudaIpcCloseMemHandle(p));
      auto t2 = mb::now_ns();
      if (rec) record(t0, t1, t2);
    };
    for (int i = 0; i < 3; ++i) once(handles[0], false);
    for (std::size_t i = 1; i < handles.size(); ++i) once(handles[i], true);
#else
    return 3;
#endif
  }
  emit({{"naive_open", mb::samples_to_json(open_s)},
        {"naive_close", mb::samples_to_json(close_s)},
        {"naive_open_close", mb::samples_to_json(both)}});
  return 0;
}

int run_child(const mb::Args& args) {
  ChildCtx c(args);
  if (c.role != "ping") init_device(c.backend, c.device);  // PING clients need no CUDA context
  if (c.role == "warm") return child_warm(c);
  if (c.role == "cold") return child_cold(c);
  if (c.role == "create") return child_create(c);
  if (c.role == "tput" || c.role == "tput_linger" || c.role == "ping") return child_tput(c);
  if (c.role == "naive") return child_naive(c);
  std::cerr << "unknown child role '" << c.role << "'\n";
  return 2;
}

// ---- parent side -------------------------------------------------------------------

struct Row {
  std::string backend;  // "host", "cuda", or "-" for backend-independent baselines
  std::string group;    // "mem-cuda" or "baseline"
  std::string op;
  std::string label;
  std::uint64_t size = 0;  // 0: not applicable
  int procs = 1;
  mb::Summary s;
  double ops_per_s = 0;  // aggregate for throughput rows, else back-to-back in one process
  std::uint64_t ops = 0, acquires = 0;  // throughput rows: ops, and gets that went to Redis
  json::object extra;
};

class Bench {
 public:
  Bench(Config cfg, mb::RedisTarget& redis) : cfg_(std::move(cfg)), redis_(redis) {}

  int run() {
    signal(SIGPIPE, SIG_IGN);
    baseline_redis();
    for (auto b : cfg_.backends) run_backend(b);
    if (std::find(cfg_.backends.begin(), cfg_.backends.end(), BackendKind::cuda) != cfg_.backends.end())
      baseline_torch();
    else
      torch_ = json::object{{"skipped", "the PyTorch baseline shares CUDA tensors: run with --backend cuda|both"}};
    load_bandwidth();
    auto targets = evaluate_targets();
    print(targets);
    if (!cfg_.json_path.empty()) write_json(targets);
    cleanup_namespaces();
    return failures_ == 0 ? 0 : 1;
  }

 private:
  // ---- helpers ----

  bool over_budget() {
    if (cfg_.budget_s <= 0) return false;
    bool over = std::chrono::duration<double>(mb::Clock::now() - start_).count() > cfg_.budget_s;
    if (over && !budget_noted_) {
      budget_noted_ = true;
      std::cerr << "  --budget " << cfg_.budget_s << " s spent: the remaining loops are cut short\n";
      notes_.push_back("The run's --budget (" + mb::fmt(cfg_.budget_s, 0) +
                       " s) was spent before the end: the rows measured after that ran at most 0.5 s each "
                       "(see n).");
    }
    return over;
  }
  double loop_seconds() { return over_budget() ? std::min(cfg_.max_seconds, 0.5) : cfg_.max_seconds; }

  void note_budget_errors(BackendKind b, const std::string& label, std::uint64_t size, int errors,
                          const std::string& first) {
    if (errors == 0) return;
    notes_.push_back(std::string(to_string(b)) + ", " + label + ", " + mb::format_size(size) + ": " +
                     std::to_string(errors) +
                     " iteration(s) failed with BudgetExceeded and were retried after a pause (not timed): " + first);
  }

  // --pods and pods can be made here (the first call notes why not).
  bool pods_ready() {
    if (!cfg_.pods) return false;
    if (!pods_ok_) {
      auto why = mb::pods_unavailable(redis_.url());
      pods_ok_ = !why;
      if (why) notes_.push_back("The rows from another pod were not taken: " + *why + ".");
    }
    return *pods_ok_;
  }

  std::vector<std::string> child_argv(const std::string& role, BackendKind b, const std::string& ns) {
    return {mb::self_exe().string(), "--child", role, "--ns", ns, "--backend", std::string(to_string(b)),
            "--device", std::to_string(cfg_.device), "--max-seconds", mb::fmt(loop_seconds(), 2)};
  }
  std::vector<std::string> child_env() const { return {std::string(redis::kUrlEnv) + "=" + redis_.url()}; }

  // Runs a child to completion and parses its one JSON line.
  std::optional<json::object> run_child_json(std::vector<std::string> argv, const std::string& stdin_data = {},
                                              milliseconds timeout = milliseconds(600000)) {
    const std::string role = argv.size() > 2 ? argv[2] : "?";
    mb::ChildProcess c(std::move(argv), child_env());
    if (!stdin_data.empty()) {
      try {
        c.write(stdin_data);
      } catch (const std::exception& e) {
        std::cerr << "  " << e.what() << "\n";
      }
    }
    c.close_stdin();
    std::string out = c.read_all(timeout);
    if (!c.eof()) c.kill();
    int rc = c.wait();
    if (rc != 0) {
      std::cerr << "  child '" << role << "' failed (exit " << rc << ")\n";
      ++failures_;
      return std::nullopt;
    }
    try {
      return json::parse(out).as_object();
    } catch (const std::exception& e) {
      std::cerr << "  child '" << role << "' output is not JSON: " << e.what() << "\n";
      ++failures_;
      return std::nullopt;
    }
  }

  Row& add(Row r) {
    if (r.ops_per_s == 0) r.ops_per_s = r.s.ops_per_s;
    std::cerr << "  " << std::left << std::setw(5) << r.backend << " " << std::setw(44) << r.label << " "
              << std::setw(8) << (r.size ? mb::format_size(r.size) : "-") << " n=" << r.s.n
              << " p50=" << mb::fmt_us(r.s.p50_us) << " us p99=" << mb::fmt_us(r.s.p99_us) << " us";
    if (r.procs > 1 || r.op.ends_with("tput")) std::cerr << " " << mb::fmt_rate(r.ops_per_s) << " ops/s";
    std::cerr << "\n";
    rows_.push_back(std::move(r));
    return rows_.back();
  }
  Row& add_series(BackendKind b, const std::string& group, const std::string& op, const std::string& label,
                  std::uint64_t size, const Samples& s) {
    Row r;
    r.backend = std::string(to_string(b));
    r.group = group;
    r.op = op;
    r.label = label;
    r.size = size;
    r.s = mb::summarize(s);
    return add(std::move(r));
  }

  const Row* find(const std::string& backend, const std::string& op, std::uint64_t size, int procs = 1) const {
    for (const auto& r : rows_)
      if (r.backend == backend && r.op == op && r.size == size && r.procs == procs) return &r;
    return nullptr;
  }

  RegistryOptions leader_options(BackendKind b, const std::string& ns) const {
    RegistryOptions o = RegistryOptions::from_env();
    o.redis = redis_.options();
    o.name_space = ns;
    o.control_thread = true;
    o.default_backend = b;
    o.default_device = cfg_.device;
    return o;
  }

  // How many tensors of `size` may exist at once for the first-open tests.
  std::uint64_t memory_budget(BackendKind b) const {
    std::uint64_t budget = 8ull << 30;
    if (b == BackendKind::host) {
      // Host slabs are committed (posix_fallocate): this is RAM.
      struct statvfs v {};
      budget = 1ull << 30;
      if (::statvfs("/dev/shm", &v) == 0) budget = std::min<std::uint64_t>(budget, v.f_bavail * v.f_frsize / 8);
    } else {
#if MEMCUDA_HAS_CUDA()
      std::size_t free_b = 0, total_b = 0;
      if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
        budget = std::min<std::uint64_t>(32ull << 30, free_b / 4);
#endif
    }
    return budget;
  }

  // ---- baselines that need no backend ----

  void baseline_redis() {
    std::cerr << "Redis baseline on " << redis_.redacted() << " (" << redis_.transport() << ")\n";
    redis::Connection c(redis_.options());
    Samples ping, eval;
    timed_loop(cfg_.warmup * 2, cfg_.iters, loop_seconds(), [&](bool rec) {
      auto t0 = mb::now_ns();
      c.command({"PING"});
      auto t1 = mb::now_ns();
      if (rec) ping.push_back(t1 - t0);
    });
    redis::Script one("return 1");
    timed_loop(cfg_.warmup, cfg_.iters, loop_seconds(), [&](bool rec) {
      auto t0 = mb::now_ns();
      one.eval(c, {}, {});
      auto t1 = mb::now_ns();
      if (rec) eval.push_back(t1 - t0);
    });
    Row r;
    r.backend = "-";
    r.group = "baseline";
    r.op = "redis_ping";
    r.label = "Redis PING round trip (" + redis_.transport() + ")";
    r.s = mb::summarize(ping);
    add(std::move(r));
    Row e;
    e.backend = "-";
    e.group = "baseline";
    e.op = "redis_evalsha";
    e.label = "Redis EVALSHA 'return 1'";
    e.s = mb::summarize(eval);
    add(std::move(e));
  }

  // ---- one backend ----

  void run_backend(BackendKind b) {
    const std::string bname(to_string(b));
    const std::string ns = "mcb-" + std::to_string(::getpid()) + "-" + bname;
    namespaces_.push_back(ns);
    auto sizes = cfg_.sizes.value_or(default_sizes(b, cfg_.quick));
    std::cerr << "== backend " << bname << ", sizes";
    for (auto s : sizes) std::cerr << " " << mb::format_size(s);
    std::cerr << "\n";
    init_device(b, cfg_.device);
    TensorRegistry reg(leader_options(b, ns));
    if (!reg.is_leader()) throw std::runtime_error("this process did not become the allocator of record");
    // Untimed: scripts loaded, allocator and connection warm.
    for (int i = 0; i < 20; ++i) {
      auto t = reg.create_any("warmup/" + std::to_string(i), DType::u8, {4096});
      reg.remove(t.name());
    }
    for (auto size : sizes) {
      std::cerr << "-- " << bname << " " << mb::format_size(size) << "\n";
      leader_create(reg, b, size);
      // Large tensors have allocations of their own, returned to the driver
      // by the control thread's tick (every ttl/3), not by the release: let
      // one tick pass before the next test counts free memory.
      std::this_thread::sleep_for(reg.options().lease_ttl / 3 + milliseconds(100));
      warm_get(reg, b, ns, size);
      if (!cfg_.hot) cold_get(b, ns, size);
      follower_create(b, ns, size);
      if (!cfg_.hot) naive(b, size);
    }
    throughput(reg, b, ns, sizes.front());
    held_get(reg, b);  // in-process reference sharing
    if (!cfg_.hot) pool_run(reg, b);
  }

  // get() of a name this process already holds: the reference cache shares
  // the held handle, no Redis round trip (docs/design.md, "In-process
  // reference sharing"). Timed: the get and the drop of the copy it returns
  // (not the last one, so no release is queued).
  void held_get(TensorRegistry& reg, BackendKind b) {
    const std::string name = "held-get";
    auto held = reg.create_any(name, DType::f32, {1024});
    // The cache serves once its invalidation connection is subscribed.
    const auto until = mb::Clock::now() + std::chrono::seconds(5);
    while (reg.get<void>(name).handle() != held.handle() && mb::Clock::now() < until)
      std::this_thread::sleep_for(milliseconds(2));
    Samples get;
    std::uint64_t not_shared = 0;
    timed_loop(cfg_.warmup * 10, cfg_.iters * 10, loop_seconds(), [&](bool rec) {
      auto t0 = mb::now_ns();
      {
        auto t = reg.get<float>(name);
        if (t.handle() != held.handle()) ++not_shared;
      }
      auto t1 = mb::now_ns();
      if (rec) get.push_back(t1 - t0);
    });
    reg.remove(name);
    add_series(b, "mem-cuda", "get_held", "get of a tensor already held (shared, no Redis)", 4096, get).extra =
        json::object{{"not_shared", not_shared}};
  }

  void leader_create(TensorRegistry& reg, BackendKind b, std::uint64_t size) {
    Samples create, remove, release;
    int i = 0;
    auto loop = timed_loop(cfg_.warmup / 4, cfg_.iters, loop_seconds(), [&](bool rec) {
      std::string name = "leader/" + std::to_string(size) + "/" + std::to_string(i++);
      auto t0 = mb::now_ns();
      auto t = reg.create_any(name, DType::u8, {static_cast<std::int64_t>(size)});
      auto t1 = mb::now_ns();
      reg.remove(name);
      auto t2 = mb::now_ns();
      t.release();
      reg.flush();  // releases are queued: time until it is in Redis, as before
      auto t3 = mb::now_ns();
      if (rec) {
        create.push_back(t1 - t0);
        remove.push_back(t2 - t1);
        release.push_back(t3 - t2);
      }
    });
    add_series(b, "mem-cuda", "create_leader", "create (in the allocator of record)", size, create).extra =
        loop_json(loop);
    note_budget_errors(b, "create (in the allocator of record)", size, loop.budget_errors, loop.first_error);
    add_series(b, "mem-cuda", "remove", "remove (name unlinked, handle held)", size, remove);
    add_series(b, "mem-cuda", "release_last", "release, last ref (allocator frees)", size, release);
  }

  void warm_get(TensorRegistry& reg, BackendKind b, const std::string& ns, std::uint64_t size) {
    const std::string name = "warm/" + std::to_string(size);
    auto t = reg.create_any(name, DType::u8, {static_cast<std::int64_t>(size)});
    auto argv = child_argv("warm", b, ns);
    argv.insert(argv.end(), {"--name", name, "--iters", std::to_string(cfg_.iters), "--warmup",
                             std::to_string(cfg_.warmup)});
    auto out = run_child_json(argv);
    std::optional<json::object> pod;
    if (out && pods_ready()) pod = run_child_json(mb::in_pod("bench-warm", argv));
    reg.remove(name);
    if (!out) return;
    add_series(b, "mem-cuda", "get_warm", "get (allocation already mapped)", size,
               mb::samples_from_json(out->at("get_warm")));
    if (pod)
      add_series(b, "mem-cuda", "get_warm_pod", "get (allocation already mapped), from another pod", size,
                 mb::samples_from_json(pod->at("get_warm")));
    add_series(b, "mem-cuda", "release", "release (not the last handle)", size,
               mb::samples_from_json(out->at("release")));
    add_series(b, "mem-cuda", "get_reopen", "get, no handle kept (maps again)", size,
               mb::samples_from_json(out->at("get_reopen")));
    add_series(b, "mem-cuda", "release_unmap", "release of the last local handle (unmaps)", size,
               mb::samples_from_json(out->at("release_unmap")));
  }

  // Every get is the first of its allocation in its process. The pool puts
  // small tensors into shared slabs, so the tensors here come from a second
  // allocator of record (its own namespace) whose pool gives every tensor an
  // allocation of its own: N tensors, read by fresh consumer processes.
  void cold_get(BackendKind b, const std::string& ns, std::uint64_t size) {
    const int n = static_cast<int>(std::clamp<std::uint64_t>(memory_budget(b) / size, 1,
                                                             static_cast<std::uint64_t>(cfg_.cold_target)));
    const int rounds = over_budget() ? 1 : std::clamp((cfg_.cold_target + n - 1) / n, 1, cfg_.cold_max_rounds);
    const std::string cold_ns = ns + "-cold";
    namespaces_.push_back(cold_ns);
    RegistryOptions o = leader_options(b, cold_ns);
    const bool dedicated = one_allocation_per_tensor(o);
    TensorRegistry reg(o);
    if (!reg.is_leader()) throw std::runtime_error("did not become allocator of record of " + cold_ns);
    const std::string prefix = "cold/" + std::to_string(size);
    std::vector<SharedTensor<void>> held;
    held.push_back(reg.create_any(prefix + "/warm", DType::u8, {static_cast<std::int64_t>(size)}));
    for (int i = 0; i < n; ++i)
      held.push_back(reg.create_any(prefix + "/" + std::to_string(i), DType::u8, {static_cast<std::int64_t>(size)}));
    Samples get, get_pod;
    std::uint64_t opens = 0, hits = 0, fd_requests = 0, pod_fd_requests = 0, pod_parked_hits = 0;
    for (int r = 0; r < rounds; ++r) {
      auto argv = child_argv("cold", b, cold_ns);
      argv.insert(argv.end(), {"--prefix", prefix, "--count", std::to_string(n)});
      auto out = run_child_json(argv);
      if (!out) break;
      auto s = mb::samples_from_json(out->at("get_cold"));
      get.insert(get.end(), s.begin(), s.end());
      opens += out->at("import_opens").to_number<std::uint64_t>();
      hits += out->at("import_hits").to_number<std::uint64_t>();
      fd_requests += out->at("fd_requests").to_number<std::uint64_t>();
      // The same consumer in a pod, alternating with the one here.
      if (pods_ready())
        if (auto pod = run_child_json(mb::in_pod("bench-cold", argv))) {
          auto ps = mb::samples_from_json(pod->at("get_cold"));
          get_pod.insert(get_pod.end(), ps.begin(), ps.end());
          pod_fd_requests += pod->at("fd_requests").to_number<std::uint64_t>();
          pod_parked_hits += pod->at("fd_parked_hits").to_number<std::uint64_t>();
        }
    }
    for (auto& t : held) {
      reg.remove(t.name());  // before the release: the last release unlinks the name itself
      t.release();
    }
    if (!get_pod.empty())
      add_series(b, "mem-cuda", "get_cold_pod", "get (first open of its allocation), from another pod", size, get_pod)
          .extra = {{"fd_requests", pod_fd_requests}, {"fd_parked_hits", pod_parked_hits}};
    auto& row = add_series(b, "mem-cuda", "get_cold", "get (first open of its allocation)", size, get);
    row.extra = {{"tensors", n},
                 {"processes", rounds},
                 {"import_opens", opens},
                 {"import_hits", hits},
                 {"fd_requests", fd_requests},
                 {"one_allocation_per_tensor", dedicated}};
    if (opens < get.size())
      std::cerr << "  note: " << opens << " opens for " << get.size()
                << " gets: some gets found their allocation already mapped\n";
  }

  // Asks the pool for an allocation per tensor (where this build's options
  // have a pool at all); false when it cannot.
  template <class O>
  static bool one_allocation_per_tensor(O& o) {
    if constexpr (requires { o.pool.dedicated_threshold; }) {
      o.pool.dedicated_threshold = 1;
      return true;
    }
    return false;
  }

  void follower_create(BackendKind b, const std::string& ns, std::uint64_t size) {
    auto argv = child_argv("create", b, ns);
    argv.insert(argv.end(), {"--prefix", "follower/" + std::to_string(size), "--size", std::to_string(size),
                             "--iters", std::to_string(cfg_.iters), "--warmup", std::to_string(cfg_.warmup / 4)});
    auto out = run_child_json(argv);
    if (!out) return;
    auto& row = add_series(b, "mem-cuda", "create_follower", "create (from another process)", size,
                           mb::samples_from_json(out->at("create_follower")));
    if (out->contains("loop")) {
      row.extra = out->at("loop").as_object();
      const auto& l = row.extra;
      note_budget_errors(b, row.label, size, l.at("budget_errors").to_number<int>(),
                         l.contains("first_error") ? std::string(l.at("first_error").as_string()) : "");
    }
    add_series(b, "mem-cuda", "remove_follower", "remove (from another process)", size,
               mb::samples_from_json(out->at("remove_follower")));
    add_series(b, "mem-cuda", "release_last_follower", "release, last ref (another process: queues free)", size,
               mb::samples_from_json(out->at("release_last_follower")));
  }

  // The raw path: the producer allocates and exports N buffers; fresh
  // consumer processes open and close each handle once.
  void naive(BackendKind b, std::uint64_t size) {
    const int n = static_cast<int>(std::clamp<std::uint64_t>(memory_budget(b) / size, 1,
                                                             static_cast<std::uint64_t>(cfg_.cold_target)));
    const int rounds = std::clamp((cfg_.cold_target + n - 1) / n, 1, cfg_.cold_max_rounds);
    Samples create;
    std::vector<std::string> handles;  // [0] is the warm-up buffer
    std::vector<std::function<void()>> frees;
    const std::string label_create = b == BackendKind::cuda ? "naive: cudaMalloc + cudaIpcGetMemHandle"
                                                            : "naive: shm_open + ftruncate + mmap";
    const std::string label_open = b == BackendKind::cuda ? "naive: cudaIpcOpenMemHandle + Close"
                                                          : "naive: shm_open + mmap + munmap";
    for (int i = 0; i <= n; ++i) {
      if (b == BackendKind::host) {
        std::string nm = "/mcb." + std::to_string(::getpid()) + "." + std::to_string(size) + "." + std::to_string(i);
        auto t0 = mb::now_ns();
        int fd = ::shm_open(nm.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd < 0) throw std::runtime_error("shm_open " + nm + ": " + std::strerror(errno));
        if (::ftruncate(fd, static_cast<off_t>(size)) != 0) throw std::runtime_error("ftruncate failed");
        void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        ::close(fd);
        if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
        auto t1 = mb::now_ns();
        if (i > 0) create.push_back(t1 - t0);
        handles.push_back(nm);
        frees.push_back([p, size, nm] {
          ::munmap(p, size);
          ::shm_unlink(nm.c_str());
        });
      } else {
#if MEMCUDA_HAS_CUDA()
        void* p = nullptr;
        cudaIpcMemHandle_t h{};
        auto t0 = mb::now_ns();
        MEMCUDA_CUDA_TRY(cudaMalloc(&p, size));
        MEMCUDA_CUDA_TRY(cudaIpcGetMemHandle(&h, p));
        auto t1 = mb::now_ns();
        if (i > 0) create.push_back(t1 - t0);
        handles.emplace_back(reinterpret_cast<const char*>(&h), sizeof h);
        frees.push_back([p] { cudaFree(p); });
#endif
      }
    }
    std::string input;
    for (const auto& h : handles) input += hex(h) + "\n";
    Samples open_close, open_only;
    for (int r = 0; r < rounds; ++r) {
      auto argv = child_argv("naive", b, "-");
      argv.insert(argv.end(), {"--size", std::to_string(size)});
      auto out = run_child_json(argv, input);
      if (!out) break;
      auto s = mb::samples_from_json(out->at("naive_open_close"));
      open_close.insert(open_close.end(), s.begin(), s.end());
      s = mb::samples_from_json(out->at("naive_open"));
      open_only.insert(open_only.end(), s.begin(), s.end());
    }
    for (auto& f : frees) f();
    add_series(b, "baseline", "naive_create", label_create, size, create);
    add_series(b, "baseline", "naive_open_close", label_open, size, open_close);
    add_series(b, "baseline", "naive_open", label_open.substr(0, label_open.find(" +")) +
                                                (b == BackendKind::cuda ? " only" : " + mmap only"),
               size, open_only);
  }

  // get+release from 1, 4, 16 client processes at once; aggregate ops/s.
  void throughput(TensorRegistry& reg, BackendKind b, const std::string& ns, std::uint64_t size) {
    const std::string name = "tput/" + std::to_string(size);
    auto t = reg.create_any(name, DType::u8, {static_cast<std::int64_t>(size)});
    for (int p : cfg_.clients) {
      std::cerr << "-- " << to_string(b) << " get+release throughput, " << p << " process(es)\n";
      auto r = run_clients("tput", b, ns, name, p);
      if (!r) continue;
      r->op = "get_release_tput";
      r->label = "get+release, " + std::to_string(p) + " process(es)";
      r->size = size;
      add(std::move(*r));
    }
    // The same with the default sharing and a lingering window: only the
    // gets that found no lingering reference go to Redis (the label says
    // how many of the ops did).
    for (int p : cfg_.clients) {
      std::cerr << "-- " << to_string(b) << " get+release throughput, lingering " << kLingerMs << " ms, " << p
                << " process(es)\n";
      auto r = run_clients("tput_linger", b, ns, name, p);
      if (!r) continue;
      r->op = "get_release_linger_tput";
      r->label = "get+release, " + std::to_string(p) + " process(es), sharing, release_linger " +
                 std::to_string(kLingerMs) + " ms (" + std::to_string(r->acquires) + " of " +
                 std::to_string(r->ops) + " gets went to Redis)";
      r->size = size;
      add(std::move(*r));
    }
    reg.remove(name);
    // The ceiling: PING from as many processes as the largest client count.
    if (!cfg_.clients.empty()) {
      int p = *std::max_element(cfg_.clients.begin(), cfg_.clients.end());
      if (auto r = run_clients("ping", b, ns, name, p)) {
        r->group = "baseline";
        r->op = "redis_ping_tput";
        r->label = "Redis PING, " + std::to_string(p) + " process(es)";
        r->size = 0;
        add(std::move(*r));
      }
    }
  }

  std::optional<Row> run_clients(const std::string& role, BackendKind b, const std::string& ns,
                                 const std::string& name, int procs) {
    const double duration = over_budget() ? std::min(cfg_.duration_s, 0.5) : cfg_.duration_s;
    std::vector<std::unique_ptr<mb::ChildProcess>> cs;
    for (int i = 0; i < procs; ++i) {
      auto argv = child_argv(role, b, ns);
      argv.insert(argv.end(), {"--name", name, "--duration", mb::fmt(duration, 3), "--warmup",
                               std::to_string(cfg_.warmup)});
      cs.push_back(std::make_unique<mb::ChildProcess>(argv, child_env()));
    }
    for (auto& c : cs) {
      auto l = c->read_line(milliseconds(120000));
      if (!l || *l != "READY") {
        std::cerr << "  a client did not get ready\n";
        ++failures_;
        return std::nullopt;
      }
    }
    for (auto& c : cs) c->write("GO\n");
    Samples all;
    double rate = 0;
    std::uint64_t ops = 0, acquires = 0;
    for (auto& c : cs) {
      std::string out = c->read_all(milliseconds(static_cast<std::int64_t>(duration * 1000) + 120000));
      int rc = c->wait();
      if (rc != 0) {
        std::cerr << "  client exited " << rc << "\n";
        ++failures_;
        return std::nullopt;
      }
      auto o = json::parse(out).as_object();
      auto s = mb::samples_from_json(o.at("samples"));
      all.insert(all.end(), s.begin(), s.end());
      ops += o.at("ops").to_number<std::uint64_t>();
      if (auto* a = o.if_contains("acquires")) acquires += a->to_number<std::uint64_t>();
      rate += static_cast<double>(o.at("ops").to_number<std::uint64_t>()) /
              (static_cast<double>(o.at("elapsed_ns").to_number<std::int64_t>()) / 1e9);
    }
    Row r;
    r.backend = std::string(to_string(b));
    r.group = "mem-cuda";
    r.procs = procs;
    r.s = mb::summarize(std::move(all));
    r.ops_per_s = rate;
    r.ops = ops;
    r.acquires = acquires;
    r.extra = {{"duration_s", duration}, {"ops", ops}, {"acquires", acquires}};
    return r;
  }

  // Mixed sizes, some freed and created again; then the leader's pools.
  void pool_run(TensorRegistry& reg, BackendKind b) {
    const std::uint64_t max_size = b == BackendKind::cuda ? (64ull << 20) : (16ull << 20);
    const std::uint64_t cap = std::min<std::uint64_t>(memory_budget(b), b == BackendKind::cuda ? 4ull << 30 : 1ull << 30);
    const int count = cfg_.quick ? 32 : 256;
    std::uint64_t rng = 0x9E3779B97F4A7C15ull;
    auto next = [&] {
      rng ^= rng << 13;
      rng ^= rng >> 7;
      rng ^= rng << 17;
      return rng;
    };
    auto rand_size = [&] {
      // log-uniform between 4 KiB and max_size, not a power of two
      double lo = std::log2(4096.0), hi = std::log2(static_cast<double>(max_size));
      double u = static_cast<double>(next() % 1000000) / 1e6;
      auto s = static_cast<std::uint64_t>(std::exp2(lo + u * (hi - lo)));
      return std::max<std::uint64_t>(1, s - s % 256);
    };
    std::map<std::string, SharedTensor<void>> live;
    std::uint64_t total = 0, logical = 0;
    int id = 0;
    auto make = [&] {
      auto s = rand_size();
      if (total + s > cap) return;
      std::string name = "pool/" + std::to_string(id++);
      live.emplace(name, reg.create_any(name, DType::u8, {static_cast<std::int64_t>(s)}));
      total += s;
    };
    for (int i = 0; i < count; ++i) make();
    int k = 0;
    for (auto it = live.begin(); it != live.end();) {
      if (k++ % 3 == 0) {
        total -= it->second.bytes();
        reg.remove(it->first);
        it->second.release();
        it = live.erase(it);
      } else {
        ++it;
      }
    }
    for (int i = 0; i < count / 3; ++i) make();
    for (auto& [n, t] : live) logical += t.bytes();
    // Let the control thread's tick (every ttl/3) trim empty slabs first, as
    // it would in a long-running allocator of record; the leader's stats()
    // reads its own pools, other processes what it publishes each tick.
    std::this_thread::sleep_for(reg.options().lease_ttl / 3 + milliseconds(200));
    auto deadline = mb::Clock::now() + reg.options().lease_ttl;
    RegistryStats st = reg.stats();
    while (pools_of(st, b).empty() && mb::Clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(100));
      st = reg.stats();
    }
    auto pools = pools_of(st, b);
    json::object o{{"tensors", live.size()},
                   {"logical_bytes", logical},
                   {"owned_bytes", st.process.owned_bytes},
                   {"owned_allocations", st.process.owned_allocations}};
    if (!pools.empty()) {
      std::uint64_t in_use = 0, reserved = 0;
      for (auto& [iu, rs] : pools) {
        in_use += iu;
        reserved += rs;
      }
      o["pool_in_use"] = in_use;
      o["pool_reserved"] = reserved;
      o["reserved_over_in_use"] = in_use ? static_cast<double>(reserved) / static_cast<double>(in_use) : 0.0;
    } else {
      o["reserved_over_in_use"] = nullptr;
      o["note"] = "stats().pools is empty: no pool published (the slab pool has not landed)";
    }
    std::cerr << "  pool after a mixed-size run: " << json::serialize(o) << "\n";
    pool_[std::string(to_string(b))] = std::move(o);
    for (auto& [n, t] : live) {
      reg.remove(n);
      t.release();
    }
  }

  // (in_use, reserved) of each pool of backend `b`, when this build's
  // RegistryStats has pools at all.
  template <class S>
  static std::vector<std::pair<std::uint64_t, std::uint64_t>> pools_of(const S& st, BackendKind b) {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
    if constexpr (requires { st.pools; }) {
      for (const auto& p : st.pools)
        if (p.backend == b) out.emplace_back(p.in_use, p.reserved);
    }
    return out;
  }

  // ---- PyTorch ----

  std::optional<std::string> locate_torch_script() const {
    if (cfg_.torch_script) return cfg_.torch_script;
    auto exe_dir = mb::self_exe().parent_path();
    const std::filesystem::path cands[] = {
        exe_dir / "baselines" / "torch_handoff.py",
        exe_dir / ".." / "share" / "memcuda" / "benchmarks" / "torch_handoff.py",
        std::filesystem::current_path() / "benchmarks" / "baselines" / "torch_handoff.py",
#ifdef MEMCUDA_BENCH_SOURCE_DIR
        std::filesystem::path(MEMCUDA_BENCH_SOURCE_DIR) / "baselines" / "torch_handoff.py",
#endif
    };
    for (const auto& c : cands)
      if (std::filesystem::exists(c)) return std::filesystem::weakly_canonical(c).string();
    return std::nullopt;
  }

  void baseline_torch() {
    auto skip = [&](const std::string& why) {
      std::cerr << "PyTorch baseline skipped: " << why << "\n";
      torch_ = json::object{{"skipped", why}};
    };
    if (!cfg_.torch) return skip(cfg_.hot ? "--hot" : "--no-torch");
    if (!cuda_available()) return skip("no CUDA device");
    std::string py = mb::find_on_path("python3");
    if (py.empty()) return skip("python3 not found on PATH");
    int rc = 0;
    if (!mb::capture({py, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)"},
                     milliseconds(120000), &rc))
      return skip(rc == 3 ? "torch cannot see a CUDA device" : "`python3 -c 'import torch'` failed (no PyTorch)");
    auto script = locate_torch_script();
    if (!script) return skip("benchmarks/baselines/torch_handoff.py not found (pass --torch-script)");
    std::vector<std::uint64_t> sizes;
    for (auto s : cfg_.sizes.value_or(default_sizes(BackendKind::cuda, cfg_.quick)))
      if (s >= 4096 && s <= (64u << 20)) sizes.push_back(s);
    if (sizes.empty()) sizes = {4096, 1u << 20, 64u << 20};
    std::string list;
    for (auto s : sizes) list += (list.empty() ? "" : ",") + std::to_string(s);
    std::cerr << "== PyTorch handoff baseline (" << *script << ")\n";
    const int iters = over_budget() ? std::min(cfg_.torch_iters, 30) : cfg_.torch_iters;
    auto out = mb::capture({py, *script, "--sizes", list, "--iters", std::to_string(iters), "--device",
                            std::to_string(cfg_.device)},
                           milliseconds(300000), &rc);
    if (!out) return skip("torch_handoff.py failed (exit " + std::to_string(rc) + ")");
    try {
      // The JSON document is the last line (torch may print warnings before).
      std::string text = *out;
      while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
      auto nl = text.rfind('\n');
      auto doc = json::parse(nl == std::string::npos ? text : text.substr(nl + 1)).as_object();
      for (const auto& r : doc.at("results").as_array()) {
        const auto& o = r.as_object();
        Row row;
        row.backend = "cuda";
        row.group = "baseline";
        row.op = "torch_handoff";
        row.label = "PyTorch mp queue handoff (consumer mapped)";
        row.size = o.at("size").to_number<std::uint64_t>();
        row.s.n = o.at("n").to_number<std::size_t>();
        row.s.p50_us = o.at("handoff_p50_us").to_number<double>();
        row.s.p99_us = o.at("handoff_p99_us").to_number<double>();
        row.s.p999_us = o.at("handoff_p999_us").to_number<double>();
        row.s.mean_us = o.at("handoff_mean_us").to_number<double>();
        row.s.ops_per_s = row.s.mean_us > 0 ? 1e6 / row.s.mean_us : 0;
        row.extra = {{"read_p50_us", o.at("read_p50_us")}, {"read_p99_us", o.at("read_p99_us")}};
        add(std::move(row));
      }
      torch_ = std::move(doc);
    } catch (const std::exception& e) {
      skip(std::string("could not read torch_handoff.py's output: ") + e.what());
    }
  }

  void load_bandwidth() {
    if (!cfg_.bandwidth_json) return;
    try {
      std::ifstream f(*cfg_.bandwidth_json);
      std::stringstream ss;
      ss << f.rdbuf();
      bandwidth_ = json::parse(ss.str());
    } catch (const std::exception& e) {
      std::cerr << "cannot read " << *cfg_.bandwidth_json << ": " << e.what() << "\n";
    }
  }

  // ---- targets ----

  struct Target {
    std::string backend, name, goal, measured, status, note;
  };

  // Worst p-value of `op` over the sizes measured, with the size it came at.
  std::optional<std::pair<double, std::uint64_t>> worst(const std::string& backend, const std::string& op,
                                                        bool p99) const {
    std::optional<std::pair<double, std::uint64_t>> w;
    for (const auto& r : rows_)
      if (r.backend == backend && r.op == op && r.s.n > 0) {
        double v = p99 ? r.s.p99_us : r.s.p50_us;
        if (!w || v > w->first) w = {{v, r.size}};
      }
    return w;
  }

  std::vector<Target> evaluate_targets() const {
    std::vector<Target> out;
    for (auto b : cfg_.backends) {
      const std::string bn(to_string(b));
      auto latency = [&](const std::string& name, const std::vector<std::string>& ops, bool p99, double goal) {
        Target t{bn, name, (p99 ? "p99 <= " : "p50 <= ") + mb::fmt(goal, 0) + " us", "n/a", "n/a", ""};
        std::optional<std::pair<double, std::uint64_t>> w;
        std::string which;
        for (const auto& op : ops)
          if (auto x = worst(bn, op, p99); x && (!w || x->first > w->first)) {
            w = x;
            which = op;
          }
        if (w) {
          t.measured = mb::fmt_us(w->first) + " us";
          t.status = w->first <= goal ? "met" : "missed";
          t.note = "worst over sizes: " + which + " at " + mb::format_size(w->second);
        }
        out.push_back(t);
      };
      latency("get, allocation mapped", {"get_warm"}, false, 30);
      latency("get of a tensor already held", {"get_held"}, false, 2);
      {
        Target t{bn, "get vs PyTorch handoff", ">= 15x faster (p50)", "n/a", "n/a", ""};
        if (b == BackendKind::cuda) {
          std::optional<double> worst_ratio;
          std::uint64_t at = 0;
          for (const auto& r : rows_)
            if (r.op == "torch_handoff")
              if (const Row* g = find(bn, "get_warm", r.size); g && g->s.p50_us > 0) {
                double ratio = r.s.p50_us / g->s.p50_us;
                if (!worst_ratio || ratio < *worst_ratio) {
                  worst_ratio = ratio;
                  at = r.size;
                }
              }
          if (worst_ratio) {
            t.measured = mb::fmt(*worst_ratio, 1) + "x";
            t.status = *worst_ratio >= 15 ? "met" : "missed";
            t.note = "worst over sizes at " + mb::format_size(at);
          } else {
            t.note = torch_.is_object() && torch_.as_object().contains("skipped")
                         ? "PyTorch baseline skipped: " + std::string(torch_.as_object().at("skipped").as_string())
                         : "no common size";
          }
        } else {
          t.note = "the PyTorch baseline shares CUDA tensors only";
        }
        out.push_back(t);
      }
      latency("get, first open", {"get_cold"}, false, 200);
      latency("create from another process", {"create_follower"}, false, 150);
      latency("create in the allocator of record", {"create_leader"}, false, 20);
      latency("release", {"release", "release_last", "release_unmap", "release_last_follower"}, true, 100);
      latency("remove", {"remove", "remove_follower"}, true, 100);
      {
        Target t{bn, "get+release throughput, 16 processes", ">= 100k ops/s", "n/a", "n/a", ""};
        if (const Row* r = [&]() -> const Row* {
              for (const auto& x : rows_)
                if (x.backend == bn && x.op == "get_release_tput" && x.procs == 16) return &x;
              return nullptr;
            }()) {
          t.measured = mb::fmt_rate(r->ops_per_s) + " ops/s";
          t.status = r->ops_per_s >= 1e5 ? "met" : "missed";
        } else {
          t.note = "16 clients not run (--clients)";
        }
        out.push_back(t);
      }
      {
        Target t{bn, "imported read bandwidth", ">= 98% of local", "n/a", "n/a", ""};
        if (b != BackendKind::cuda) {
          t.note = "GPU kernels only (bench_bandwidth)";
        } else if (bandwidth_.is_object() && bandwidth_.as_object().contains("results")) {
          std::optional<double> w;
          for (const auto& r : bandwidth_.as_object().at("results").as_array()) {
            double ratio = r.as_object().at("ratio").to_number<double>();
            if (!w || ratio < *w) w = ratio;
          }
          if (w) {
            t.measured = mb::fmt(*w * 100, 1) + "%";
            t.status = *w >= 0.98 ? "met" : "missed";
            t.note = "worst over sizes (bench_bandwidth)";
          }
        } else if (bandwidth_.is_object() && bandwidth_.as_object().contains("skipped")) {
          t.note = "bench_bandwidth skipped: " + std::string(bandwidth_.as_object().at("skipped").as_string());
        } else {
          t.note = "run bench_bandwidth and pass --bandwidth-json";
        }
        out.push_back(t);
      }
      {
        Target t{bn, "pool reserved / in use after a mixed run", "<= 1.10", "n/a", "n/a", ""};
        if (auto it = pool_.find(bn); it != pool_.end()) {
          const auto& v = it->second.at("reserved_over_in_use");
          if (v.is_number()) {
            double x = v.to_number<double>();
            t.measured = mb::fmt(x, 3);
            t.status = x <= 1.10 ? "met" : "missed";
          } else {
            t.note = "no pool statistics published yet";
          }
        }
        out.push_back(t);
      }
    }
    return out;
  }

  // ---- output ----

  static std::string size_cell(std::uint64_t s) { return s ? mb::format_size(s) : "-"; }

  void print(const std::vector<Target>& targets) const {
    std::ostringstream o;
    o << "### Latency and throughput\n\n";
    o << "Redis: " << redis_.origin() << " (" << redis_.transport() << ", redis " << redis_.server_version()
      << "); iterations per latency row up to " << cfg_.iters << ", throughput rows run "
      << mb::fmt(cfg_.duration_s, 1) << " s each" << (cfg_.quick ? "; QUICK smoke run, not for reporting" : "")
      << ". ops/s: back-to-back in one process for latency rows, aggregate over all processes for "
         "throughput rows.\n\n";
    mb::Table t({"backend", "operation", "size", "procs", "n", "p50 us", "p99 us", "p99.9 us", "ops/s"}, "ll");
    auto emit_rows = [&](const std::string& group) {
      for (const auto& r : rows_)
        if (r.group == group)
          t.add({r.backend, r.label, size_cell(r.size), std::to_string(r.procs), std::to_string(r.s.n),
                 mb::fmt_us(r.s.p50_us), mb::fmt_us(r.s.p99_us), r.s.n >= 1000 ? mb::fmt_us(r.s.p999_us) : "-",
                 mb::fmt_rate(r.ops_per_s)});
    };
    emit_rows("mem-cuda");
    emit_rows("baseline");
    o << t.str() << "\n";
    o << "p99.9 is shown where a row has at least 1000 samples.\n\n";

    o << "### Ratios against the baselines (p50)\n\n";
    mb::Table rt({"backend", "size", "mem-cuda", "baseline", "mem-cuda p50 us", "baseline p50 us", "ratio"}, "llllrrl");
    auto ratio = [&](const std::string& bn, std::uint64_t size, const std::string& op, const Row* base,
                     bool speedup) {
      const Row* m = find(bn, op, size);
      if (!m || !base || m->s.n == 0 || base->s.n == 0 || m->s.p50_us <= 0) return;
      std::string txt = speedup ? mb::fmt(base->s.p50_us / m->s.p50_us, 1) + "x faster"
                                : mb::fmt(m->s.p50_us / base->s.p50_us, 2) + "x the baseline";
      rt.add({bn, size_cell(size), m->label, base->label, mb::fmt_us(m->s.p50_us), mb::fmt_us(base->s.p50_us), txt});
    };
    const Row* ping = find("-", "redis_ping", 0);
    for (auto b : cfg_.backends) {
      const std::string bn(to_string(b));
      for (auto size : cfg_.sizes.value_or(default_sizes(b, cfg_.quick))) {
        ratio(bn, size, "get_warm", ping, false);
        ratio(bn, size, "get_cold", find(bn, "naive_open_close", size), false);
        ratio(bn, size, "create_leader", find(bn, "naive_create", size), false);
        if (b == BackendKind::cuda) ratio(bn, size, "get_warm", find("cuda", "torch_handoff", size), true);
      }
    }
    o << rt.str() << "\n";

    if (bandwidth_.is_object() && bandwidth_.as_object().contains("results")) {
      o << "### Read bandwidth through an imported mapping (bench_bandwidth)\n\n";
      mb::Table bt({"size", "local GB/s", "imported GB/s", "imported / local"}, "l");
      for (const auto& r : bandwidth_.as_object().at("results").as_array()) {
        const auto& x = r.as_object();
        bt.add({mb::format_size(x.at("size").to_number<std::uint64_t>()),
                mb::fmt(x.at("local_gbps").to_number<double>(), 1),
                mb::fmt(x.at("imported_gbps").to_number<double>(), 1),
                mb::fmt(x.at("ratio").to_number<double>() * 100, 1) + "%"});
      }
      o << bt.str() << "\n";
    }

    o << "### Targets\n\n";
    mb::Table tt({"backend", "target", "goal", "measured", "status", "note"}, "lllrll");
    for (const auto& x : targets) tt.add({x.backend, x.name, x.goal, x.measured, x.status, x.note});
    o << tt.str() << "\n";
    for (const auto& [bn, p] : pool_)
      o << "Mixed-size run (" << bn << "): " << json::serialize(p) << "\n\n";
    for (const auto& n : notes_) o << "Note: " << n << "\n\n";
    if (torch_.is_object() && torch_.as_object().contains("skipped"))
      o << "PyTorch baseline skipped: " << std::string(torch_.as_object().at("skipped").as_string()) << "\n\n";
    std::cout << o.str() << std::flush;
  }

  json::object environment() const {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    json::object e{{"hostname", host},
                   {"cpus", std::thread::hardware_concurrency()},
                   {"date", mb::utc_now_iso()},
                   {"memcuda_version", kVersionString},
                   {"redis_version", redis_.server_version()},
                   {"redis", redis_.redacted()},
                   {"redis_origin", redis_.origin()},
                   {"redis_transport", redis_.transport()}};
#if MEMCUDA_HAS_CUDA()
    int rt = 0, drv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    e["cuda_runtime"] = std::to_string(rt / 1000) + "." + std::to_string(rt % 1000 / 10);
    e["cuda_driver_api"] = std::to_string(drv / 1000) + "." + std::to_string(drv % 1000 / 10);
    cudaDeviceProp p{};
    if (cuda_available() && cudaGetDeviceProperties(&p, cfg_.device) == cudaSuccess) e["gpu"] = p.name;
    cudaGetLastError();
#endif
    return e;
  }

  void write_json(const std::vector<Target>& targets) const {
    json::array results;
    for (const auto& r : rows_) {
      json::object o{{"backend", r.backend}, {"group", r.group}, {"op", r.op},     {"label", r.label},
                     {"size", r.size},       {"procs", r.procs}, {"n", r.s.n},     {"p50_us", r.s.p50_us},
                     {"p99_us", r.s.p99_us}, {"p999_us", r.s.p999_us},            {"mean_us", r.s.mean_us},
                     {"min_us", r.s.min_us}, {"max_us", r.s.max_us},              {"ops_per_s", r.ops_per_s}};
      if (!r.extra.empty()) o["extra"] = r.extra;
      results.push_back(std::move(o));
    }
    json::array tj;
    for (const auto& t : targets)
      tj.push_back(json::object{{"backend", t.backend},
                                {"target", t.name},
                                {"goal", t.goal},
                                {"measured", t.measured},
                                {"status", t.status},
                                {"note", t.note}});
    json::array backends;
    for (auto b : cfg_.backends) backends.emplace_back(std::string(to_string(b)));
    json::object sizes;
    for (auto b : cfg_.backends) {
      json::array a;
      for (auto s : cfg_.sizes.value_or(default_sizes(b, cfg_.quick))) a.emplace_back(s);
      sizes[to_string(b)] = std::move(a);
    }
    json::array clients;
    for (int c : cfg_.clients) clients.emplace_back(c);
    json::object pools;
    for (const auto& [k, v] : pool_) pools[k] = v;
    json::object doc{{"tool", "memcuda_bench"},
                     {"schema", 1},
                     {"environment", environment()},
                     {"config",
                      {{"backends", backends},
                       {"sizes", sizes},
                       {"iters", cfg_.iters},
                       {"warmup", cfg_.warmup},
                       {"clients", clients},
                       {"duration_s", cfg_.duration_s},
                       {"quick", cfg_.quick}}},
                     {"results", results},
                     {"baselines", {{"torch", torch_}, {"bandwidth", bandwidth_}}},
                     {"pool", pools},
                     {"targets", tj},
                     {"failures", failures_}};
    mb::write_file(cfg_.json_path, json::serialize(doc) + "\n");
    std::cerr << "wrote " << cfg_.json_path << "\n";
  }

  // Keys a run leaves in a shared Redis: everything under our namespaces.
  void cleanup_namespaces() {
    if (redis_.is_private()) return;
    try {
      redis::Connection c(redis_.options());
      for (const auto& ns : namespaces_) mb::delete_namespace(c, ns);
    } catch (const std::exception& e) {
      std::cerr << "cleanup: " << e.what() << "\n";
    }
  }

  Config cfg_;
  mb::RedisTarget& redis_;
  mb::Clock::time_point start_ = mb::Clock::now();
  bool budget_noted_ = false;
  std::vector<std::string> notes_;
  std::optional<bool> pods_ok_;  // --pods: whether pods can be made here (asked once)
  std::vector<Row> rows_;
  std::map<std::string, json::object> pool_;
  json::value torch_;
  json::value bandwidth_;
  std::vector<std::string> namespaces_;
  int failures_ = 0;
};

void usage() {
  std::cerr <<
      R"(usage: memcuda_bench [options]
  --backend host|cuda|both   default: both when a CUDA device is usable, else host
  --sizes LIST               tensor sizes, e.g. 4KiB,1MiB,64MiB,1GiB (host default: 4KiB,1MiB,16MiB)
  --iters N                  timed iterations per latency row (default 2000)
  --clients LIST             client processes for get+release throughput (default 1,4,16)
  --duration SEC             seconds per throughput configuration (default 2)
  --quick                    smoke run: few iterations, small sizes (numbers not for reporting)
  --hot                      only the hot-path rows: create (leader, follower), warm get, release,
                             get+release throughput (no cold get, raw-IPC, pool or PyTorch rows);
                             with --clients 1 --duration 1 it runs in well under a minute
  --url URL                  Redis to use (else MEMCUDA_REDIS_URL, else a private redis-server from PATH)
  --redis-server PATH        the redis-server to start when there is no URL
  --json FILE                write every result as JSON
  --torch-script PATH        benchmarks/baselines/torch_handoff.py (found automatically when nearby)
  --torch-iters N            handoffs per size in the PyTorch baseline (default 200)
  --no-torch                 skip the PyTorch baseline
  --bandwidth-json FILE      bench_bandwidth's JSON, to report against the bandwidth target
  --device N                 CUDA device (default 0)
  --max-seconds S            stop any one timed loop after S seconds (default 20)
  --budget S                 soft limit for the whole run: once spent, every remaining loop runs
                             at most 0.5 s and one consumer process (the output says so)
  --pods                     also run the first-open and warm-get consumers in a pod of their own
                             (new pid, network, mount, UTS and IPC namespaces, private /dev/shm;
                             root, unshare and the private Redis): rows get_cold_pod, get_warm_pod
)";
}

Config parse_config(const mb::Args& a) {
  Config c;
  c.quick = a.has("--quick");
  c.hot = a.has("--hot");
  if (c.hot) c.torch = false;
  if (c.quick) {
    c.iters = 200;
    c.warmup = 20;
    c.duration_s = 0.3;
    c.cold_target = 50;
    c.cold_max_rounds = 1;
    c.max_seconds = 5;
    c.torch_iters = 20;
  }
  if (auto v = a.get("--iters")) c.iters = std::max(1, std::stoi(*v));
  if (auto v = a.get("--warmup")) c.warmup = std::max(0, std::stoi(*v));
  if (!a.has("--quick")) c.cold_target = std::min(c.cold_target, c.iters);
  if (auto v = a.get("--sizes")) c.sizes = mb::parse_size_list(*v);
  if (auto v = a.get("--clients")) c.clients = mb::parse_int_list(*v);
  if (auto v = a.get("--duration")) c.duration_s = std::stod(*v);
  if (auto v = a.get("--max-seconds")) c.max_seconds = std::stod(*v);
  if (auto v = a.get("--budget")) c.budget_s = std::stod(*v);
  if (auto v = a.get("--device")) c.device = std::stoi(*v);
  if (auto v = a.get("--json")) c.json_path = *v;
  if (auto v = a.get("--torch-script")) c.torch_script = *v;
  if (auto v = a.get("--torch-iters")) c.torch_iters = std::stoi(*v);
  if (auto v = a.get("--bandwidth-json")) c.bandwidth_json = *v;
  c.torch = c.torch && !a.has("--no-torch");
  c.pods = a.has("--pods");
  std::string why;
  std::string want = a.get_or("--backend", cuda_available() ? "both" : "host");
  if (want == "both") {
    c.backends.push_back(BackendKind::host);
    if (cuda_available(&why)) c.backends.push_back(BackendKind::cuda);
    else std::cerr << "cuda backend skipped: " << why << "\n";
  } else if (want == "host") {
    c.backends.push_back(BackendKind::host);
  } else if (want == "cuda") {
    if (!cuda_available(&why)) throw std::runtime_error("--backend cuda: " + why);
    c.backends.push_back(BackendKind::cuda);
  } else {
    throw std::invalid_argument("--backend must be host, cuda or both");
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  mb::Args args(argc, argv);
  try {
    if (args.get("--child")) return run_child(args);
    if (args.has("--help") || args.has("-h")) {
      usage();
      return 0;
    }
    Config cfg = parse_config(args);
    mb::RedisTarget redis(args);
    Bench bench(std::move(cfg), redis);
    return bench.run();
  } catch (const std::exception& e) {
    std::cerr << "memcuda_bench" << (args.get("--child") ? " (child " + *args.get("--child") + ")" : "") << ": "
              << e.what() << "\n";
    return 1;
  }
}
