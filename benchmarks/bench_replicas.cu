// bench_replicas: the rows of replicas on every GPU of a node, for the
// Llama-2-7B-shaped bf16 state dict (bench_llama.hpp: 291 tensors, 13.5 GB)
// published on the source GPU by this process, the allocator of record:
//
//   floor          cudaMemcpyPeerAsync of all 291 tensors to the first target
//                  (the single-link floor: one link's rate, one copy)
//   naive          the same to every target at once, each pulling from the
//                  source (the source's link shared by all)
//   replicate      memcuda::replicate of the prefix to every target, timed
//                  until a reader's stream on each target has waited for its
//                  copy (get with LocalReplica::use and a stream, then a
//                  stream synchronisation); the replicas dropped in between
//   nccl_*         torch.distributed NCCL broadcast of the same tensors, one
//                  process per GPU (baselines/torch_nccl_broadcast.py): per
//                  tensor, and as one flat buffer
//   get_same / get_replica  a FRESH process gets the 291 by name: on the
//                  source's device (the tensors), on a target (its replicas)
//   read_peer / read_local  a reduction kernel on a target reading lm_head
//                  through the peer mapping, against its local replica; then
//                  every replica's sum checked against its source's
//   shard_open / whole_copy  a FRESH process opens TP rank 1 of 4 of every
//                  tensor (dimension 0) as zero-copy views, against opening
//                  each whole and copying the shard into its own memory
//
//   bench_replicas [--source 0] [--devices 1,2,3] [--scale N | --small] [--reps 5]
//                  [--warmup 1] [--url URL] [--json FILE] [--python PY] [--no-nccl]
//
// Exit 0 (printing why) where there are fewer than two GPUs; 1 when a value
// read back is wrong or a step failed.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "bench_common.hpp"
#include "bench_kernels.cuh"
#include "bench_llama.hpp"
#include "memcuda/memcuda.hpp"
#include "memcuda/replicas.hpp"
#include "memcuda/state_dict.hpp"

namespace {

using namespace memcuda;
namespace mb = memcuda::bench;
namespace json = boost::json;
using Ms = std::vector<double>;

#define BENCH_CUDA(call) MEMCUDA_CUDA_TRY(call)

constexpr const char* kPrefix = "llm/";

double ms_since(std::int64_t t0) { return static_cast<double>(mb::now_ns() - t0) / 1e6; }
double median(Ms v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
double minimum(const Ms& v) { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }
json::array to_json(const Ms& v) { return json::array(v.begin(), v.end()); }

int scale_of(const mb::Args& a) { return a.has("--small") ? 64 : std::stoi(a.get_or("--scale", "1")); }
std::vector<mb::ModelTensor> specs_of(const mb::Args& a) { return mb::state_dict_specs(scale_of(a)); }

TensorRegistry open_registry(const std::string& ns, int device, bool control) {
  RegistryOptions o = RegistryOptions::from_env();
  o.redis = redis::options_from_env();
  o.name_space = ns;
  o.control_thread = control;
  o.default_backend = BackendKind::cuda;
  o.default_device = device;
  return TensorRegistry(o);
}

void enable_peer(int a, int b) {
  int ok = 0;
  BENCH_CUDA(cudaDeviceCanAccessPeer(&ok, a, b));
  if (!ok) return;
  BENCH_CUDA(cudaSetDevice(a));
  if (cudaDeviceEnablePeerAccess(b, 0) != cudaSuccess) cudaGetLastError();  // already enabled
}

// Sum of a tensor's first bytes/16 float4s (the fill wrote floats in [0, 1)).
class Summer {
 public:
  explicit Summer(int device) : device_(device), blocks_(mb::blocks_for(device)) {
    BENCH_CUDA(cudaSetDevice(device));
    BENCH_CUDA(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
    BENCH_CUDA(cudaEventCreate(&e0_));
    BENCH_CUDA(cudaEventCreate(&e1_));
    BENCH_CUDA(cudaMalloc(&out_, sizeof(double)));
  }
  // Kernel time in ms; *sum the result.
  float run(const void* p, std::uint64_t bytes, double* sum) {
    BENCH_CUDA(cudaSetDevice(device_));
    BENCH_CUDA(cudaMemsetAsync(out_, 0, sizeof(double), s_));
    BENCH_CUDA(cudaEventRecord(e0_, s_));
    mb::reduce_kernel<<<blocks_, 256, 0, s_>>>(static_cast<const float4*>(p), bytes / 16, out_);
    BENCH_CUDA(cudaGetLastError());
    BENCH_CUDA(cudaEventRecord(e1_, s_));
    BENCH_CUDA(cudaMemcpyAsync(sum, out_, sizeof(double), cudaMemcpyDeviceToHost, s_));
    BENCH_CUDA(cudaStreamSynchronize(s_));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, e0_, e1_));
    return ms;
  }

 private:
  int device_, blocks_;
  cudaStream_t s_{};
  cudaEvent_t e0_{}, e1_{};
  double* out_ = nullptr;
};

// ---- children: fresh processes on one device ------------------------------------

json::object child_get(const mb::Args& a, int device, bool replica) {
  auto reg = open_registry(a.get_or("--ns", ""), device, false);
  GetOptions g;
  if (replica) {
    g.replica = LocalReplica::use;
    g.reader_device = device;
  }
  std::vector<SharedTensor<void>> held;
  const auto t0 = mb::now_ns();
  for (const auto& s : specs_of(a)) held.push_back(reg.get<void>(kPrefix + s.name, g));
  const double ms = ms_since(t0);
  std::size_t wrong = 0;  // a replica get must give the device's replica
  for (const auto& t : held) wrong += t.device() != device || (replica && t.info().replica_of.empty());
  return {{"ms", ms}, {"wrong", wrong}, {"import_opens", reg.stats().process.import_opens}};
}

json::object child_shard(const mb::Args& a, int device, bool sliced) {
  auto reg = open_registry(a.get_or("--ns", ""), device, false);
  BENCH_CUDA(cudaSetDevice(device));
  cudaStream_t s;
  BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const auto specs = specs_of(a);
  std::uint64_t shard_bytes = 0;
  for (const auto& x : specs) shard_bytes += x.elements * 2 / 4;
  void* mine = nullptr;
  BENCH_CUDA(cudaMalloc(&mine, shard_bytes));
  std::size_t wrong = 0;
  const auto t0 = mb::now_ns();
  if (sliced) {
    ShardRules r{.rank = 1, .world = 4, .rules = {{"*", 0}}};
    auto d = open_state_dict(reg, kPrefix, r);
    for (const auto& x : specs) wrong += d.at(x.name).bytes() != x.elements * 2 / 4;
  } else {
    auto d = open_state_dict(reg, kPrefix);
    auto* p = static_cast<char*>(mine);
    for (const auto& x : specs) {
      const auto& t = d.at(x.name);
      const std::uint64_t b = t.bytes() / 4;
      BENCH_CUDA(cudaMemcpyAsync(p, static_cast<const char*>(t.data()) + b, b, cudaMemcpyDeviceToDevice, s));
      p += b;
    }
    BENCH_CUDA(cudaStreamSynchronize(s));
  }
  const double ms = ms_since(t0);
  BENCH_CUDA(cudaFree(mine));
  return {{"ms", ms}, {"wrong", wrong}};
}

json::object child_read(const mb::Args& a, int device, int reps) {
  auto reg = open_registry(a.get_or("--ns", ""), device, false);
  GetOptions local;
  local.replica = LocalReplica::use;
  local.reader_device = device;
  Summer sum(device);
  const std::string big = std::string(kPrefix) + "lm_head.weight";
  auto peer = reg.get<void>(big);
  peer.check_device(device);  // a peer mapping that this device reaches
  auto mine = reg.get<void>(big, local);
  Ms peer_ms, local_ms;
  double s1 = 0, s2 = 0;
  for (int r = 0; r < reps + 2; ++r) {
    const bool first_peer = r % 2 == 0;  // alternate which runs first
    float a1 = sum.run(first_peer ? peer.data() : mine.data(), peer.bytes(), &s1);
    float a2 = sum.run(first_peer ? mine.data() : peer.data(), peer.bytes(), &s2);
    if (r < 2) continue;
    peer_ms.push_back(first_peer ? a1 : a2);
    local_ms.push_back(first_peer ? a2 : a1);
  }
  // Every replica against its source, through the peer mapping.
  std::size_t wrong = 0;
  for (const auto& x : specs_of(a)) {
    auto src = reg.get<void>(kPrefix + x.name);
    auto rep = reg.get<void>(kPrefix + x.name, local);
    double u = 0, v = 0;
    sum.run(src.data(), src.bytes(), &u);
    sum.run(rep.data(), rep.bytes(), &v);
    wrong += rep.info().replica_of.empty() || !(std::abs(u - v) <= 1e-6 * std::abs(u)) || u == 0;
  }
  return {{"bytes", peer.bytes()}, {"peer_ms", to_json(peer_ms)}, {"local_ms", to_json(local_ms)},
          {"wrong", wrong}};
}

int child(const mb::Args& a) {
  const int device = std::stoi(a.get_or("--device", "0"));
  const std::string mode = a.get_or("--child", "");
  BENCH_CUDA(cudaSetDevice(device));
  BENCH_CUDA(cudaFree(nullptr));  // the context, before any clock
  json::object r;
  if (mode == "get_same" || mode == "get_replica") r = child_get(a, device, mode == "get_replica");
  else if (mode == "shard_open" || mode == "whole_copy") r = child_shard(a, device, mode == "shard_open");
  else if (mode == "read") r = child_read(a, device, std::stoi(a.get_or("--reps", "5")) * 4);
  else throw std::invalid_argument("unknown child mode " + mode);
  std::cout << json::serialize(r) << "\n";
  return 0;
}

}  // namespace

#include "bench_replicas_parent.hpp"

int main(int argc, char** argv) { return mb::parent_or_child(argc, argv, "bench_replicas", "child", child, parent); }
