// bench_bandwidth: does a kernel read a tensor as fast through a mem-cuda
// (CUDA IPC) mapping as from memory its own process allocated?
//
//   bench_bandwidth [--sizes 256MiB,1GiB] [--reps 50] [--device N]
//                   [--url URL] [--json FILE] [--quick]
//
// This process is the allocator of record: it creates each tensor on the
// cuda backend and fills it with non-zero data. A child (this binary
// re-executed) opens the tensor by name, copies it into a cudaMalloc of its
// own, and times the same reduction kernel (float4 loads, grid-stride, a
// full chip of blocks) on both, alternating, cudaEvents around each launch;
// it reports the median of --reps and checks both sums against a float64
// reference computed on the host. Also reports a device-to-device copy
// (bytes read + written) as the bandwidth ceiling. Exits 0 with a message
// where there is no CUDA device.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "bench_common.hpp"
#include "bench_kernels.cuh"
#include "memcuda/memcuda.hpp"

namespace {

using namespace memcuda;
namespace mb = memcuda::bench;
namespace json = boost::json;
using mb::blocks_for;
using mb::fill_kernel;
using mb::reduce_kernel;

#define BENCH_CUDA(call) MEMCUDA_CUDA_TRY(call)

bool cuda_device(int device, std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    return false;
  }
  if (device >= n) {
    *why = "no CUDA device " + std::to_string(device) + " (" + std::to_string(n) + " visible)";
    return false;
  }
  return true;
}

std::string tensor_name(std::uint64_t size) { return "bandwidth/" + std::to_string(size); }

// ---- child: the importer ----

struct Timing {
  std::vector<float> imported_ms, local_ms, copy_ms;
};

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.f : v[v.size() / 2];
}

int child(const mb::Args& args) {
  const int device = std::stoi(args.get_or("--device", "0"));
  const int reps = std::stoi(args.get_or("--reps", "50"));
  const auto sizes = mb::parse_size_list(args.get_or("--sizes", "256MiB"));
  BENCH_CUDA(cudaSetDevice(device));
  BENCH_CUDA(cudaFree(nullptr));
  RegistryOptions o = RegistryOptions::from_env();
  o.redis = redis::options_from_env();
  o.name_space = args.get_or("--ns", "");
  o.control_thread = false;
  o.default_backend = BackendKind::cuda;
  o.default_device = device;
  TensorRegistry reg(o);
  const int blocks = blocks_for(device);
  cudaStream_t s;
  BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  BENCH_CUDA(cudaEventCreate(&e0));
  BENCH_CUDA(cudaEventCreate(&e1));
  double* d_out = nullptr;
  BENCH_CUDA(cudaMalloc(&d_out, sizeof(double)));
  json::array results;
  for (auto size : sizes) {
    auto t = reg.get<float>(tensor_name(size));
    if (t.device() != device) throw std::runtime_error("tensor on another device");
    const float* imported = t.data();
    const std::uint64_t n = t.size(), n4 = n / 4;
    float* local = nullptr;
    float* scratch = nullptr;
    BENCH_CUDA(cudaMalloc(&local, size));
    BENCH_CUDA(cudaMalloc(&scratch, size));
    BENCH_CUDA(cudaMemcpy(local, imported, size, cudaMemcpyDeviceToDevice));

    // float64 reference on the host, from the imported bytes.
    std::vector<float> host(n);
    BENCH_CUDA(cudaMemcpy(host.data(), imported, size, cudaMemcpyDeviceToHost));
    double ref = 0;
    for (float v : host) ref += v;
    host.clear();
    host.shrink_to_fit();

    auto run = [&](const float* p, std::vector<float>* ms, double* sum) {
      // A launch that adds nothing leaves 0, which the reference check rejects.
      BENCH_CUDA(cudaMemsetAsync(d_out, 0, sizeof(double), s));
      BENCH_CUDA(cudaEventRecord(e0, s));
      reduce_kernel<<<blocks, 256, 0, s>>>(reinterpret_cast<const float4*>(p), n4, d_out);
      BENCH_CUDA(cudaGetLastError());
      BENCH_CUDA(cudaEventRecord(e1, s));
      BENCH_CUDA(cudaEventSynchronize(e1));
      float elapsed = 0;
      BENCH_CUDA(cudaEventElapsedTime(&elapsed, e0, e1));
      if (ms) ms->push_back(elapsed);
      if (sum) BENCH_CUDA(cudaMemcpy(sum, d_out, sizeof(double), cudaMemcpyDeviceToHost));
    };
    auto copy = [&](std::vector<float>* ms) {
      BENCH_CUDA(cudaEventRecord(e0, s));
      BENCH_CUDA(cudaMemcpyAsync(scratch, local, size, cudaMemcpyDeviceToDevice, s));
      BENCH_CUDA(cudaEventRecord(e1, s));
      BENCH_CUDA(cudaEventSynchronize(e1));
      float elapsed = 0;
      BENCH_CUDA(cudaEventElapsedTime(&elapsed, e0, e1));
      if (ms) ms->push_back(elapsed);
    };
    for (int i = 0; i < 3; ++i) {
      run(imported, nullptr, nullptr);
      run(local, nullptr, nullptr);
      copy(nullptr);
    }
    Timing tm;
    for (int r = 0; r < reps; ++r) {
      // Alternate the order so neither side always runs after the other.
      if (r % 2 == 0) {
        run(imported, &tm.imported_ms, nullptr);
        run(local, &tm.local_ms, nullptr);
      } else {
        run(local, &tm.local_ms, nullptr);
        run(imported, &tm.imported_ms, nullptr);
      }
      copy(&tm.copy_ms);
    }
    double sum_imported = 0, sum_local = 0;
    run(imported, nullptr, &sum_imported);
    run(local, nullptr, &sum_local);
    auto rel = [&](double x) { return std::abs(x - ref) / std::abs(ref); };
    const bool ok = rel(sum_imported) < 1e-4 && rel(sum_local) < 1e-4;
    if (!ok)
      std::cerr << "bench_bandwidth: WRONG SUM at " << mb::format_size(size) << ": reference " << ref
                << ", imported " << sum_imported << ", local " << sum_local << "\n";
    const double mi = median(tm.imported_ms), ml = median(tm.local_ms), mc = median(tm.copy_ms);
    const double gb_i = static_cast<double>(size) / (mi * 1e-3) / 1e9;
    const double gb_l = static_cast<double>(size) / (ml * 1e-3) / 1e9;
    const double gb_c = 2.0 * static_cast<double>(size) / (mc * 1e-3) / 1e9;
    auto spread = [](std::vector<float> v) {
      std::sort(v.begin(), v.end());
      return json::array{v.front(), v[v.size() / 10], v[v.size() / 2], v[v.size() * 9 / 10], v.back()};
    };
    results.push_back(json::object{{"size", size},
                                   {"reps", reps},
                                   {"blocks", blocks},
                                   {"threads", 256},
                                   {"imported_ms_median", mi},
                                   {"local_ms_median", ml},
                                   {"imported_gbps", gb_i},
                                   {"local_gbps", gb_l},
                                   {"ratio", gb_i / gb_l},
                                   {"copy_gbps_read_plus_write", gb_c},
                                   {"imported_ms_min_p10_p50_p90_max", spread(tm.imported_ms)},
                                   {"local_ms_min_p10_p50_p90_max", spread(tm.local_ms)},
                                   {"reference_sum", ref},
                                   {"imported_rel_err", rel(sum_imported)},
                                   {"local_rel_err", rel(sum_local)},
                                   {"correct", ok}});
    BENCH_CUDA(cudaFree(local));
    BENCH_CUDA(cudaFree(scratch));
    if (!ok) return 4;
  }
  std::string out = json::serialize(json::object{{"results", results}}) + "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

// ---- parent: the allocator of record ----

int parent(const mb::Args& args) {
  const int device = std::stoi(args.get_or("--device", "0"));
  const bool quick = args.has("--quick");
  const std::string sizes_arg = args.get_or("--sizes", quick ? "64MiB" : "256MiB,1GiB");
  const std::string reps = args.get_or("--reps", quick ? "5" : "50");
  const auto sizes = mb::parse_size_list(sizes_arg);
  const auto json_path = args.get("--json");

  std::string why;
  if (!cuda_device(device, &why)) {
    std::cerr << "bench_bandwidth: skipped: " << why << "\n";
    if (json_path) mb::write_file(*json_path, json::serialize(json::object{{"skipped", why}}) + "\n");
    return 0;
  }
  for (auto s : sizes)
    if (s % 16 != 0) throw std::invalid_argument("sizes must be multiples of 16 bytes (float4 loads)");
  signal(SIGPIPE, SIG_IGN);
  mb::RedisTarget redis(args);
  BENCH_CUDA(cudaSetDevice(device));
  RegistryOptions o = RegistryOptions::from_env();
  o.redis = redis.options();
  o.name_space = "mcbw-" + std::to_string(::getpid());
  o.default_backend = BackendKind::cuda;
  o.default_device = device;
  TensorRegistry reg(o);
  std::vector<SharedTensor<float>> tensors;
  std::uint32_t seed = 12345;
  for (auto size : sizes) {
    auto t = reg.create<float>(tensor_name(size), {static_cast<std::int64_t>(size / 4)});
    fill_kernel<<<blocks_for(device), 256>>>(t.data(), t.size(), seed++);
    BENCH_CUDA(cudaGetLastError());
    tensors.push_back(std::move(t));
  }
  BENCH_CUDA(cudaDeviceSynchronize());

  std::cerr << "bench_bandwidth: " << sizes_arg << ", " << reps << " repetitions, importer in a child process\n";
  mb::ChildProcess c({mb::self_exe().string(), "--child", "--ns", o.name_space, "--device", std::to_string(device),
                      "--sizes", sizes_arg, "--reps", reps},
                     {std::string(redis::kUrlEnv) + "=" + redis.url()});
  c.close_stdin();
  std::string out = c.read_all(std::chrono::minutes(5));
  if (!c.eof()) c.kill();
  int rc = c.wait();
  for (auto& t : tensors) {
    reg.remove(t.name());
    t.release();
  }
  if (rc != 0) {
    std::cerr << "bench_bandwidth: the importer failed (exit " << rc << ")\n";
    return 1;
  }
  auto doc = json::parse(out).as_object();
  cudaDeviceProp p{};
  BENCH_CUDA(cudaGetDeviceProperties(&p, device));
  doc["tool"] = "bench_bandwidth";
  doc["gpu"] = p.name;
  doc["date"] = mb::utc_now_iso();

  mb::Table t({"size", "local GB/s", "imported GB/s", "imported / local", "D2D copy GB/s (r+w)", "sums"}, "lrrrrl");
  for (const auto& r : doc.at("results").as_array()) {
    const auto& x = r.as_object();
    t.add({mb::format_size(x.at("size").to_number<std::uint64_t>()), mb::fmt(x.at("local_gbps").to_number<double>(), 1),
           mb::fmt(x.at("imported_gbps").to_number<double>(), 1),
           mb::fmt(x.at("ratio").to_number<double>() * 100, 1) + "%",
           mb::fmt(x.at("copy_gbps_read_plus_write").to_number<double>(), 1),
           x.at("correct").as_bool() ? "match float64" : "WRONG"});
  }
  std::cout << "### Read bandwidth, imported mapping vs local allocation (" << p.name << ")\n\n"
            << t.str() << "\nMedian of " << reps
            << " launches each (cudaEvents), reduction kernel with float4 loads, " << blocks_for(device)
            << " blocks of 256 threads.\n";
  if (json_path) mb::write_file(*json_path, json::serialize(doc) + "\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return mb::parent_or_child(argc, argv, "bench_bandwidth", "importer", child, parent); }
