// The kernels of the CUDA benchmarks: a fill with distinct non-zero values
// and a reduction that reads at HBM speed.
#pragma once

#include <cstdint>

#include "memcuda/detail/cuda/runtime.hpp"

namespace memcuda::bench {

__device__ __forceinline__ float value_at(std::uint64_t i, std::uint32_t seed) {
  // A cheap integer hash: values in [0, 1), different for every element.
  std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u ^ static_cast<std::uint32_t>(i >> 32) ^ seed;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}

__global__ void fill_kernel(float* x, std::uint64_t n, std::uint32_t seed) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    x[i] = value_at(i, seed);
}

__device__ __forceinline__ float hsum(float4 v) { return (v.x + v.y) + (v.z + v.w); }

// Sum of n4 float4s into *out (float64). Four independent 16-byte loads per
// thread per step keep enough bytes in flight to saturate HBM.
__global__ void __launch_bounds__(256) reduce_kernel(const float4* __restrict__ in, std::uint64_t n4,
                                                     double* out) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float acc0 = 0.f, acc1 = 0.f;
  for (; i + 3 * stride < n4; i += 4 * stride) {
    float4 a = in[i];
    float4 b = in[i + stride];
    float4 c = in[i + 2 * stride];
    float4 d = in[i + 3 * stride];
    acc0 += hsum(a) + hsum(b);
    acc1 += hsum(c) + hsum(d);
  }
  for (; i < n4; i += stride) acc0 += hsum(in[i]);
  float acc = acc0 + acc1;
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
  __shared__ float warp_sums[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < static_cast<int>(blockDim.x >> 5) ? warp_sums[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if (lane == 0) atomicAdd(out, static_cast<double>(acc));
  }
}

// Blocks for a full chip: 8 of 256 threads per SM.
inline int blocks_for(int device) {
  int sms = 0;
  MEMCUDA_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms * 8;
}

}  // namespace memcuda::bench
