// Two processes share one tensor by name: what scripts/demo.sh shows.
// The script starts this program twice, as the producer and as the
// consumer, and moves each through its part one line on stdin at a time,
// running `memcuda ls` and `memcuda info` in between:
//
//   share_demo producer|consumer [--backend host|cuda|auto] [--name NAME]
//
//   producer  create   creates NAME (f32 1024x1024) and writes 0, 1, 2, ... into it
//             check    reads element 0, where the consumer wrote
//             release  lets go of its handle; stays up (it is the allocator of
//                      record, whose memory dies with it) until stdin closes
//   consumer  open     opens NAME by name, checks every value, writes 42 into element 0
//             release  lets go of its handle and exits
//
// Each step prints what it did, then a line "." (the script waits for it).
// Errors go to stderr, exit code 1.
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <memcuda/memcuda.hpp>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr float kMark = 42.f;

void done() { std::cout << "." << std::endl; }  // endl: the script reads through a pipe

std::string where(const memcuda::SharedTensor<float>& t) {
  return t.backend() == memcuda::BackendKind::cuda ? "GPU memory (cuda device " + std::to_string(t.device()) + ")"
                                                   : "host shared memory";
}

// The refcount once a release has reached the registry: the drop is a Redis
// call of the releasing process, so poll briefly rather than assume when it
// lands. -1 once the tensor is gone.
std::int64_t refcount_after_release(memcuda::TensorRegistry& reg, const std::string& name, std::int64_t before) {
  for (int i = 0; i < 100; ++i) {
    try {
      auto n = reg.info(name).refcount;
      if (n < before) return n;
    } catch (const memcuda::NotFound&) {
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return reg.info(name).refcount;
}

int producer(memcuda::RegistryOptions opts, const std::string& name) {
  memcuda::TensorRegistry reg(opts);  // the first process to start becomes the allocator of record
  memcuda::SharedTensor<float> t;
  for (std::string cmd; std::getline(std::cin, cmd);) {
    if (cmd == "create") {
      t = reg.create<float>(name, {1024, 1024});
      std::vector<float> v(t.size());
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
      t.copy_from_host(v);
      std::cout << "producer (pid " << ::getpid() << ") created '" << name << "': " << to_string(t.dtype()) << " "
                << memcuda::shape_to_string(t.shape()) << ", " << t.bytes() / (1 << 20) << " MiB of " << where(t)
                << ", filled with 0, 1, 2, ...\n"
                << "refcount " << reg.info(name).refcount << ": the producer's handle. "
                << (reg.is_leader() ? "It is the allocator of record: the memory is its own.\n"
                                    : "Another process is the allocator of record and holds the memory.\n");
    } else if (cmd == "check") {
      float first = -1;
      t.copy_to_host(std::span<float>(&first, 1));
      std::cout << "producer reads element 0: " << first
                << (first == kMark ? ", the consumer's write: both processes use the same memory, no copy.\n"
                                   : ", NOT the consumer's 42: the memory is not shared!\n");
      if (first != kMark) return 1;
    } else if (cmd == "release") {
      auto before = reg.info(name).refcount;
      t.release();
      auto after = refcount_after_release(reg, name, before);
      std::cout << "producer let go of its handle: refcount " << before << " -> " << after
                << (after > 0 ? ". The tensor lives on: the consumer still holds it.\n" : ".\n");
      if (reg.is_leader()) std::cout << "(The producer stays up: as allocator of record, its memory dies with it.)\n";
    } else {
      std::cerr << "share_demo producer: unknown step '" << cmd << "'\n";
      return 1;
    }
    done();
  }
  return 0;  // stdin closed: the demo is over
}

int consumer(memcuda::RegistryOptions opts, const std::string& name) {
  opts.control_thread = false;  // a pure client: never the allocator of record
  memcuda::TensorRegistry reg(opts);
  memcuda::SharedTensor<float> t;
  for (std::string cmd; std::getline(std::cin, cmd);) {
    if (cmd == "open") {
      t = reg.get<float>(name);  // by name: one Redis round trip, then the memory is mapped here
      std::vector<float> v(t.size());
      t.copy_to_host(v);
      std::size_t same = 0;
      for (std::size_t i = 0; i < v.size(); ++i) same += v[i] == static_cast<float>(i);
      std::cout << "consumer (pid " << ::getpid() << ", another process) opened '" << name << "' by name, in "
                << where(t) << ":\n" << same << " of " << v.size()
                << " values are the producer's. It writes 42 into element 0.\n";
      if (same != v.size()) return 1;
      t.copy_from_host(std::span<const float>(&kMark, 1));
    } else if (cmd == "release") {
      t.release();
      auto after = refcount_after_release(reg, name, 1);
      std::cout << "consumer let go of its handle: refcount 1 -> 0"
                << (after < 0 ? ". Nobody holds the tensor, so it is freed and its name is gone.\n"
                              : ", yet the registry still shows refcount " + std::to_string(after) + "!\n");
      done();
      return after < 0 ? 0 : 1;
    } else {
      std::cerr << "share_demo consumer: unknown step '" << cmd << "'\n";
      return 1;
    }
    done();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string role = argc > 1 ? argv[1] : "";
  std::string name = "demo/weights";
  for (int i = 2; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--name") name = argv[i + 1];
  auto opts = memcuda::RegistryOptions::from_env();  // MEMCUDA_REDIS_URL, else redis://127.0.0.1:6379
  for (int i = 2; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--backend" && std::string(argv[i + 1]) != "auto") {
      opts.default_backend = memcuda::backend_from_string(argv[i + 1]);  // unset: cuda when a GPU is usable
      if (!opts.default_backend) {
        std::cerr << "share_demo: unknown backend '" << argv[i + 1] << "' (host, cuda or auto)\n";
        return 2;
      }
    }
  if (role == "producer") return producer(opts, name);
  if (role == "consumer") return consumer(opts, name);
  std::cerr << "usage: share_demo producer|consumer [--backend host|cuda|auto] [--name NAME]\n";
  return 2;
} catch (const memcuda::Error& e) {
  std::cerr << "share_demo " << (argc > 1 ? argv[1] : "") << ": " << e.what() << "\n";
  return 1;
}
