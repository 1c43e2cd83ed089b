// DLPack export. The structure is checked everywhere (host backend); on a
// GPU host PyTorch imports a cuda tensor through torch.from_dlpack.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

#include "memcuda/dlpack.hpp"
#include "memcuda/memcuda.hpp"
#include "support/gpu.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/skip.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

TEST_CASE("to_dlpack describes the tensor and its deleter releases the reference", "[redis][dlpack]") {
  test::RedisServer srv;
  RegistryOptions o;
  o.redis = srv.options();
  o.default_backend = BackendKind::host;
  TensorRegistry reg(o);
  auto t = reg.create<std::int16_t>("dl", {3, 4, 5});
  DLManagedTensor* m = to_dlpack(t);
  CHECK(reg.info("dl").refcount == 1);  // shares the handle's reference
  t.release();
  CHECK(reg.info("dl").refcount == 1);  // the DLPack view still holds it
  const DLTensor& d = m->dl_tensor;
  CHECK(d.device.device_type == kDLCPU);
  CHECK(d.ndim == 3);
  CHECK(d.shape[0] == 3);
  CHECK(d.shape[2] == 5);
  CHECK(d.strides[0] == 20);
  CHECK(d.strides[1] == 5);
  CHECK(d.strides[2] == 1);
  CHECK(d.dtype.code == kDLInt);
  CHECK(d.dtype.bits == 16);
  CHECK(d.dtype.lanes == 1);
  CHECK(d.byte_offset == 0);
  static_cast<std::int16_t*>(d.data)[59] = 42;  // the whole extent is addressable
  m->deleter(m);
  CHECK_THROWS_AS(reg.info("dl"), NotFound);  // last reference gone: freed
  CHECK(detail::to_dl_dtype(DType::bf16).code == kDLBfloat);
  CHECK(detail::to_dl_dtype(DType::f64).bits == 64);
  CHECK(detail::to_dl_dtype(DType::u32).code == kDLUInt);
}

#if MEMCUDA_HAS_CUDA()
namespace {
// tests/dlpack_check.py: MEMCUDA_TEST_DLPACK_SCRIPT, else relative to the
// working directory (the repository root), else in the source tree this
// binary was built from (CTest runs in the build tree).
std::string find_dlpack_script() {
  if (const char* e = std::getenv("MEMCUDA_TEST_DLPACK_SCRIPT"); e && *e) return e;
  if (::access("tests/dlpack_check.py", R_OK) == 0) return "tests/dlpack_check.py";
#ifdef MEMCUDA_TEST_SOURCE_DIR
  const std::string in_src = std::string(MEMCUDA_TEST_SOURCE_DIR) + "/dlpack_check.py";
  if (::access(in_src.c_str(), R_OK) == 0) return in_src;
#endif
  return {};
}
}  // namespace

// Tagged [torch]: it runs as its own CTest entry (gpu_torch_tests), which
// reports itself skipped where python3 with a CUDA-enabled torch is missing.
TEST_CASE("cuda: PyTorch imports a shared tensor through DLPack", "[gpu][torch]") {
  MEMCUDA_REQUIRE_GPU();
  const int torch = std::system(
      "python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)' >/dev/null 2>&1");
  if (torch != 0) {
    if (WIFEXITED(torch) && WEXITSTATUS(torch) == 3) MEMCUDA_SKIP("torch is installed but sees no CUDA device");
    MEMCUDA_SKIP("needs python3 with torch (python3 -c 'import torch' failed)");
  }
  const std::string script = find_dlpack_script();
  if (script.empty())
    MEMCUDA_SKIP("tests/dlpack_check.py not found (run from the repository root or set MEMCUDA_TEST_DLPACK_SCRIPT)");
  test::RedisServer srv;
  RegistryOptions o;
  o.redis = srv.options();
  o.default_backend = BackendKind::cuda;
  TensorRegistry reg(o);
  auto t = reg.create<float>("torch/in", {256, 4});
  std::vector<float> v(t.size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 13);
  t.copy_from_host(v);
  double expect = 0;
  for (float x : v) expect += x;
  test::Child py({"/usr/bin/env", "python3", script, test::sibling_program("libmemcuda_dlpack_probe.so"),
                  srv.unix_url(), "torch/in"});
  auto line = py.read_line(60s);
  REQUIRE(line);
  INFO(*line);
  CHECK(line->rfind("OK", 0) == 0);
  CHECK(line->find("sum=" + std::to_string(static_cast<long long>(expect))) != std::string::npos);
  CHECK(line->find("shape=[256, 4]") != std::string::npos);
  CHECK(line->find("device=cuda:0") != std::string::npos);
  CHECK(py.wait() == 0);
  CHECK(reg.info("torch/in").refcount == 1);  // torch's deleter released the probe's reference
}
#endif
