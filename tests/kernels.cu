// Kernels for the GPU tests: a deliberately slow producer, so a consumer
// that does not wait on the producer's event would read stale data.
#include <cuda_runtime.h>

#include <cstdint>

namespace {
__device__ std::uint64_t global_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void slow_fill(float* p, std::size_t n, float v, std::uint64_t spin_ns) {
  const std::uint64_t start = global_ns();
  while (global_ns() - start < spin_ns) {
  }
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    p[i] = v;
}

__global__ void sum_kernel(const float* p, std::size_t n, double* out) {
  double s = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    s += p[i];
  atomicAdd(out, s);
}
}  // namespace

// Spins `spin_ms` on the GPU, then writes v to every element, on `s`.
extern "C" cudaError_t memcuda_test_slow_fill(float* p, std::size_t n, float v, unsigned spin_ms, cudaStream_t s) {
  slow_fill<<<64, 256, 0, s>>>(p, n, v, std::uint64_t(spin_ms) * 1000000ull);
  return cudaGetLastError();
}

// Sums n floats at p with a kernel on the current device into *out (device memory), on `s`.
extern "C" cudaError_t memcuda_test_sum(const float* p, std::size_t n, double* out, cudaStream_t s) {
  cudaError_t e = cudaMemsetAsync(out, 0, sizeof(double), s);
  if (e != cudaSuccess) return e;
  sum_kernel<<<64, 256, 0, s>>>(p, n, out);
  return cudaGetLastError();
}

namespace {
__global__ void sum_strided_kernel(const float* p, std::size_t rows, std::size_t cols, std::size_t pitch, double* out) {
  double s = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < rows * cols; i += std::size_t(gridDim.x) * blockDim.x)
    s += p[(i / cols) * pitch + i % cols];
  atomicAdd(out, s);
}
}  // namespace

// Sums a view of `rows` x `cols` floats whose rows are `pitch` elements apart, into *out (device memory), on `s`.
extern "C" cudaError_t memcuda_test_sum_strided(const float* p, std::size_t rows, std::size_t cols, std::size_t pitch,
                                                double* out, cudaStream_t s) {
  cudaError_t e = cudaMemsetAsync(out, 0, sizeof(double), s);
  if (e != cudaSuccess) return e;
  sum_strided_kernel<<<64, 256, 0, s>>>(p, rows, cols, pitch, out);
  return cudaGetLastError();
}

namespace {
__global__ void slow_pattern(std::uint32_t* p, std::size_t n, std::uint32_t seed, std::uint64_t spin_ns) {
  const std::uint64_t start = global_ns();
  while (global_ns() - start < spin_ns) {
  }
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    p[i] = static_cast<std::uint32_t>(i) * 2654435761u + seed;
}
}  // namespace

// Spins `spin_ms` on the GPU, then writes p[i] = i * 2654435761 + seed (mod 2^32), on `s`: bytes that differ
// at every offset, so that a copy to the wrong place or one that did not wait shows.
extern "C" cudaError_t memcuda_test_slow_pattern(std::uint32_t* p, std::size_t n, std::uint32_t seed,
                                                 unsigned spin_ms, cudaStream_t s) {
  slow_pattern<<<64, 256, 0, s>>>(p, n, seed, std::uint64_t(spin_ms) * 1000000ull);
  return cudaGetLastError();
}
