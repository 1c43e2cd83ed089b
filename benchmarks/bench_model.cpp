// memcuda_bench_model: the mem-cuda side of the model rows, for a
// Llama-2-7B-shaped bf16 state dict (291 tensors, 13.5 GB; the same list as
// benchmarks/baselines/model_common.py, whose PyTorch scripts are the
// baselines benchmarks/run_model.sh runs beside this program):
//
//   memcuda_publish_leader  the state dict created from scratch by the
//                           allocator of record (this process), no data
//                           fill; its pool trimmed before each repetition.
//   memcuda_publish_other   the same, created by another process (a child of
//                           this one, control_thread=false): every create
//                           goes to the allocator of record as a command.
//   memcuda_open_fresh      a FRESH consumer process (spawned per repetition,
//                           registry, CUDA context and connection made
//                           before the clock starts) opens all 291 by name
//                           until every tensor is usable: one element of each
//                           read (cuda: a 2-byte cudaMemcpyAsync per tensor to
//                           pinned memory, one stream synchronisation; host: a
//                           read) and checked against the value written.
//   memcuda_pool_ratio      the allocator of record's pools, reserved / in use,
//                           with the state dict live after the publish runs.
//   memcuda_inplace_update  8 consumer processes (--consumers) hold the state
//                           dict; this process (the trainer) rewrites element 0
//                           of every tensor in place (untimed), then publishes a
//                           new version of the model (memcuda/model.hpp: one
//                           event, one script). Timed from just before the
//                           publish to the LAST consumer having observed the
//                           version, ordered its stream on it and read one
//                           tensor on that stream (synchronised). Phases:
//                           publish_ms (the publish_version call), wait_ms
//                           (until the last wait_version returned). read_all_ms:
//                           a separate publish, timed until the last consumer
//                           read element 0 of all 291 (as the PyTorch
//                           baseline's consumers do) and checked the new
//                           values. Separate, so that no consumer's 291 reads
//                           queue on the shared GPU ahead of another's one
//                           read (before, both were one publish: the row then
//                           included the other consumers' read_all).
//
//   memcuda_bench_model [--backend auto|host|cuda] [--small | --scale N]
//                       [--reps 5] [--warmup 1] [--device N] [--url URL] [--strict]
//                       [--consumers 8]
//
// stdout: `row <name> <median> <min> n=<runs> [key=value ...]` (times in ms),
// `skip <name> <reason>`; progress on stderr. Exit 0; 1 when something
// failed (a wrong value, a child that died; with --strict also a row
// skipped once the run got going); 77 when nothing can run here
// (no CUDA device for --backend cuda, no redis-server, /dev/shm too small).
// --scale N divides every dimension (rounded up): 291 tensors still, mixed
// sizes still; --small is --scale 64 (about 3.3 MB). The host backend's
// default is --scale 8 (211 MB): a host tensor is a committed /dev/shm slab.
#include <sys/statvfs.h>


#include "bench_common.hpp"
#include "bench_llama.hpp"
#include "memcuda/detail/backend/select.hpp"
#include "memcuda/memcuda.hpp"
#include "memcuda/model.hpp"
#include "memcuda/state_dict.hpp"

#if MEMCUDA_HAS_CUDA()
#include <cuda_runtime_api.h>
#endif

namespace {

using namespace memcuda;
namespace mb = memcuda::bench;
namespace json = boost::json;
using std::chrono::milliseconds;

constexpr int kSkip = 77;
constexpr std::size_t kTensors = mb::kLlamaTensors;
constexpr int kSmallScale = 64;
using mb::check_specs;
using mb::ModelTensor;
using mb::state_dict_specs;

// Element 0 of tensor i holds touch_value(i) (model_common.touch_value): a
// small integer, exact in bf16, whose bits are the float's upper half.
std::uint16_t touch_bits(std::size_t i) {
  float f = static_cast<float>(i % 97 + 1);
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<std::uint16_t>(u >> 16);
}

// ---- the two operations the batch API replaces ----------------------------------
//
// Both go one tensor at a time today. When TensorRegistry gains
// create_many / get_many (or the state-dict helpers), only these two bodies
// change: one call each, same inputs, same outputs (the handles in `specs`
// order).

std::string full_name(const std::string& prefix, const ModelTensor& s) { return prefix + "/" + s.name; }

// --per-tensor: one create / get / remove per tensor (what a client without
// the batch calls pays), for comparison with the batch rows.
bool g_per_tensor = false;

std::vector<SharedTensor<void>> publish_all(TensorRegistry& reg, const std::string& prefix,
                                            const std::vector<ModelTensor>& specs) {
  std::vector<SharedTensor<void>> out;
  out.reserve(specs.size());
  CreateOptions opts;
  opts.persistent = true;  // a published model is held by its names
  if (g_per_tensor) {
    for (const auto& s : specs) out.push_back(reg.create_any(full_name(prefix, s), DType::bf16, s.shape, opts));
    return out;
  }
  std::vector<memcuda::TensorSpec> batch;  // one request, all or nothing
  batch.reserve(specs.size());
  for (const auto& s : specs) batch.push_back({full_name(prefix, s), DType::bf16, s.shape, opts});
  auto made = reg.create_many(batch);
  for (const auto& s : specs) out.push_back(std::move(made.at(full_name(prefix, s))));
  return out;
}

std::vector<SharedTensor<void>> open_all(TensorRegistry& reg, const std::string& prefix,
                                         const std::vector<ModelTensor>& specs) {
  std::vector<SharedTensor<void>> out;
  out.reserve(specs.size());
  if (g_per_tensor) {
    for (const auto& s : specs) out.push_back(reg.get<void>(full_name(prefix, s)));
    return out;
  }
  std::vector<std::string> names;  // one round trip for every reference
  names.reserve(specs.size());
  for (const auto& s : specs) names.push_back(full_name(prefix, s));
  auto got = reg.get_all(names);
  for (const auto& n : names) out.push_back(std::move(got.at(n)));
  return out;
}

// Unpublishes: names removed, handles released, the releases in Redis.
void unpublish_all(TensorRegistry& reg, const std::string& prefix, const std::vector<ModelTensor>& specs,
                   std::vector<SharedTensor<void>>& held) {
  if (g_per_tensor) {
    for (const auto& s : specs) reg.remove(full_name(prefix, s));
  } else {
    std::vector<std::string> names;
    for (const auto& s : specs) names.push_back(full_name(prefix, s));
    reg.remove_many(names);
  }
  for (auto& t : held) t.release();
  held.clear();
  reg.flush();
}

// ---- touching: what "usable" means ------------------------------------------------

// Reads element 0 of every tensor. Everything it needs (stream, pinned
// buffer) is made by the constructor, before any clock starts.
class Toucher {
 public:
  Toucher(BackendKind b, std::size_t n) : backend_(b), n_(n) {
#if MEMCUDA_HAS_CUDA()
    if (b == BackendKind::cuda) {
      MEMCUDA_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      MEMCUDA_CUDA_TRY(cudaMallocHost(reinterpret_cast<void**>(&pinned_), n * sizeof(std::uint16_t)));
    }
#endif
  }
  ~Toucher() {
#if MEMCUDA_HAS_CUDA()
    if (pinned_) cudaFreeHost(pinned_);
    if (stream_) cudaStreamDestroy(stream_);
#endif
  }
  Toucher(const Toucher&) = delete;
  Toucher& operator=(const Toucher&) = delete;

  // The stream the reads go on (cuda; nullptr on host): a consumer orders it
  // after a producer's event before touching.
  StreamHandle stream() const noexcept {
#if MEMCUDA_HAS_CUDA()
    return stream_;
#else
    return nullptr;
#endif
  }

  std::vector<std::uint16_t> touch(const std::vector<SharedTensor<void>>& ts) {
    if (ts.size() > n_) throw std::logic_error("Toucher: more tensors than it was made for");
    std::vector<std::uint16_t> v(ts.size());
    if (backend_ == BackendKind::host) {
      for (std::size_t i = 0; i < ts.size(); ++i) v[i] = *static_cast<const volatile std::uint16_t*>(ts[i].data());
      return v;
    }
#if MEMCUDA_HAS_CUDA()
    for (std::size_t i = 0; i < ts.size(); ++i)
      MEMCUDA_CUDA_TRY(cudaMemcpyAsync(pinned_ + i, ts[i].data(), sizeof(std::uint16_t), cudaMemcpyDeviceToHost,
                                       stream_));
    MEMCUDA_CUDA_TRY(cudaStreamSynchronize(stream_));
    std::memcpy(v.data(), pinned_, v.size() * sizeof(std::uint16_t));
#endif
    return v;
  }

 private:
  BackendKind backend_;
  std::size_t n_;
#if MEMCUDA_HAS_CUDA()
  cudaStream_t stream_ = nullptr;
  std::uint16_t* pinned_ = nullptr;
#endif
};

// Writes touch_bits(i) into element 0 of tensor i (untimed).
void fill_all(BackendKind b, const std::vector<SharedTensor<void>>& ts) {
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const std::uint16_t v = touch_bits(i);
    if (b == BackendKind::host) {
      std::memcpy(ts[i].data(), &v, sizeof v);
      continue;
    }
#if MEMCUDA_HAS_CUDA()
    MEMCUDA_CUDA_TRY(cudaMemcpy(ts[i].data(), &v, sizeof v, cudaMemcpyHostToDevice));
#endif
  }
}

// The value of element 0 of tensor i once version v of the in-place row is
// published: changes with every version.
std::uint16_t update_bits(std::size_t i, std::uint64_t v) { return touch_bits(i + static_cast<std::size_t>(v)); }

std::size_t count_wrong(const std::vector<std::uint16_t>& v) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < v.size(); ++i) wrong += v[i] != touch_bits(i);
  return wrong + (kTensors - std::min(kTensors, v.size()));
}

// ---- devices -------------------------------------------------------------------------

bool cuda_usable(int device, std::string* why) {
#if MEMCUDA_HAS_CUDA()
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    return false;
  }
  if (device >= n) {
    *why = "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(n) + " visible)";
    return false;
  }
  return true;
#else
  (void)device;
  *why = "memcuda_bench_model was built without the CUDA backend (MEMCUDA_CUDA=OFF or no toolkit)";
  return false;
#endif
}

void init_device(BackendKind b, int device) {
#if MEMCUDA_HAS_CUDA()
  if (b != BackendKind::cuda) return;
  MEMCUDA_CUDA_TRY(cudaSetDevice(device));
  MEMCUDA_CUDA_TRY(cudaFree(nullptr));  // the context, before any clock
#else
  (void)b;
  (void)device;
#endif
}

double ms(std::int64_t ns) { return static_cast<double>(ns) / 1e6; }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// ---- output ------------------------------------------------------------------------

struct Rows {
  bool failed = false;
  bool skipped = false;

  void row(const std::string& name, std::vector<double> v, const std::string& extra = {}) {
    if (v.empty()) return skip(name, "no samples");
    std::sort(v.begin(), v.end());
    double med = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
    const std::string mode = g_per_tensor ? "calls=per_tensor" : "calls=batch";
    std::printf("row %s %.3f %.3f n=%zu %s%s%s\n", name.c_str(), med, v.front(), v.size(), mode.c_str(),
                extra.empty() ? "" : " ", extra.c_str());
    std::fflush(stdout);
    std::cerr << "  " << name << ": median " << mb::fmt(med, 3) << ", min " << mb::fmt(v.front(), 3) << " (n="
              << v.size() << ")\n";
  }
  void skip(const std::string& name, const std::string& why) {
    skipped = true;
    std::printf("skip %s %s\n", name.c_str(), why.c_str());
    std::fflush(stdout);
    std::cerr << "  skipped " << name << ": " << why << "\n";
  }
};

// ---- the child processes -------------------------------------------------------------

struct ChildArgs {
  std::string role, ns, prefix;
  BackendKind backend = BackendKind::host;
  int device = 0, scale = 1, updates = 0;

  explicit ChildArgs(const mb::Args& a) {
    updates = std::stoi(a.get_or("--updates", "0"));
    role = a.get_or("--child", "");
    ns = a.get_or("--ns", "");
    prefix = a.get_or("--prefix", "");
    backend = backend_from_string(a.get_or("--backend", "host")).value_or(BackendKind::host);
    device = std::stoi(a.get_or("--device", "0"));
    scale = std::stoi(a.get_or("--scale", "1"));
    g_per_tensor = a.has("--per-tensor");
  }
  RegistryOptions options() const {
    RegistryOptions o = RegistryOptions::from_env();
    o.redis = redis::options_from_env();  // the parent passes MEMCUDA_REDIS_URL
    o.name_space = ns;
    o.control_thread = false;  // a client: the parent is the allocator of record
    o.default_backend = backend;
    o.default_device = device;
    return o;
  }
};

void emit(const json::object& o) {
  std::string s = json::serialize(o) + "\n";
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

// Microseconds Redis has spent in EVALSHA since its start (INFO commandstats).
std::int64_t script_usec(redis::Connection& c) {
  const std::string info(c.command({"INFO", "commandstats"}).str());
  const auto at = info.find("cmdstat_evalsha:");
  if (at == std::string::npos) return 0;
  const auto u = info.find("usec=", at);
  return u == std::string::npos ? 0 : std::stoll(info.substr(u + 5));
}

// The whole dict through its state-dict record (one reference), in
// `specs` order; what open_fresh_dict measures.
std::vector<SharedTensor<void>> open_dict(TensorRegistry& reg, const std::string& prefix,
                                          const std::vector<ModelTensor>& specs) {
  auto sd = open_state_dict(reg, prefix + "/");
  std::vector<SharedTensor<void>> out;
  out.reserve(specs.size());
  for (const auto& s : specs) out.push_back(std::move(sd.at(s.name)));
  return out;
}

// A fresh consumer: everything but the opens made first, then the clock.
// `dict`: open_state_dict (through the record) instead of a batch get.
int child_open(const ChildArgs& c, bool dict) {
  const auto specs = state_dict_specs(c.scale);
  init_device(c.backend, c.device);
  TensorRegistry reg(c.options());
  Toucher toucher(c.backend, specs.size());
  // Untimed: the connection up and one round trip made, nothing mapped
  // (info reads the record only).
  reg.info(full_name(c.prefix, specs.front()));
  // Redis's own time in scripts during the open (INFO commandstats, read
  // untimed on a connection of its own): the part of open_ns that is the
  // server's, the rest is the round trip, the client's decoding and mapping.
  redis::Connection stats_conn(c.options().redis);
  const std::int64_t script_us0 = script_usec(stats_conn);
  const auto before = reg.stats().process;
  const auto t0 = mb::now_ns();
  auto ts = dict ? open_dict(reg, c.prefix, specs) : open_all(reg, c.prefix, specs);
  const auto t1 = mb::now_ns();
  auto values = toucher.touch(ts);
  const auto t2 = mb::now_ns();
  const auto after = reg.stats().process;
  emit({{"ns", t2 - t0},
        {"open_ns", t1 - t0},
        {"script_us", script_usec(stats_conn) - script_us0},
        {"wrong", count_wrong(values)},
        {"import_opens", after.import_opens - before.import_opens}});
  for (auto& t : ts) t.release();
  reg.flush();
  return 0;
}

// Another process publishes the state dict, then unpublishes it (untimed).
int child_publish(const ChildArgs& c) {
  const auto specs = state_dict_specs(c.scale);
  init_device(c.backend, c.device);
  TensorRegistry reg(c.options());
  {  // Untimed: connection, scripts and the command path warm.
    auto w = reg.create_any(c.prefix + "/warmup", DType::u8, {4096});
    reg.remove(w.name());
  }
  reg.flush();
  const auto t0 = mb::now_ns();
  auto ts = publish_all(reg, c.prefix, specs);
  const auto t1 = mb::now_ns();
  emit({{"ns", t1 - t0}});
  unpublish_all(reg, c.prefix, specs, ts);
  return 0;
}

// A consumer of the in-place row: holds the whole state dict, then for each
// of c.updates versions waits for it on its stream and reads: even updates
// one tensor (the row: observed and stream-ordered), odd ones element 0 of
// all 291 (read_all_ms). The two are separate publishes so that
// one consumer's 291 reads never queue in front of another's single read on
// the shared GPU (the row measures the update, not the consumers' reads).
int child_update(const ChildArgs& c) {
  const auto specs = state_dict_specs(c.scale);
  init_device(c.backend, c.device);
  TensorRegistry reg(c.options());
  Toucher toucher(c.backend, specs.size());
  auto ts = open_all(reg, c.prefix, specs);
  (void)toucher.touch(ts);  // untimed: every mapping and the copy path warm
  const std::vector<SharedTensor<void>> first{ts.front()};
  std::uint64_t seen = current_version(reg, c.prefix);
  emit({{"ready", seen}});
  for (int u = 0; u < c.updates; ++u) {
    auto v = wait_version(reg, c.prefix, seen, milliseconds(120000), toucher.stream());
    const auto t_wait = mb::now_ns();  // observed, and the stream ordered (host side)
    if (!v) throw std::runtime_error("no new version of '" + c.prefix + "' within 120 s");
    seen = *v;
    std::uint64_t wrong = 0;
    if (u % 2 == 1) {
      const auto all = toucher.touch(ts);
      const auto t_all = mb::now_ns();
      for (std::size_t i = 0; i < all.size(); ++i) wrong += all[i] != update_bits(i, seen);
      emit({{"version", seen}, {"wait_ns", t_wait}, {"done_ns", t_all}, {"wrong", wrong}});
    } else {
      const auto one = toucher.touch(first);  // ordered on the version, synchronised
      const auto t_one = mb::now_ns();
      wrong = one[0] != update_bits(0, seen);
      emit({{"version", seen}, {"wait_ns", t_wait}, {"done_ns", t_one}, {"wrong", wrong}});
    }
  }
  for (auto& t : ts) t.release();
  reg.flush();
  return 0;
}

int run_child(const mb::Args& args) {
  ChildArgs c(args);
  if (c.role == "update") return child_update(c);
  if (c.role == "open") return child_open(c, false);
  if (c.role == "open-dict") return child_open(c, true);
  if (c.role == "publish") return child_publish(c);
  std::cerr << "unknown child role '" << c.role << "'\n";
  return 2;
}

// ---- the parent: the allocator of record ----------------------------------------------

struct Config {
  BackendKind backend = BackendKind::host;
  int device = 0, scale = 1, reps = 5, warmup = 1;
  bool strict = false;  // a row skipped in a run that got going is a failure (the CTest smoke)
  int consumers = 8;    // of the in-place update row
};

class ModelBench {
 public:
  ModelBench(Config cfg, mb::RedisTarget& redis) : cfg_(cfg), redis_(redis), specs_(state_dict_specs(cfg.scale)) {
    bytes_ = check_specs(specs_, cfg.scale);
  }

  int run() {
    signal(SIGPIPE, SIG_IGN);
    const std::string b(to_string(cfg_.backend));
    std::cerr << "memcuda_bench_model: backend " << b << ", " << specs_.size() << " bf16 tensors, "
              << mb::fmt(static_cast<double>(bytes_) / 1e9, 3) << " GB (scale " << cfg_.scale << "), "
              << cfg_.reps << " reps after " << cfg_.warmup << " warm-up; Redis " << redis_.redacted() << "\n";
    init_device(cfg_.backend, cfg_.device);
    RegistryOptions o = RegistryOptions::from_env();
    o.redis = redis_.options();
    o.name_space = ns_;
    o.control_thread = true;
    o.default_backend = cfg_.backend;
    o.default_device = cfg_.device;
    TensorRegistry reg(o);
    if (!reg.is_leader()) throw std::runtime_error("this process did not become the allocator of record");
    for (int i = 0; i < 20; ++i) {  // untimed: scripts loaded, connection warm
      auto t = reg.create_any("warmup/" + std::to_string(i), DType::u8, {4096});
      reg.remove(t.name());
    }
    reg.flush();
    extra_ = "tensors=" + std::to_string(specs_.size()) + " bytes=" + std::to_string(bytes_) + " backend=" + b;

    publish_leader(reg);
    publish_other(reg);
    open_fresh(reg);
    inplace_update(reg);
    cleanup();
    if (rows_.failed) return 1;
    return cfg_.strict && rows_.skipped ? 1 : 0;
  }

 private:
  std::vector<std::string> child_argv(const std::string& role, const std::string& prefix) const {
    return {mb::self_exe().string(), "--child", role, "--ns", ns_, "--prefix", prefix,
            "--backend", std::string(to_string(cfg_.backend)), "--device", std::to_string(cfg_.device),
            "--scale", std::to_string(cfg_.scale), g_per_tensor ? "--per-tensor" : "--batch"};
  }

  // Runs a child to completion; its one JSON line, or nullopt (reported).
  std::optional<json::object> run_child(const std::string& role, const std::string& prefix) {
    mb::ChildProcess c(child_argv(role, prefix), {std::string(redis::kUrlEnv) + "=" + redis_.url()});
    c.close_stdin();
    std::string out = c.read_all(milliseconds(300000));
    if (!c.eof()) c.kill();
    int rc = c.wait();
    if (rc != 0) {
      std::cerr << "  child '" << role << "' failed (exit " << rc << ")\n";
      return std::nullopt;
    }
    try {
      return json::parse(out).as_object();
    } catch (const std::exception& e) {
      std::cerr << "  child '" << role << "' output is not JSON: " << e.what() << "\n";
      return std::nullopt;
    }
  }

  // (in use, reserved) bytes of this backend's pools, as the leader sees them.
  std::pair<std::uint64_t, std::uint64_t> pool_bytes(TensorRegistry& reg) const {
    std::uint64_t in_use = 0, reserved = 0;
    for (const auto& p : reg.stats().pools)
      if (p.backend == cfg_.backend) {
        in_use += p.in_use;
        reserved += p.reserved;
      }
    return {in_use, reserved};
  }

  // Empty slabs back to the driver / the OS, so the next publish starts
  // from scratch: first wait (up to 10 s) until the previous state dict's
  // frees have landed, then trim. What stays reserved is reported with the
  // row (reserved_at_start), so a run that did not start from scratch says so.
  void trim(TensorRegistry& reg) {
    reg.flush();
    const auto deadline = mb::Clock::now() + std::chrono::seconds(10);
    while (pool_bytes(reg).first > 0 && mb::Clock::now() < deadline)
      std::this_thread::sleep_for(milliseconds(20));
    reg.trim();
    reserved_at_start_ = std::max(reserved_at_start_, pool_bytes(reg).second);
  }

  void publish_leader(TensorRegistry& reg) {
    std::cerr << "-- published by the allocator of record\n";
    std::vector<double> v;
    reserved_at_start_ = 0;
    for (int rep = 0; rep < cfg_.warmup + cfg_.reps; ++rep) {
      trim(reg);
      const std::string prefix = "leader/" + std::to_string(rep);
      const auto t0 = mb::now_ns();
      auto ts = publish_all(reg, prefix, specs_);
      const auto t1 = mb::now_ns();
      unpublish_all(reg, prefix, specs_, ts);
      if (rep >= cfg_.warmup) v.push_back(ms(t1 - t0));
    }
    rows_.row("memcuda_publish_leader", v, extra_ + " reserved_at_start=" + std::to_string(reserved_at_start_));
  }

  void publish_other(TensorRegistry& reg) {
    std::cerr << "-- published by another process\n";
    std::vector<double> v;
    reserved_at_start_ = 0;
    for (int rep = 0; rep < cfg_.warmup + cfg_.reps; ++rep) {
      trim(reg);
      auto out = run_child("publish", "other/" + std::to_string(rep));
      if (!out) {
        rows_.failed = true;
        return rows_.skip("memcuda_publish_other", "the publishing child failed (see stderr)");
      }
      if (rep >= cfg_.warmup) v.push_back(ms(out->at("ns").to_number<std::int64_t>()));
    }
    rows_.row("memcuda_publish_other", v, extra_ + " reserved_at_start=" + std::to_string(reserved_at_start_));
  }

  void open_fresh(TensorRegistry& reg) {
    std::cerr << "-- opened by a fresh consumer process\n";
    trim(reg);
    const std::string prefix = "model";
    auto model = publish_all(reg, prefix, specs_);
    fill_all(cfg_.backend, model);
    fresh_rows(prefix, "open", "memcuda_open_fresh");
    if (!g_per_tensor) {
      // The same dict with a state-dict record linked over it: each fresh
      // consumer takes one reference for the whole dict.
      if (link_state_dict(reg, prefix + "/", model)) fresh_rows(prefix, "open-dict", "memcuda_open_fresh_dict");
      else rows_.skip("memcuda_open_fresh_dict", "the state-dict record was not linked");
    }
    pool_ratio(reg);
    unpublish_all(reg, prefix, specs_, model);
  }

  void fresh_rows(const std::string& prefix, const std::string& role, const std::string& row) {
    std::vector<double> v, open_only, script;
    std::int64_t opens = -1;
    std::uint64_t wrong = 0;
    for (int rep = 0; rep < cfg_.warmup + cfg_.reps; ++rep) {
      auto out = run_child(role, prefix);
      if (!out) {
        rows_.failed = true;
        rows_.skip(row, "the consumer child failed (see stderr)");
        break;
      }
      wrong += out->at("wrong").to_number<std::uint64_t>();
      opens = out->at("import_opens").to_number<std::int64_t>();
      if (rep >= cfg_.warmup) {
        v.push_back(ms(out->at("ns").to_number<std::int64_t>()));
        open_only.push_back(ms(out->at("open_ns").to_number<std::int64_t>()));
        script.push_back(out->at("script_us").to_number<double>() / 1000.0);
      }
    }
    if (wrong) {
      std::cerr << "  consumers read " << wrong << " wrong value(s)\n";
      rows_.failed = true;
    }
    if (!v.empty()) {
      std::sort(open_only.begin(), open_only.end());
      std::sort(script.begin(), script.end());
      rows_.row(row, v,
                extra_ + " open_ms=" + mb::fmt(open_only[open_only.size() / 2], 3) +
                    " redis_script_ms=" + mb::fmt(script[script.size() / 2], 3) +
                    " import_opens=" + std::to_string(opens) + " wrong=" + std::to_string(wrong));
    }
  }

  // With the model live, after the publish runs' churn.
  void pool_ratio(TensorRegistry& reg) {
    std::uint64_t in_use = 0, reserved = 0, slabs = 0;
    for (const auto& p : reg.stats().pools)
      if (p.backend == cfg_.backend) {
        in_use += p.in_use;
        reserved += p.reserved;
        slabs += p.slabs;
      }
    if (in_use == 0) return rows_.skip("memcuda_pool_ratio", "stats().pools reports nothing in use");
    const double r = static_cast<double>(reserved) / static_cast<double>(in_use);
    rows_.row("memcuda_pool_ratio", {r},
              "unit=ratio in_use=" + std::to_string(in_use) + " reserved=" + std::to_string(reserved) +
                  " slabs=" + std::to_string(slabs) + " " + extra_);
  }

  // Writes update_bits(i, v) into element 0 of every tensor, on `stream`
  // (cuda: from pinned memory), and waits for it: untimed.
  void write_version(const std::vector<SharedTensor<void>>& ts, std::uint64_t v, StreamHandle stream,
                     std::uint16_t* pinned) {
    for (std::size_t i = 0; i < ts.size(); ++i) {
      const std::uint16_t x = update_bits(i, v);
      if (cfg_.backend == BackendKind::host) {
        std::memcpy(ts[i].data(), &x, sizeof x);
        continue;
      }
#if MEMCUDA_HAS_CUDA()
      pinned[i] = x;
      MEMCUDA_CUDA_TRY(cudaMemcpyAsync(ts[i].data(), pinned + i, sizeof x, cudaMemcpyHostToDevice, stream));
#else
      (void)stream;
      (void)pinned;
#endif
    }
#if MEMCUDA_HAS_CUDA()
    if (cfg_.backend == BackendKind::cuda) MEMCUDA_CUDA_TRY(cudaStreamSynchronize(stream));
#endif
  }

  void inplace_update(TensorRegistry& reg) {
    const std::string row = "memcuda_inplace_update";
    std::cerr << "-- in-place update observed by " << cfg_.consumers << " consumers\n";
    trim(reg);
    const std::string prefix = "inplace";
    auto model = publish_all(reg, prefix, specs_);
    fill_all(cfg_.backend, model);
    StreamHandle stream = nullptr;
    std::uint16_t* pinned = nullptr;
#if MEMCUDA_HAS_CUDA()
    if (cfg_.backend == BackendKind::cuda) {
      MEMCUDA_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      MEMCUDA_CUDA_TRY(cudaMallocHost(reinterpret_cast<void**>(&pinned), specs_.size() * sizeof(std::uint16_t)));
    }
#endif
    // Each repetition publishes twice: read one tensor (the row), then all
    // (read_all_ms); see child_update.
    const int updates = 2 * (cfg_.warmup + cfg_.reps);
    std::vector<std::unique_ptr<mb::ChildProcess>> cs;
    std::vector<double> v, all_v, pub_v, wake_v;
    std::uint64_t wrong = 0;
    bool ok = true;
    try {
      for (int i = 0; i < cfg_.consumers; ++i) {
        auto argv = child_argv("update", prefix);
        argv.push_back("--updates");
        argv.push_back(std::to_string(updates));
        cs.push_back(std::make_unique<mb::ChildProcess>(argv, std::vector<std::string>{std::string(redis::kUrlEnv) +
                                                                                       "=" + redis_.url()}));
      }
      for (auto& c : cs) {  // every consumer holds the model and waits
        auto l = c->read_line(milliseconds(300000));
        if (!l || l->find("ready") == std::string::npos) throw std::runtime_error("a consumer did not get ready");
      }
      std::uint64_t version = current_version(reg, prefix);
      for (int u = 0; u < updates; ++u) {
        const bool all = u % 2 == 1;
        write_version(model, version + 1, stream, pinned);
        const auto t0 = mb::now_ns();
        version = publish_version(reg, prefix, stream);
        const auto t_pub = mb::now_ns();
        std::int64_t last_wait = 0, last_done = 0;
        for (auto& c : cs) {
          auto l = c->read_line(milliseconds(120000));
          if (!l) throw std::runtime_error("a consumer did not observe version " + std::to_string(version));
          auto o = json::parse(*l).as_object();
          if (o.at("version").to_number<std::uint64_t>() != version)
            throw std::runtime_error("a consumer observed version " + json::serialize(o.at("version")) +
                                     ", expected " + std::to_string(version));
          last_wait = std::max(last_wait, o.at("wait_ns").to_number<std::int64_t>());
          last_done = std::max(last_done, o.at("done_ns").to_number<std::int64_t>());
          wrong += o.at("wrong").to_number<std::uint64_t>();
        }
        if (u / 2 < cfg_.warmup) continue;
        if (all) {
          all_v.push_back(ms(last_done - t0));
        } else {
          v.push_back(ms(last_done - t0));
          pub_v.push_back(ms(t_pub - t0));
          wake_v.push_back(ms(last_wait - t0));
        }
      }
      for (auto& c : cs)
        if (c->wait() != 0) throw std::runtime_error("a consumer exited with an error (see stderr)");
    } catch (const std::exception& e) {
      std::cerr << "  " << row << ": " << e.what() << "\n";
      ok = false;
    }
    cs.clear();  // kills what is left
#if MEMCUDA_HAS_CUDA()
    if (pinned) cudaFreeHost(pinned);
    if (stream) cudaStreamDestroy(stream);
#endif
    unpublish_all(reg, prefix, specs_, model);
    if (wrong) {
      std::cerr << "  consumers read " << wrong << " wrong value(s) after the version\n";
      rows_.failed = true;
    }
    if (!ok || v.empty()) {
      rows_.failed = true;
      return rows_.skip(row, "a consumer failed (see stderr)");
    }
    // The phases of the row (medians): publish_ms, the trainer's
    // publish_version call (event record + one script); wait_ms, until the
    // last consumer's wait_version returned (woken, stream ordered); the rest
    // of the row is that consumer's read on the ordered stream.
    rows_.row(row, v,
              extra_ + " consumers=" + std::to_string(cfg_.consumers) + " publish_ms=" + mb::fmt(median(pub_v), 3) +
                  " wait_ms=" + mb::fmt(median(wake_v), 3) + " read_all_ms=" + mb::fmt(median(all_v), 3) +
                  " wrong=" + std::to_string(wrong));
  }

  void cleanup() {
    if (redis_.is_private()) return;
    try {
      redis::Connection c(redis_.options());
      mb::delete_namespace(c, ns_);
    } catch (const std::exception& e) {
      std::cerr << "cleanup: " << e.what() << "\n";
    }
  }

  Config cfg_;
  mb::RedisTarget& redis_;
  std::vector<ModelTensor> specs_;
  std::uint64_t bytes_ = 0;
  std::string ns_ = "mcbm-" + std::to_string(::getpid());
  std::string extra_;
  std::uint64_t reserved_at_start_ = 0;  // the most a publish run found still reserved
  Rows rows_;
};

const char* kRowNames[] = {"memcuda_publish_leader", "memcuda_publish_other", "memcuda_open_fresh",
                           "memcuda_open_fresh_dict", "memcuda_pool_ratio", "memcuda_inplace_update"};

int skip_all(const std::string& why) {
  Rows r;
  for (const char* n : kRowNames) r.skip(n, why);
  return kSkip;
}

void usage() {
  std::cout << "usage: memcuda_bench_model [--backend auto|host|cuda] [--small | --scale N] [--reps 5]\n"
               "                           [--warmup 1] [--device N] [--url URL] [--redis-server PATH] [--strict] [--per-tensor]\n"
               "                           [--consumers 8]\n"
               "Rows of a Llama-2-7B-shaped bf16 state dict (291 tensors): published by the allocator\n"
               "of record, published by another process, opened by a fresh consumer, pool ratio,\n"
               "in-place update (a new version observed and stream-ordered by --consumers processes).\n"
               "Exit 77 (with `skip` lines) when it cannot run here.\n";
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
    Config cfg;
    cfg.device = std::stoi(args.get_or("--device", "0"));
    cfg.reps = std::max(1, std::stoi(args.get_or("--reps", "5")));
    cfg.warmup = std::max(0, std::stoi(args.get_or("--warmup", "1")));
    cfg.strict = args.has("--strict");
    g_per_tensor = args.has("--per-tensor");
    cfg.consumers = std::max(1, std::stoi(args.get_or("--consumers", "8")));
    const std::string backend = args.get_or("--backend", "auto");
    std::string why;
    if (backend == "auto") {
      cfg.backend = cuda_usable(cfg.device, &why) ? BackendKind::cuda : BackendKind::host;
      if (cfg.backend == BackendKind::host) std::cerr << "memcuda_bench_model: host backend (" << why << ")\n";
    } else if (auto b = backend_from_string(backend)) {
      cfg.backend = *b;
      if (cfg.backend == BackendKind::cuda && !cuda_usable(cfg.device, &why)) return skip_all(why);
    } else {
      throw std::invalid_argument("--backend must be auto, host or cuda");
    }
    if (auto s = args.get("--scale")) cfg.scale = std::stoi(*s);
    else if (args.has("--small")) cfg.scale = kSmallScale;
    else cfg.scale = cfg.backend == BackendKind::host ? 8 : 1;
    if (cfg.scale < 1) throw std::invalid_argument("--scale must be >= 1");

    if (cfg.backend == BackendKind::host) {
      // A host tensor is a committed /dev/shm slab; the run holds at most
      // two copies of the state dict at once (a trimmed one may linger).
      const std::uint64_t need = check_specs(state_dict_specs(cfg.scale), cfg.scale) * 3;
      struct statvfs v {};
      if (::statvfs("/dev/shm", &v) == 0 && static_cast<std::uint64_t>(v.f_bavail) * v.f_frsize < need)
        return skip_all("/dev/shm has " + mb::format_size(static_cast<std::uint64_t>(v.f_bavail) * v.f_frsize) +
                        " free, the host run needs about " + std::to_string(need >> 20) +
                        " MiB: pass a larger --scale");
    }
    if (!args.get("--url") && !std::getenv(redis::kUrlEnv) && !args.get("--redis-server") &&
        mb::find_on_path("redis-server").empty())
      return skip_all("no Redis: redis-server is not on PATH and neither --url nor MEMCUDA_REDIS_URL is set");
    mb::RedisTarget redis(args);
    ModelBench bench(cfg, redis);
    return bench.run();
  } catch (const std::exception& e) {
    std::cerr << "memcuda_bench_model" << (args.get("--child") ? " (child " + *args.get("--child") + ")" : "")
              << ": " << e.what() << "\n";
    return 1;
  }
}
