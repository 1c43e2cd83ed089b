// Catch2 main for memcuda_tests. `--require-gpu` makes the run exit with 77
// (CTest's skip code) and say why when no CUDA device is usable, so the GPU
// test group shows as skipped, not passed, on machines without a GPU.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstring>
#include <iostream>
#include <vector>

#include "support/gpu.hpp"

int main(int argc, char** argv) {
  std::vector<char*> args;
  bool require_gpu = false;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--require-gpu") == 0) require_gpu = true;
    else args.push_back(argv[i]);
  }
  if (require_gpu) {
    std::string why;
    if (!memcuda::test::gpu_available(&why)) {
      std::cout << "SKIPPED: GPU tests need a CUDA device: " << why << "\n";
      return 77;
    }
  }
  return Catch::Session().run(static_cast<int>(args.size()), args.data());
}
