// A compute process with CUB (seed 001: "compute processes use CUB").
// The producer fills a shared tensor with a kernel and publishes the
// stream's event without synchronising; a consumer process opens the tensor
// by name on its own stream, which waits on that event, reduces it with
// cub::DeviceReduce::Sum and checks the result against the expected value.
//
//   cub_reduce [--elements N]
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cub/device/device_reduce.cuh>
#include <string>

#include <memcuda/memcuda.hpp>

namespace {
constexpr const char* kName = "cub_reduce/input";

__host__ __device__ float value(std::size_t i) { return static_cast<float>(i % 7) * 0.25f; }

__global__ void fill(float* p, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    p[i] = value(i);
}

#define CHECK_CUDA(x)                                                                         \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_));                    \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

int consumer() {
  auto o = memcuda::RegistryOptions::from_env();
  o.control_thread = false;
  memcuda::TensorRegistry reg(o);
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto t = reg.get<float>(kName, s);  // s now waits for the producer's fill
  float* out = nullptr;
  CHECK_CUDA(cudaMallocAsync(&out, sizeof(float), s));
  std::size_t temp_bytes = 0;
  CHECK_CUDA(cub::DeviceReduce::Sum(nullptr, temp_bytes, t.data(), out, t.size(), s));
  memcuda::LocalOptions lo;
  lo.stream = s;
  memcuda::LocalTensor<std::uint8_t> temp({static_cast<std::int64_t>(temp_bytes)}, lo);  // a stack tensor
  CHECK_CUDA(cub::DeviceReduce::Sum(temp.data(), temp_bytes, t.data(), out, t.size(), s));
  float got = 0;
  CHECK_CUDA(cudaMemcpyAsync(&got, out, sizeof got, cudaMemcpyDeviceToHost, s));
  CHECK_CUDA(cudaFreeAsync(out, s));
  temp.reset();  // freed on s, before s goes away
  CHECK_CUDA(cudaStreamSynchronize(s));
  double want = 0;
  for (std::size_t i = 0; i < t.size(); ++i) want += value(i);
  double rel = std::abs(got - want) / want;
  std::printf("[consumer] cub::DeviceReduce::Sum over %zu floats = %.1f (expected %.1f, relative error %.2e)\n",
              static_cast<std::size_t>(t.size()), got, want, rel);
  std::fflush(stdout);
  t.release();
  cudaStreamDestroy(s);
  return rel < 1e-5 ? 0 : 2;
}
}  // namespace

int main(int argc, char** argv) try {
  if (argc > 1 && std::string(argv[1]) == "--consumer") return consumer();
  std::size_t n = std::size_t{1} << 24;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--elements") n = std::stoull(argv[i + 1]);
  auto o = memcuda::RegistryOptions::from_env();
  o.default_backend = memcuda::BackendKind::cuda;
  memcuda::TensorRegistry reg(o);
  auto t = reg.create<float>(kName, {static_cast<std::int64_t>(n)});
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  fill<<<256, 256, 0, s>>>(t.data(), n);
  CHECK_CUDA(cudaGetLastError());
  t.publish(s);  // no host sync: the consumer's stream orders itself after the fill
  std::printf("[producer] filling '%s' (%zu floats) on a stream, event published\n", kName, n);
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    execl("/proc/self/exe", argv[0], "--consumer", static_cast<char*>(nullptr));
    _exit(127);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK_CUDA(cudaStreamSynchronize(s));
  cudaStreamDestroy(s);
  reg.remove(kName);
  int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 1;
  std::printf("cub_reduce: %s\n", rc == 0 ? "OK" : "FAILED");
  return rc;
} catch (const memcuda::Error& e) {
  std::fprintf(stderr, "cub_reduce: %s\n", e.what());
  return 1;
}
