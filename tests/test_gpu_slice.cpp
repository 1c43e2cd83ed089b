// Sliced reads of a device tensor: tensor-parallel views read in place by a
// kernel, and copy_slice's one 2D copy into a LocalTensor. [gpu]: skipped,
// with the reason, where no CUDA device is usable.
#include <catch2/catch.hpp>

#include <chrono>
#include <numeric>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "support/gpu.hpp"
#include "support/redis_server.hpp"
#include "support/skip.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

#if MEMCUDA_HAS_CUDA() && defined(MEMCUDA_TEST_KERNELS)
extern "C" cudaError_t memcuda_test_sum_strided(const float* p, std::size_t rows, std::size_t cols, std::size_t pitch,
                                                double* out, cudaStream_t s);

namespace {

RegistryOptions cuda_opts(const test::RedisServer& srv, bool control) {
  RegistryOptions o;
  o.redis = srv.options();
  o.control_thread = control;
  o.lease_ttl = 400ms;
  o.default_backend = BackendKind::cuda;
  return o;
}

// The sum of a 2D view as a kernel reads it through its pointer and strides.
double kernel_sum(const SharedTensor<const float>& v) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, sizeof(double)) == cudaSuccess);
  auto* d = static_cast<double*>(p);
  REQUIRE(memcuda_test_sum_strided(v.data(), v.shape()[0], v.shape()[1], v.strides()[0], d, nullptr) == cudaSuccess);
  double h = 0;
  REQUIRE(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess);
  cudaFree(d);
  return h;
}

}  // namespace

TEST_CASE("cuda: tp views of ranks 0-3 are read in place by a kernel, and copy_slice copies their bytes", "[gpu][slice]") {
  MEMCUDA_REQUIRE_GPU();
  test::RedisServer srv;
  TensorRegistry leader(cuda_opts(srv, true));
  TensorRegistry reader(cuda_opts(srv, false));
  CreateOptions keep;
  keep.persistent = true;
  const std::int64_t R = 64, C = 96;
  std::vector<float> src(R * C);
  std::iota(src.begin(), src.end(), 0.0f);
  leader.create<float>("gpu/w", {R, C}, keep).copy_from_host(src);
  auto t = reader.get<const float>("gpu/w");
  for (int dim : {0, 1}) {
    for (unsigned r = 0; r < 4; ++r) {
      auto v = t.slice(SliceSpec::tp(dim, r, 4));
      double want = 0;
      std::vector<float> dense;
      for (std::int64_t i = 0; i < R; ++i)
        for (std::int64_t j = 0; j < C; ++j)
          if ((dim == 0 ? i : j) / ((dim == 0 ? R : C) / 4) == r) {
            want += src[i * C + j];
            dense.push_back(src[i * C + j]);
          }
      CHECK(kernel_sum(v) == want);
      LocalOptions lo;
      lo.device = t.device();
      auto local = copy_slice(v, lo);
      REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
      std::vector<float> got(local.size());
      REQUIRE(cudaMemcpy(got.data(), local.data(), local.bytes(), cudaMemcpyDeviceToHost) == cudaSuccess);
      CHECK(got == dense);
      std::vector<float> host(v.size());
      v.copy_to_host(host);
      CHECK(host == dense);
    }
  }
}

namespace {

// A tensor's or view's elements on the host.
template <class T>
std::vector<float> dump(const SharedTensor<T>& t) {
  std::vector<float> v(t.size());
  t.copy_to_host(v);
  return v;
}

}  // namespace

TEST_CASE("cuda: a strided view's writes, its copies to and from host memory, and a single column", "[gpu][slice]") {
  MEMCUDA_REQUIRE_GPU();
  test::RedisServer srv;
  TensorRegistry leader(cuda_opts(srv, true));
  TensorRegistry reader(cuda_opts(srv, false));
  CreateOptions keep;
  keep.persistent = true;
  const std::int64_t R = 8, C = 96;
  std::vector<float> src(R * C);
  std::iota(src.begin(), src.end(), 0.0f);
  leader.create<float>("gpu/s", {R, C}, keep).copy_from_host(src);
  auto t = reader.get<float>("gpu/s");
  // H2D into a strided view (cudaMemcpy2DAsync with dpitch = the pitch): columns 24..47 only.
  t.slice(SliceSpec::tp(1, 1, 4)).copy_from_host(std::vector<float>(R * 24, -1.0f));
  auto all = dump(t);
  for (std::int64_t i = 0; i < R * C; ++i) CHECK(all[i] == (i % C >= 24 && i % C < 48 ? -1.0f : src[i]));
  // A single column: rows of one element, device to device and device to host.
  auto col = t.slice({.dim = 1, .start = 5, .length = 1});
  std::vector<float> want(R);
  for (std::int64_t i = 0; i < R; ++i) want[i] = src[i * C + 5];
  CHECK(dump(col) == want);
  LocalOptions lo;
  lo.device = t.device();
  auto on_device = copy_slice(col, lo);
  REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
  std::vector<float> got(R);
  REQUIRE(cudaMemcpy(got.data(), on_device.data(), R * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(got == want);
  auto on_host = copy_slice(t.slice(SliceSpec::tp(1, 1, 4)), LocalOptions{.backend = BackendKind::host});
  CHECK(std::vector<float>(on_host.data(), on_host.data() + R * 24) == std::vector<float>(R * 24, -1.0f));
  // A host tensor's view copied to the device.
  CreateOptions host = keep;
  host.backend = BackendKind::host;
  leader.create<float>("gpu/h", {R, C}, host).copy_from_host(src);
  auto hv = reader.get<float>("gpu/h").slice(SliceSpec::tp(1, 3, 4));
  auto up = copy_slice(hv, lo);
  REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
  std::vector<float> back(R * 24);
  REQUIRE(cudaMemcpy(back.data(), up.data(), back.size() * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(back == dump(hv));
  CHECK(back[0] == 72.0f);
}

#endif
