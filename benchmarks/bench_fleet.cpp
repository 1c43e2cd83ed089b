// memcuda_bench_fleet: a get of another node's host tensor (a fleet's pull
// into a node replica, docs/scale-out.md) beside UCX's own get of the same
// bytes between two processes on the same path, in one run. "Nodes" are
// processes with their own node id and runtime directory (no fd can pass
// between them), on one Redis, UCX over TCP on the loopback unless UCX_TLS /
// UCX_NET_DEVICES say otherwise, with TCP segments of 512 KiB unless
// UCX_TCP_TX_SEG_SIZE / UCX_TCP_RX_SEG_SIZE say otherwise.
//
//   memcuda_bench_fleet [--sizes 64M,1G] [--reps 3] [--model 16x64M] [--backend host|cuda] [--gpus N]
//                       [--url redis://...] [--json out.json]
//
// Rows per size: ucx_get (the yardstick: one get of the whole region by
// UCX alone, ucp_get_nbx striped over the mover's lanes as the nodes' are,
// MEMCUDA_UCX_LANES of them, 4 by default), fleet_pull (the first get on the other node: a new node replica,
// its bytes pulled before it is published), fleet_refresh (a get after a
// publish at the source: pulled again in place), fleet_get_current (a get
// whose node replica is current: no bytes move), and ucx_get with three
// pairs of processes getting at once (until the last has its bytes: the
// host's own limit when three nodes pull). The ratio is UCX's time over
// the row's (1.0: as fast as UCX alone). Then a model version of
// --model tensors (an A/B version published on node A) opened on one other
// node (model_1_node), then on three more at once (model_3_nodes: until the
// last has it; each new node got a 16 MiB tensor first, as node B got the
// rows'); the ratio there is the one-node time over the row's.
//
// --backend cuda: the tensors are device memory, node i on GPU i % --gpus
// (CUDA_VISIBLE_DEVICES). A pull then goes through the source's staging
// ring (device to pinned host there, the mover, pinned host to device
// here, overlapped); the rows add staging_path: UCX's get plus a device to
// host and a host to device copy of the same bytes, one after the other
// (the path's parts without overlap), and the ratio to it.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <vector>

#include "bench_common.hpp"
#include "memcuda/detail/transfer/ucx_mover.hpp"
#include "memcuda/fleet.hpp"
#include "memcuda/implementation.hpp"
#include "memcuda/memcuda.hpp"
#if MEMCUDA_HAS_CUDA()
#include <cuda_runtime_api.h>
#endif

namespace mb = memcuda::bench;
namespace tr = memcuda::detail::transfer;
namespace json = boost::json;
using namespace memcuda;

namespace {


double ms_since(std::int64_t t0) { return (mb::now_ns() - t0) / 1e6; }

// A device to pinned host copy of `n` bytes, then the way back, on GPU 0:
// the staging path's two copies, in ms (0 without CUDA).
double staging_copies_ms([[maybe_unused]] std::uint64_t n) {
#if MEMCUDA_HAS_CUDA()
  void* d = nullptr;
  void* h = nullptr;
  if (cudaMalloc(&d, n) != cudaSuccess || cudaMallocHost(&h, n) != cudaSuccess)
    throw std::runtime_error("staging_copies_ms: no memory for " + std::to_string(n) + " bytes");
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = mb::now_ns();
    cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost);
    cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
    best = std::min(best, ms_since(t0));
  }
  cudaFree(d);
  cudaFreeHost(h);
  return best;
#else
  return 0;
#endif
}

// --child ucx-serve --bytes N: exposes N bytes, prints "ready <endpoint hex>
// <address> <size> <key hex>", serves until stdin closes.
int ucx_serve(const mb::Args& a) {
  const std::uint64_t n = mb::parse_size(a.get_or("--bytes", "64M"));
  std::vector<char> mem(n, 7);
  tr::UcxMover m;
  tr::Region r = m.expose(mem.data(), n);
  std::cout << "ready " << tr::to_hex(m.endpoint()) << " " << r.address() << " " << r.size() << " " << tr::to_hex(r.key())
            << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}

// --child ucx-pull: reads "get <endpoint> <address> <size> <key>" lines,
// answers each with the milliseconds of one whole get.
int ucx_pull(const mb::Args&) {
  tr::UcxMover m;
  std::vector<char> dst;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string w, ep, key;
    std::uint64_t addr = 0, size = 0;
    in >> w >> ep >> addr >> size >> key;
    if (w != "get") break;
    dst.resize(size);
    const tr::RemoteRegion src{tr::from_hex(ep), addr, size, tr::from_hex(key)};
    const auto t0 = mb::now_ns();
    m.get(src, 0, dst.data(), size, std::chrono::steady_clock::now() + std::chrono::minutes(5));
    std::cout << "ms " << ms_since(t0) << std::endl;
  }
  return 0;
}

// --child node: a fleet registry (its node from the environment) that
// answers "create NAME BYTES", "rewrite NAME" (written and published in
// place) and "get NAME" ("ms <get> pulled <bytes>") on stdin.
int node(const mb::Args& a) {
  RegistryOptions o = RegistryOptions::from_env();
  o.redis = redis::parse_url(a.get_or("--url", ""));
  o.default_backend = a.get_or("--backend", "host") == "cuda" ? BackendKind::cuda : BackendKind::host;
  o.request_timeout = std::chrono::seconds(120);  // a pull of gigabytes is one command
  TensorRegistry reg(o);
  std::map<std::string, SharedTensor<std::uint8_t>> held;
  std::map<std::string, PinnedModel> models;
  std::cout << "ready" << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd, name;
    std::uint64_t n = 0;
    in >> cmd >> name >> n;
    if (cmd == "create") {
      CreateOptions co;
      co.persistent = true;
      auto t = reg.create<std::uint8_t>(name, {static_cast<std::int64_t>(n)}, co);
      t.copy_from_host(std::vector<std::uint8_t>(t.size(), 3));
      t.publish();
      held.insert_or_assign(name, std::move(t));
      std::cout << "ok" << std::endl;
    } else if (cmd == "rewrite") {
      auto& t = held.at(name);
      t.copy_from_host(std::vector<std::uint8_t>(t.size(), 5));
      t.publish();
      std::cout << "ok" << std::endl;
    } else if (cmd == "get") {
      const auto t0 = mb::now_ns();
      auto t = reg.get<std::uint8_t>(name);
      const double ms = ms_since(t0);
      std::cout << "ms " << ms << " pulled " << reg.stats().process.pulled_bytes << std::endl;
    } else if (cmd == "publish") {  // publish PREFIX N BYTES: an A/B version of N tensors
      std::uint64_t bytes = 0;
      in >> bytes;
      std::vector<std::uint8_t> data(bytes, 7);
      std::vector<StateDictEntry> e(n);
      for (std::uint64_t i = 0; i < n; ++i) e[i] = {"t" + std::to_string(i), DType::u8, {static_cast<std::int64_t>(bytes)}, data.data()};
      publish_model(reg, name, e);
      std::cout << "ok" << std::endl;
    } else if (cmd == "open") {  // open PREFIX: every tensor of its current version here
      const auto t0 = mb::now_ns();
      auto m = open_model(reg, name, nullptr);
      const double ms = ms_since(t0);
      models.insert_or_assign(name, std::move(m));
      std::cout << "ms " << ms << " pulled " << reg.stats().process.pulled_bytes << std::endl;
    } else if (cmd == "remove") {
      held.erase(name);
      reg.remove(name);
      reg.flush();
      std::cout << "ok" << std::endl;
    } else {
      break;
    }
  }
  return 0;
}

// The next answer of `p` to `line` (none: its first line, "ready ...").
std::string ask(mb::ChildProcess& p, const std::string& line) {
  if (!line.empty()) p.write(line + "\n");
  for (;;) {
    auto l = p.read_line(std::chrono::minutes(5));
    if (!l) throw std::runtime_error("no answer to '" + line + "'");
    if (!l->empty() && (*l)[0] == '[') continue;  // UCX's own log lines
    if (l->rfind("ms ", 0) != 0 && *l != "ok" && l->rfind("ready", 0) != 0)
      throw std::runtime_error("'" + line + "': " + *l);
    return *l;
  }
}
double ms_of(const std::string& l) { return std::stod(l.substr(3)); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int parent(const mb::Args& a) {
  const auto sizes = mb::parse_size_list(a.get_or("--sizes", "64M,1G"));
  const std::string backend = a.get_or("--backend", "host");
  const int gpus = std::stoi(a.get_or("--gpus", "1"));
  if (backend != "host" && backend != "cuda") throw std::invalid_argument("--backend is host or cuda");
  int nodes = 0;
  const int reps = std::stoi(a.get_or("--reps", "3"));
  std::optional<mb::PrivateRedis> own;
  std::string url = a.get_or("--url", "");
  if (url.empty()) {
    own.emplace(mb::find_on_path("redis-server"));
    url = own->url();
  }
  char tmpl[] = "/tmp/memcuda-fleet-XXXXXX";
  if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
  const std::string dir = tmpl;
  std::vector<std::string> ucx_env;
  if (!std::getenv("UCX_TLS")) ucx_env.push_back("UCX_TLS=tcp");
  if (!std::getenv("UCX_NET_DEVICES")) ucx_env.push_back("UCX_NET_DEVICES=lo");
  // UCX emulates a get over TCP with messages of its segment size; its
  // defaults (8 KiB out, 64 KiB in) hold the loopback to about 1.2-1.4 GB/s
  // (docs/operations.md, "Fleets"). The yardstick and the nodes alike.
  if (!std::getenv("UCX_TCP_TX_SEG_SIZE") && !std::getenv("UCX_TCP_RX_SEG_SIZE"))
    ucx_env.insert(ucx_env.end(), {"UCX_TCP_TX_SEG_SIZE=512k", "UCX_TCP_RX_SEG_SIZE=512k"});
  auto node_env = [&](const std::string& id) {
    auto e = ucx_env;
    e.insert(e.end(), {"MEMCUDA_FLEET=1", "MEMCUDA_NODE_ID=" + id, "MEMCUDA_RUNTIME_DIR=" + dir + "/" + id});
    if (backend == "cuda") e.push_back("CUDA_VISIBLE_DEVICES=" + std::to_string(nodes++ % gpus));
    return e;
  };
  const std::string self = mb::self_exe().string();
  mb::ChildProcess na({self, "--child", "node", "--url", url, "--backend", backend}, node_env("bench-a"));
  mb::ChildProcess nb({self, "--child", "node", "--url", url, "--backend", backend}, node_env("bench-b"));
  ask(na, "");  // its "ready"
  ask(nb, "");
  mb::Table table({"size", "row", "median ms", "GB/s", "ratio"}, "llrrr");
  json::array out;
  auto row = [&](std::uint64_t size, const std::string& name, double ms, double ucx_ms) {
    table.add({mb::format_size(size), name, mb::fmt(ms, 2), mb::fmt(size / ms / 1e6, 2),
               ucx_ms > 0 ? mb::fmt(ucx_ms / ms, 2) : "-"});
    out.push_back(json::object{{"size", size}, {"row", name}, {"median_ms", ms}, {"gb_per_s", size / ms / 1e6}});
  };
  for (std::uint64_t size : sizes) {
    std::vector<double> ucx, pull, refresh, current;
    {
      mb::ChildProcess serve({self, "--child", "ucx-serve", "--bytes", std::to_string(size)}, ucx_env);
      mb::ChildProcess get({self, "--child", "ucx-pull"}, ucx_env);
      const std::string r = ask(serve, "");
      for (int i = 0; i <= reps; ++i) {
        const double ms = ms_of(ask(get, "get" + r.substr(5)));
        if (i) ucx.push_back(ms);  // the first connects the endpoint
      }
      serve.close_stdin();
      get.close_stdin();
      serve.wait();
      get.wait();
    }
    for (int i = 0; i < reps; ++i) {
      const std::string name = "bench/" + std::to_string(size) + "/" + std::to_string(i);
      ask(na, "create " + name + " " + std::to_string(size));
      pull.push_back(ms_of(ask(nb, "get " + name)));
      current.push_back(ms_of(ask(nb, "get " + name)));
      ask(na, "rewrite " + name);
      refresh.push_back(ms_of(ask(nb, "get " + name)));
      ask(na, "remove " + name);
    }
    // Three pairs at once: what UCX alone moves on this host when three
    // readers pull (the yardstick of model_3_nodes: "nodes" here share
    // the host's cores, memory and loopback).
    std::vector<double> ucx3;
    {
      std::vector<std::unique_ptr<mb::ChildProcess>> serves, gets;
      std::vector<std::string> r;
      for (int i = 0; i < 3; ++i) {
        serves.push_back(std::make_unique<mb::ChildProcess>(
            std::vector<std::string>{self, "--child", "ucx-serve", "--bytes", std::to_string(size)}, ucx_env));
        gets.push_back(std::make_unique<mb::ChildProcess>(std::vector<std::string>{self, "--child", "ucx-pull"}, ucx_env));
        r.push_back(ask(*serves.back(), ""));
      }
      for (int i = 0; i <= reps; ++i) {
        const auto t0 = mb::now_ns();
        for (int j = 0; j < 3; ++j) gets[j]->write("get" + r[j].substr(5) + "\n");
        for (auto& g : gets) ask(*g, "");
        if (i) ucx3.push_back(ms_since(t0));  // the first connects the endpoints
      }
      for (auto* v : {&serves, &gets})
        for (auto& p : *v) p->close_stdin();
      for (auto* v : {&serves, &gets})
        for (auto& p : *v) p->wait();
    }
    const double u = median(ucx);
    row(size, "ucx_get", u, u);
    row(size, "ucx_get, 3 pairs at once", median(ucx3), u);
    if (backend == "cuda") {
      const double path = u + staging_copies_ms(size);
      row(size, "staging_path", path, u);
      row(size, "fleet_pull / staging_path", median(pull), path);
      row(size, "fleet_refresh / staging_path", median(refresh), path);
    }
    row(size, "fleet_pull", median(pull), u);
    row(size, "fleet_refresh", median(refresh), u);
    row(size, "fleet_get_current", median(current), u);
  }
  // A model version on one other node, then on three more at once.
  const std::string model = a.get_or("--model", "16x64M");
  const auto x = model.find('x');
  const std::uint64_t tensors = std::stoull(model.substr(0, x)), each = mb::parse_size(model.substr(x + 1));
  ask(na, "publish m/ " + std::to_string(tensors) + " " + std::to_string(each));
  const double one = ms_of(ask(nb, "open m/"));
  std::vector<std::unique_ptr<mb::ChildProcess>> more;
  for (const char* id : {"bench-c", "bench-d", "bench-e"}) {
    more.push_back(std::make_unique<mb::ChildProcess>(std::vector<std::string>{self, "--child", "node", "--url", url, "--backend", backend},
                                                      node_env(id)));
    ask(*more.back(), "");
  }
  // Each new node gets a small tensor of node A first, as node B got the
  // rows' tensors before model_1_node: its GPU, mover, staging ring and
  // landing buffers are made before the clock starts (some 1.3 s per node
  // on an H200 host), so that the two rows time the same work.
  ask(na, "create bench/warm 16777216");
  for (auto& p : more) ask(*p, "get bench/warm");
  const auto t0 = mb::now_ns();
  for (auto& p : more) p->write("open m/\n");
  for (auto& p : more) ask(*p, "");
  const double three = ms_since(t0);
  const std::uint64_t total = tensors * each;
  row(total, "model_1_node", one, one);
  row(total, "model_3_nodes", three, one);
  for (auto& p : more) {
    p->close_stdin();
    p->wait();
  }
  na.close_stdin();
  nb.close_stdin();
  na.wait();
  nb.wait();
  std::cout << table.str();
  if (auto j = a.get("--json")) mb::write_file(*j, json::serialize(out) + "\n");
  return 0;
}

int child(const mb::Args& a) {
  const std::string role = a.get_or("--child", "");
  if (role == "ucx-serve") return ucx_serve(a);
  if (role == "ucx-pull") return ucx_pull(a);
  if (role == "node") return node(a);
  throw std::invalid_argument("unknown --child role '" + role + "'");
}

}  // namespace

int main(int argc, char** argv) {
  return mb::parent_or_child(argc, argv, "memcuda_bench_fleet", "child", child, parent);
}
