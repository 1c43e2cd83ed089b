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
//   fleet --url U [--backend cuda] [--stall-ms MS (serve_stall_timeout)]
//     a registry of a fleet (MEMCUDA_FLEET=1 and MEMCUDA_NODE_ID come from
//     the environment) driven over stdin, a reply line per command:
//       create NAME ELEMS SEED  (a persistent f32 tensor of a seeded pattern, held; on device 0 with --backend cuda)
//       rewrite NAME SEED       (the held tensor written anew and published in place)
//       get NAME SEED           (checks the pattern: "ok gen=G name=TAKEN pulls=P pulled=B", held)
//       release NAME | leader | refcount NAME | gc | exit   (fleet --session-ttl MS: a short session)
//       publish PREFIX N ELEMS SEED  (A/B version of N host f32 tensors t0.., tensor i of seed SEED + i)
//       open PREFIX SEED    (open_model, pinned: every tensor checked; "ok version=V tensors=N pulls=P pulled=B")
//       check PREFIX SEED   (the pinned version's tensors checked again)
//       advance PREFIX SEED (advance, then checked: "ok moved=M version=V pulls=P pulled=B")
//     "error <code> <what>" for a failure.
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "memcuda/detail/registry/fleet/node_endpoint.hpp"
#include "memcuda/detail/transfer/ucx_mover.hpp"
#include "memcuda/fleet.hpp"
#include "memcuda/memcuda.hpp"
#include "memcuda/redis/connection.hpp"
#include "memcuda/redis/options.hpp"

using namespace memcuda;
namespace tr = memcuda::detail::transfer;

namespace {

std::uint64_t pattern(std::uint64_t i, std::uint64_t seed) { return (i * 0x9E3779B97F4A7C15ull) ^ seed; }


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
              static_cast<unsigned long long>(region.address()), region.size(), tr::to_hex(region.key()).c_str());
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
    tr::RemoteRegion src{ep.endpoint, std::stoull(a["address"]), std::stoull(a["size"]), tr::from_hex(a["key"])};
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

float fleet_value(std::size_t i, std::uint64_t seed) {  // exact in a float: below 2^24
  return static_cast<float>((i * 2654435761u + seed) % 1000003u);
}

int fleet(std::map<std::string, std::string>& a) {
  RegistryOptions o = RegistryOptions::from_env();
  o.redis = redis::parse_url(a["url"]);
  o.default_backend = a.count("backend") && a["backend"] == "cuda" ? BackendKind::cuda : BackendKind::host;
  if (a.count("session-ttl")) o.session_ttl = std::chrono::milliseconds(std::stoll(a["session-ttl"]));
  if (a.count("stall-ms")) o.serve_stall_timeout = std::chrono::milliseconds(std::stoll(a["stall-ms"]));
  std::optional<TensorRegistry> reg;
  try {
    reg.emplace(o);
  } catch (const Error& e) {
    std::printf("error %s %s\n", e.code(), e.what());
    return 1;
  }
  std::printf("ready leader=%d node=%s\n", reg->is_leader() ? 1 : 0, reg->node_id().c_str());
  std::fflush(stdout);
  std::multimap<std::string, SharedTensor<float>> held;
  std::map<std::string, PinnedModel> models;
  // Tensor i of a model version of seed `seed` holds the pattern of seed + i.
  const auto check_model = [](const PinnedModel& m, std::uint64_t seed) {
    std::size_t i = 0;
    for (const auto& [n, t] : m.tensors()) {
      if (n != "t" + std::to_string(i)) throw InternalError("unexpected tensor '" + n + "' in the model");
      std::vector<float> host(t.info().bytes / sizeof(float));
      t.template as<float>().copy_to_host(host);
      for (std::size_t j = 0; j < host.size(); ++j)
        if (host[j] != fleet_value(j, seed + i))
          throw InternalError("tensor " + n + ": pattern mismatch at element " + std::to_string(j));
      ++i;
    }
    return i;
  };
  const auto pulls = [&] {
    const auto st = reg->stats();
    return " pulls=" + std::to_string(st.process.pulls) + " pulled=" + std::to_string(st.process.pulled_bytes);
  };
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd, name;
    in >> cmd >> name;
    std::ostringstream out;
    try {
      if (cmd == "create") {
        std::int64_t n = 0;
        std::uint64_t seed = 0;
        in >> n >> seed;
        CreateOptions co;
        co.persistent = true;
        auto t = reg->create<float>(name, {n}, co);
        std::vector<float> host(t.size());
        for (std::size_t i = 0; i < host.size(); ++i) host[i] = fleet_value(i, seed);
        t.copy_from_host(host);
        t.publish();
        out << "ok gen=" << t.generation();
        held.emplace(name, std::move(t));
      } else if (cmd == "rewrite") {
        std::uint64_t seed = 0;
        in >> seed;
        auto it = held.find(name);
        if (it == held.end()) throw NotFound("this worker holds no '" + name + "'");
        std::vector<float> host(it->second.size());
        for (std::size_t i = 0; i < host.size(); ++i) host[i] = fleet_value(i, seed);
        it->second.copy_from_host(host);
        out << "ok version=" << it->second.publish();
      } else if (cmd == "get") {
        std::uint64_t seed = 0;
        in >> seed;
        auto t = reg->get<float>(name);
        std::vector<float> host(t.size());
        t.copy_to_host(host);
        for (std::size_t i = 0; i < host.size(); ++i)
          if (host[i] != fleet_value(i, seed)) throw InternalError("pattern mismatch at element " + std::to_string(i));
        const auto st = reg->stats();
        out << "ok gen=" << t.generation() << " name=" << t.info().name << " pulls=" << st.process.pulls
            << " pulled=" << st.process.pulled_bytes;
        held.emplace(name, std::move(t));
      } else if (cmd == "publish") {
        std::size_t n = 0;
        std::int64_t elems = 0;
        std::uint64_t seed = 0;
        in >> n >> elems >> seed;
        std::vector<std::vector<float>> data(n, std::vector<float>(static_cast<std::size_t>(elems)));
        std::vector<StateDictEntry> entries;
        for (std::size_t i = 0; i < n; ++i) {
          for (std::size_t j = 0; j < data[i].size(); ++j) data[i][j] = fleet_value(j, seed + i);
          StateDictEntry e;
          e.name = "t" + std::to_string(i);
          e.shape = {elems};
          e.data = data[i].data();
          entries.push_back(std::move(e));
        }
        out << "ok version=" << publish_model(*reg, name, entries);
      } else if (cmd == "open") {
        std::uint64_t seed = 0;
        in >> seed;
        auto m = open_model(*reg, name, nullptr);
        const std::size_t n = check_model(m, seed);
        out << "ok version=" << m.version() << " tensors=" << n << pulls();
        models.insert_or_assign(name, std::move(m));
      } else if (cmd == "check" || cmd == "advance") {
        std::uint64_t seed = 0;
        in >> seed;
        auto it = models.find(name);
        if (it == models.end()) throw NotFound("this worker has no model '" + name + "' open");
        const bool moved = cmd == "advance" && it->second.advance(nullptr);
        check_model(it->second, seed);
        out << "ok " << (cmd == "advance" ? "moved=" + std::to_string(moved) + " " : "")
            << "version=" << it->second.version() << pulls();
      } else if (cmd == "release") {
        held.erase(name);
        reg->flush();
        out << "ok";
      } else if (cmd == "leader") {
        out << "ok leader=" << reg->is_leader();
      } else if (cmd == "refcount") {
        out << "ok refcount=" << reg->info(name).refcount;
      } else if (cmd == "gc") {
        auto g = reg->collect_garbage();
        out << "ok dead=" << g.dead_holders << " dropped=" << g.references_dropped;
      } else if (cmd == "exit") {
        held.clear();
        reg.reset();
        std::printf("ok\n");
        return 0;
      } else {
        out << "error invalid_argument unknown command '" << cmd << "'";
      }
    } catch (const Error& e) {
      out.str("");
      out << "error " << e.code() << " " << e.what();
    }
    std::printf("%s\n", out.str().c_str());
    std::fflush(stdout);
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
  if (mode == "fleet") return fleet(a);
  return 2;
}
