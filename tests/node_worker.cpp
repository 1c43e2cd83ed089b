// One fake node's process for the [nodes] tests (test_nodes.cpp), run in a
// pod of its own hostname (support/pod.hpp), over the UCX mover on TCP
// loopback and the node endpoint records:
//   serve --url U --bytes N --seed S --ttl MS
//     exposes N bytes of a seeded pattern, publishes the node's endpoint,
//     prints "ready <node> <incarnation> <address> <size> <key hex>" and
//     renews the record every third of the TTL until stdin closes ("quit"
//     withdraws it first).
//   pull --url U --node N --incarnation I --address A --size S --key HEX --seed S --timeout-ms T
//     reads N's endpoint as a reader that took the key under I, pulls the
//     whole region and checks the pattern: "ok <bytes> <ms>", or
//     "error <kind> <what>" (kind: an Error's code(), or "transfer").
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "memcuda/detail/registry/node_endpoint.hpp"
#include "memcuda/detail/transfer/ucx_mover.hpp"
#include "memcuda/redis/connection.hpp"
#include "memcuda/redis/options.hpp"

using namespace memcuda;
namespace tr = memcuda::detail::transfer;

namespace {

std::uint64_t pattern(std::uint64_t i, std::uint64_t seed) { return (i * 0x9E3779B97F4A7C15ull) ^ seed; }

std::string hex(const std::string& b) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : b) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}
std::string unhex(const std::string& h) {
  std::string out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2) out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

tr::UcxOptions loopback() { return {"tcp", "lo"}; }

int serve(std::map<std::string, std::string>& a) {
  const std::size_t bytes = std::stoull(a["bytes"]);
  const std::uint64_t seed = std::stoull(a["seed"]);
  const std::chrono::milliseconds ttl(std::stoll(a["ttl"]));
  std::vector<std::uint64_t> mem(bytes / 8);
  for (std::size_t i = 0; i < mem.size(); ++i) mem[i] = pattern(i, seed);
  tr::UcxMover mover(loopback());
  tr::Region region = mover.expose(mem.data(), mem.size() * 8);
  redis::Connection c(redis::parse_url(a["url"]));
  detail::NodePublisher pub(detail::Keys{}, mover.kind(), mover.endpoint(), "node-worker", ttl);
  pub.publish(c);
  std::printf("ready %s %s %llu %zu %s\n", pub.record().node.c_str(), pub.record().incarnation.c_str(),
              static_cast<unsigned long long>(region.address()), region.size(), hex(region.key()).c_str());
  std::fflush(stdout);
  std::string line;
  for (;;) {
    pollfd p{0, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(ttl.count() / 3)) > 0) {
      char buf[256];
      const ssize_t n = ::read(0, buf, sizeof buf);
      if (n <= 0) return 0;
      line.append(buf, static_cast<std::size_t>(n));
      if (line.find("quit") != std::string::npos) {
        pub.withdraw(c);
        std::printf("bye\n");
        return 0;
      }
    }
    pub.refresh(c);
  }
}

int pull(std::map<std::string, std::string>& a) {
  try {
    redis::Connection c(redis::parse_url(a["url"]));
    const auto ep = detail::endpoint_of(c, detail::Keys{}, a["node"], a["incarnation"]);
    tr::UcxMover mover(loopback());
    if (ep.mover != mover.kind()) throw Unavailable("node's mover is " + ep.mover);
    tr::RemoteRegion src{ep.endpoint, std::stoull(a["address"]), std::stoull(a["size"]), unhex(a["key"])};
    std::vector<std::uint64_t> dst(src.size / 8);
    const auto t0 = std::chrono::steady_clock::now();
    mover.get(src, 0, dst.data(), dst.size() * 8, t0 + std::chrono::milliseconds(std::stoll(a["timeout-ms"])));
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const std::uint64_t seed = std::stoull(a["seed"]);
    for (std::size_t i = 0; i < dst.size(); ++i)
      if (dst[i] != pattern(i, seed)) {
        std::printf("error mismatch at word %zu\n", i);
        return 1;
      }
    std::printf("ok %zu %.1f\n", dst.size() * 8, ms);
  } catch (const tr::TransferError& e) {
    std::printf("error transfer %s\n", e.what());
  } catch (const Error& e) {
    std::printf("error %s %s\n", e.code(), e.what());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  std::map<std::string, std::string> a;
  for (int i = 2; i + 1 < argc; i += 2) a[argv[i] + 2] = argv[i + 1];
  const std::string mode = argv[1];
  if (mode == "serve") return serve(a);
  if (mode == "pull") return pull(a);
  return 2;
}
