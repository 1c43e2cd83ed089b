// Two processes share one tensor by name. The producer creates and fills
// it, then starts a consumer process that opens it by name (CUDA IPC or
// POSIX shm: no copy of the data), verifies every element and releases.
//
//   ipc_demo [--backend host|cuda|auto] [--elements N]
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <vector>

#include "common.hpp"

namespace {
constexpr const char* kName = "ipc_demo/tensor";

float expected(std::size_t i) { return static_cast<float>(i % 1000) * 0.5f + 1.f; }

int consumer(memcuda::RegistryOptions opts) {
  opts.control_thread = false;  // a pure reader: the producer serves
  memcuda::TensorRegistry reg(opts);
  auto t0 = std::chrono::steady_clock::now();
  auto t = reg.get<float>(kName);
  auto us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  std::vector<float> host(t.size());
  t.copy_to_host(host);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < host.size(); ++i) bad += host[i] != expected(i);
  std::cout << "[consumer pid " << ::getpid() << "] opened '" << kName << "' (" << to_string(t.backend())
            << (t.backend() == memcuda::BackendKind::cuda ? ", device " + std::to_string(t.device()) : "")
            << ") in " << us << " us, refcount " << reg.info(kName).refcount << ", " << host.size() - bad << "/"
            << host.size() << " elements verified\n";
  return bad == 0 ? 0 : 3;
}
}  // namespace

int main(int argc, char** argv) try {
  auto opts = memcuda::RegistryOptions::from_env();
  opts.default_backend = examples::backend_from_args(argc, argv);
  if (examples::has_flag(argc, argv, "--consumer")) return consumer(opts);
  std::size_t n = 1 << 20;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--elements") n = std::stoull(argv[i + 1]);

  memcuda::TensorRegistry reg(opts);
  std::cout << "[producer pid " << ::getpid() << "] backend " << to_string(*opts.default_backend) << ", "
            << (reg.is_leader() ? "allocator of record" : "follower") << "\n";
  auto t = reg.create<float>(kName, {static_cast<std::int64_t>(n)});
  std::vector<float> host(n);
  for (std::size_t i = 0; i < n; ++i) host[i] = expected(i);
  t.copy_from_host(host);
  std::cout << "[producer] created '" << kName << "' " << memcuda::shape_to_string(t.shape()) << ", " << t.bytes()
            << " bytes, generation " << t.generation() << "\n";

  pid_t pid = ::fork();
  if (pid == 0) {
    std::string backend(to_string(*opts.default_backend));
    ::execl("/proc/self/exe", argv[0], "--consumer", "--backend", backend.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  auto refs = reg.info(kName).refcount;
  std::cout << "[producer] consumer exited " << rc << ", refcount back to " << refs << "\n";
  reg.remove(kName);
  if (rc == 0 && refs == 1) std::cout << "ipc_demo: OK\n";
  return rc != 0 ? rc : (refs == 1 ? 0 : 4);
} catch (const memcuda::Error& e) {
  std::cerr << "ipc_demo: " << e.what() << "\n";
  return 1;
}
