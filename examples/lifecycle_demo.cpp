// Drives create / get / delete through raw JSON on the Redis List
// `tensor_lifecycle`, exactly as `redis-cli LPUSH tensor_lifecycle '...'`
// would, and prints each command, reply and the tensor's Hash. This process
// also hosts the allocator of record (any mem-cuda process can); the JSON
// side uses nothing but a plain Redis connection.
//
//   lifecycle_demo [--backend host|cuda|auto]
#include <unistd.h>

#include "common.hpp"

#include <memcuda/redis/connection.hpp>  // a raw Redis client, to show the wire format

namespace {

std::string ask(memcuda::redis::Connection& c, const std::string& json) {
  std::cout << "> LPUSH tensor_lifecycle '" << json << "'\n";
  c.command({"LPUSH", "tensor_lifecycle", json});
  auto r = c.blocking(std::chrono::seconds(5), {"BLPOP", "lifecycle_demo:replies", "5"});
  if (r.is_nil()) throw memcuda::NotLeader("no reply within 5 s");
  std::string reply(r[1].str());
  std::cout << "< " << reply << "\n";
  return reply;
}

void show_hash(memcuda::redis::Connection& c, const std::string& key) {
  auto h = c.command({"HGETALL", key});
  if (h.size() == 0) {
    std::cout << "  " << key << ": (no such key)\n";
    return;
  }
  std::cout << "  " << key << ":\n";
  for (std::size_t i = 0; i + 1 < h.size(); i += 2) {
    std::string f(h[i].str()), v(h[i + 1].str());
    bool printable = true;
    for (unsigned char ch : v) printable &= ch >= 0x20 && ch < 0x7f;
    std::cout << "    " << f << " = " << (printable ? v : "<" + std::to_string(v.size()) + " binary bytes>") << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) try {
  auto opts = memcuda::RegistryOptions::from_env();
  opts.default_backend = examples::backend_from_args(argc, argv);
  memcuda::TensorRegistry allocator(opts);
  const std::string be(to_string(*opts.default_backend));
  std::cout << "allocator of record: " << (allocator.is_leader() ? "this process" : "another process") << "\n";

  memcuda::redis::Connection c(opts.redis);
  const std::string pid = std::to_string(::getpid());
  // JSON holders are pids of this node (references of dead pids are
  // collected): the second holder is our parent process.
  const std::string other = std::to_string(::getppid());
  auto ok = [](const std::string& r) { return r.find("\"ok\":true") != std::string::npos; };
  bool good = true;
  good &= ok(ask(c, R"({"op":"create","name":"demo/X","dtype":"f32","shape":[2,3],"device":0,"backend":")" + be +
                        R"(","pid":)" + pid + R"(,"node":"demo","id":1,"reply_to":"lifecycle_demo:replies"})"));
  show_hash(c, "memcuda:tensor:demo/X");
  good &= ok(ask(c, R"({"op":"get","name":"demo/X","pid":)" + other + R"(,"id":2,"reply_to":"lifecycle_demo:replies"})"));
  good &= ok(ask(c, R"({"op":"delete","name":"demo/X","pid":)" + other + R"(,"id":3,"reply_to":"lifecycle_demo:replies"})"));
  good &= ok(ask(c, R"({"op":"delete","name":"demo/X","pid":)" + pid +
                        R"(,"id":4,"reply_to":"lifecycle_demo:replies"})"));
  show_hash(c, "memcuda:tensor:demo/X");
  // a malformed command is answered with an error, and the consumer goes on
  good &= !ok(ask(c, R"({"op":"create","name":"demo/bad","dtype":"f32","shape":[-1],"id":5,"reply_to":"lifecycle_demo:replies"})"));
  std::cout << (good ? "lifecycle_demo: OK\n" : "lifecycle_demo: UNEXPECTED REPLY\n");
  return good ? 0 : 1;
} catch (const memcuda::Error& e) {
  std::cerr << "lifecycle_demo: " << e.what() << "\n";
  return 1;
}
