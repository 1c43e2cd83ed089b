// memcuda_test_worker: a real mem-cuda process driven by the tests over
// stdin/stdout, one command per line, one reply line each ("OK ..." or
// "ERR <code> <message>"; a KindUnavailable: "ERR unavailable
// kind_reason=<reason> <message>").
//
//   memcuda_test_worker --url URL [--ns N] [--no-control] [--ttl MS] [--session-ttl MS] [--backend host|cuda]
//                       [--uid UID] (drop to that user first; root only)
//   commands: create|createp NAME D0,D1,.. FILL | get NAME | release NAME | remove NAME
//             | fill NAME VALUE | sum NAME | leader | info NAME | gc | trim | stats
//             | pattern NAME SEED (a distinct value per element) | digest NAME (FNV-1a of its bytes, its pointer)
//             | meminfo (cuda) | exit
//             | publishver PREFIX | version PREFIX | waitver PREFIX AFTER TIMEOUT_MS [NAME]
//             | waitver-gpu PREFIX AFTER TIMEOUT_MS NAME | sumheld-nowait NAME (test kernels)
//             | opensd PREFIX (open_state_dict, held) | closesd PREFIX
//             | getprefix PREFIX (get_prefix, every tensor held: "OK n=<count>")
//             | share NAME COUNT FILL (a memfd buffer of its own, shared without a copy: "OK gen=<g> ptr=<p>")
//             | openmodel|sumpinned|advance|closemodel PREFIX (A/B versions: "OK version=V sum=S")
//             | advance-nosum PREFIX ("OK moved=M version=V")
//             | beginver PREFIX DIMS VALUE (stages tensor "w", held) | commitver PREFIX
//             | advance-gpu PREFIX (test kernels: advance on a stream, then sum there)
#include <grp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "memcuda/model.hpp"
#include "memcuda/model_ab.hpp"
#include "memcuda/state_dict.hpp"

#if defined(MEMCUDA_TEST_KERNELS)
extern "C" cudaError_t memcuda_test_slow_fill(float* p, std::size_t n, float v, unsigned spin_ms, cudaStream_t s);
extern "C" cudaError_t memcuda_test_sum(const float* p, std::size_t n, double* out, cudaStream_t s);
#endif

using namespace memcuda;

namespace {

Shape parse_dims(const std::string& s) {
  Shape out;
  if (s == "-") return out;
  std::stringstream ss(s);
  std::string d;
  while (std::getline(ss, d, ',')) out.push_back(std::stoll(d));
  return out;
}

const SharedTensor<float>& held_tensor(const std::multimap<std::string, SharedTensor<float>>& held,
                                       const std::string& name) {
  auto it = held.find(name);
  if (it == held.end()) throw NotFound("this worker holds no '" + name + "'");
  return it->second;
}

#if defined(MEMCUDA_TEST_KERNELS)
// Sums a tensor with a kernel on `s` (which may wait on a producer's event).
double gpu_sum(const SharedTensor<float>& t, cudaStream_t s) {
  double* d = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&d), sizeof(double)) != cudaSuccess) throw Error("cudaMalloc failed");
  if (memcuda_test_sum(t.data(), t.size(), d, s) != cudaSuccess) throw Error("sum kernel failed");
  double h = 0;
  cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, s);
  if (cudaStreamSynchronize(s) != cudaSuccess) throw Error("stream sync failed");
  cudaFree(d);
  return h;
}
#endif

double checksum(const SharedTensor<float>& t) {
  std::vector<float> host(t.size());
  t.copy_to_host(host);
  double s = 0;
  for (float v : host) s += v;
  return s;
}

// The sum of a pinned model's f32 tensors, with its version.
std::string pinned_line(const PinnedModel& m) {
  double total = 0;
  for (auto& [k, t] : m.tensors())
    if (t.dtype() == DType::f32) total += checksum(SharedTensor<float>(t.handle()));
  std::ostringstream o;
  o << std::setprecision(17) << "version=" << m.version() << " sum=" << total;
  return o.str();
}

void fill(const SharedTensor<float>& t, float v) {
  std::vector<float> host(t.size(), v);
  t.copy_from_host(host);
}

}  // namespace

int main(int argc, char** argv) {
  RegistryOptions o = RegistryOptions::from_env();  // tests pass MEMCUDA_CUDA_ALLOCATION etc. to workers
  std::optional<BackendKind> backend;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--url") o.redis = redis::parse_url(next());
    else if (a == "--ns") o.name_space = next();
    else if (a == "--no-control") o.control_thread = false;
    else if (a == "--ttl") o.lease_ttl = std::chrono::milliseconds(std::stoll(next()));
    else if (a == "--session-ttl") o.session_ttl = std::chrono::milliseconds(std::stoll(next()));
    else if (a == "--timeout") o.request_timeout = std::chrono::milliseconds(std::stoll(next()));
    else if (a == "--backend") backend = backend_from_string(next());
    else if (a == "--linger") o.release_linger = std::chrono::milliseconds(std::stoll(next()));
    else if (a == "--uid") {  // runs as that user (and group): a peer of another user; needs root
      const auto uid = static_cast<uid_t>(std::stoul(next()));
      if (::setgroups(0, nullptr) != 0 || ::setgid(uid) != 0 || ::setuid(uid) != 0) {
        std::cout << "ERR setuid " << std::strerror(errno) << std::endl;
        return 1;
      }
    }
    else {
      std::cerr << "unknown argument " << a << "\n";
      return 2;
    }
  }
  o.default_backend = backend;
  std::optional<TensorRegistry> reg;
  try {
    reg.emplace(o);
  } catch (const Error& e) {
    std::cout << "ERR " << e.code() << " " << e.what() << std::endl;
    return 1;
  }
  std::cout << "READY leader=" << reg->is_leader() << " pid=" << ::getpid() << std::endl;
  std::multimap<std::string, SharedTensor<float>> held;
  std::map<std::string, StateDict> dicts;
  std::vector<SharedTensor<void>> held_many;
  std::map<std::string, PinnedModel> models;
  std::map<std::string, ModelVersionWriter> writers;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd, name;
    in >> cmd >> name;
    std::ostringstream out;
    out << std::setprecision(17);  // sums are integers: print them whole
    try {
      if (cmd == "create" || cmd == "createp") {
        std::string dims;
        float v = 0;
        in >> dims >> v;
        CreateOptions co;
        co.persistent = cmd == "createp";
        auto t = reg->create<float>(name, parse_dims(dims), co);
        fill(t, v);
        out << "OK gen=" << t.generation();
        held.emplace(name, std::move(t));
      } else if (cmd == "share") {  // TensorRegistry::share of a memfd buffer this worker makes
        std::size_t n = 0;
        float v = 0;
        in >> n >> v;
        const int fd = ::memfd_create("worker-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(n * sizeof(float))) != 0) throw Error("memfd failed");
        void* p = ::mmap(nullptr, n * sizeof(float), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) throw Error("mmap failed");
        std::fill_n(static_cast<float*>(p), n, v);
        ShareOptions so;
        so.keep_alive = std::shared_ptr<void>(p, [fd, n](void* q) {
          ::munmap(q, n * sizeof(float));
          ::close(fd);
        });
        auto t = SharedTensor<float>(reg->share(name, p, DType::f32, {static_cast<std::int64_t>(n)}, so).handle());
        out << "OK gen=" << t.generation() << " ptr=" << reinterpret_cast<std::uintptr_t>(t.data());
        held.emplace(name, std::move(t));
      } else if (cmd == "get") {
        auto t = reg->get<float>(name);
        out << "OK gen=" << t.generation() << " refcount=" << reg->info(name).refcount << " sum=" << checksum(t);
        held.emplace(name, std::move(t));
      } else if (cmd == "getprefix") {
        auto got = reg->get_prefix(name);
        for (auto& [n, t] : got.tensors) held_many.push_back(std::move(t));
        out << "OK n=" << got.tensors.size() << " errors=" << got.errors.size();
      } else if (cmd == "opensd") {
        auto sd = open_state_dict(*reg, name);
        double total = 0;
        for (auto& [k, t] : sd)
          if (t.dtype() == DType::f32) total += checksum(SharedTensor<float>(t.handle()));
        out << "OK count=" << sd.size() << " sum=" << total;
        dicts[name] = std::move(sd);
      } else if (cmd == "closesd") {
        dicts.erase(name);
        reg->flush();
        out << "OK";
      } else if (cmd == "getany") {
        auto t = reg->get<void>(name);
        out << "OK gen=" << t.generation() << " dtype=" << to_string(t.dtype());
      } else if (cmd == "release") {
        auto it = held.find(name);
        if (it == held.end()) throw NotFound("this worker holds no '" + name + "'");
        held.erase(it);
        reg->flush();  // releases are sent in the background: the parent reads Redis next
        out << "OK";
      } else if (cmd == "drop") {  // like release, without flush(): a release that lingers stays
        auto it = held.find(name);
        if (it == held.end()) throw NotFound("this worker holds no '" + name + "'");
        held.erase(it);
        out << "OK";
      } else if (cmd == "remove") {
        reg->remove(name);
        out << "OK";
      } else if (cmd == "fill") {
        float v = 0;
        in >> v;
        auto it = held.find(name);
        if (it == held.end()) throw NotFound("this worker holds no '" + name + "'");
        fill(it->second, v);
        out << "OK";
      } else if (cmd == "pattern") {
        std::uint64_t seed = 0;
        in >> seed;
        auto it = held.find(name);
        if (it == held.end()) throw NotFound("this worker holds no '" + name + "'");
        std::vector<float> host(it->second.size());
        for (std::size_t i = 0; i < host.size(); ++i)  // exact in a float: below 2^24
          host[i] = static_cast<float>((i * 2654435761u + seed) % 1000003u);
        it->second.copy_from_host(host);
        out << "OK";
      } else if (cmd == "digest") {
        auto it = held.find(name);
        if (it == held.end()) throw NotFound("this worker holds no '" + name + "'");
        std::vector<float> host(it->second.size());
        it->second.copy_to_host(host);
        std::uint64_t h = 1469598103934665603ull;
        for (unsigned char c : std::string_view(reinterpret_cast<const char*>(host.data()), host.size() * sizeof(float)))
          h = (h ^ c) * 1099511628211ull;
        out << "OK fnv=" << std::hex << h << std::dec << " ptr=" << static_cast<const void*>(it->second.data());
      } else if (cmd == "sum") {
        auto it = held.find(name);
        if (it == held.end()) throw NotFound("this worker holds no '" + name + "'");
        out << "OK sum=" << checksum(it->second) << " valid=" << it->second.valid();
      } else if (cmd == "stats") {
        auto st = reg->stats();
        out << "OK import_opens=" << st.process.import_opens << " live_imports=" << st.process.live_imports
            << " pools=" << st.pools.size();
        if (!st.pools.empty())
          out << " in_use=" << st.pools[0].in_use << " reserved=" << st.pools[0].reserved
              << " adopted_bytes=" << st.pools[0].adopted_bytes << " copied_bytes=" << st.pools[0].copied_bytes;
        out << " fd_requests=" << st.process.fd_requests << " fd_parked=" << st.process.fd_parked
            << " fd_parked_hits=" << st.process.fd_parked_hits;
#if MEMCUDA_HAS_CUDA()
      } else if (cmd == "replicate") {  // replicate <name> <ordinal>[,<ordinal>...]
        std::string devs;
        in >> devs;
        ReplicateOptions o;
        for (std::size_t p = 0; p < devs.size();) {
          const auto q = std::min(devs.find(',', p), devs.size());
          o.devices.push_back(std::stoi(devs.substr(p, q - p)));
          p = q + 1;
        }
        out << "OK n=" << replicate(*reg, name, o).size();
      } else if (cmd == "getlocal") {
        // This device's replica when there is one (else the source), its
        // copy waited for on a stream.
        cudaStream_t s{};
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        GetOptions o;
        o.replica = LocalReplica::use;
        o.stream = s;
        auto t = reg->get<float>(name, o);
        if (cudaStreamSynchronize(s) != cudaSuccess) throw Error("stream sync failed");
        cudaStreamDestroy(s);
        out << "OK gen=" << t.generation() << " name=" << t.name() << " device=" << t.device()
            << " sum=" << checksum(t);
        held.emplace(name, std::move(t));
#endif
#if defined(MEMCUDA_TEST_KERNELS)
      } else if (cmd == "getsum" || cmd == "getsum-nowait") {
        // Opens on a fresh stream (waiting on the producer's event unless
        // -nowait) and sums with a kernel on that stream: the value shows
        // whether the producer's slow kernel had finished.
        cudaStream_t s{};
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        auto t = cmd == "getsum" ? reg->get<float>(name, s) : reg->get<float>(name);
        double* d = nullptr;
        cudaMalloc(reinterpret_cast<void**>(&d), sizeof(double));
        if (memcuda_test_sum(t.data(), t.size(), d, s) != cudaSuccess) throw Error("sum kernel failed");
        double h = 0;
        cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, s);
        if (cudaStreamSynchronize(s) != cudaSuccess) throw Error("stream sync failed");
        cudaFree(d);
        cudaStreamDestroy(s);
        out << "OK sum=" << h;
#endif
      } else if (cmd == "openmodel") {
        auto& m = models[name] = open_model(*reg, name);
        out << "OK " << pinned_line(m);
      } else if (cmd == "sumpinned" || cmd == "advance" || cmd == "advance-nosum") {
        auto it = models.find(name);
        if (it == models.end()) throw NotFound("this worker pins no model '" + name + "'");
        if (cmd == "advance-nosum") out << "OK moved=" << it->second.advance() << " version=" << it->second.version();
        else if (cmd == "advance") out << "OK moved=" << it->second.advance() << " " << pinned_line(it->second);
        else out << "OK " << pinned_line(it->second);
      } else if (cmd == "closemodel") {
        models.erase(name);
        reg->flush();
        out << "OK";
      } else if (cmd == "beginver") {
        std::string dims;
        float v = 0;
        in >> dims >> v;
        auto w = begin_model_version(*reg, name, {{"w", DType::f32, parse_dims(dims), nullptr}});
        fill(SharedTensor<float>(w.tensors().at("w").handle()), v);
        out << "OK version=" << w.version();
        writers[name] = std::move(w);
      } else if (cmd == "commitver") {
        out << "OK version=" << writers.at(name).commit();
        writers.erase(name);
#if defined(MEMCUDA_TEST_KERNELS)
      } else if (cmd == "advance-gpu") {
        // A consumer stream ordered by advance(), then a sum kernel on it.
        cudaStream_t s{};
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        auto& m = models.at(name);
        const bool moved = m.advance(s);
        out << "OK moved=" << moved << " version=" << m.version()
            << " sum=" << gpu_sum(SharedTensor<float>(m.tensors().at("w").handle()), s);
        cudaStreamDestroy(s);
#endif
      } else if (cmd == "publishver") {  // host: the writes (fill) are done, publish
        out << "OK version=" << publish_version(*reg, name);
      } else if (cmd == "version") {
        out << "OK version=" << current_version(*reg, name);
      } else if (cmd == "waitver") {
        // Waits for a version > AFTER of model NAME (a prefix); then the
        // held tensor's sum, read after the wait (host backend).
        std::uint64_t after = 0;
        long long ms = 0;
        std::string tensor;
        in >> after >> ms >> tensor;
        auto v = wait_version(*reg, name, after, std::chrono::milliseconds(ms));
        if (!v) {
          out << "OK timeout";
        } else {
          out << "OK version=" << *v;
          if (!tensor.empty()) out << " sum=" << checksum(held_tensor(held, tensor));
        }
#if defined(MEMCUDA_TEST_KERNELS)
      } else if (cmd == "waitver-gpu" || cmd == "sumheld-nowait") {
        // A consumer stream: stream-ordered on the version (waitver-gpu), or
        // not at all (the negative control), then a sum kernel on it.
        cudaStream_t s{};
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        std::string tensor = name;
        if (cmd == "waitver-gpu") {
          std::uint64_t after = 0;
          long long ms = 0;
          in >> after >> ms >> tensor;
          auto v = wait_version(*reg, name, after, std::chrono::milliseconds(ms), s);
          if (!v) {
            cudaStreamDestroy(s);
            throw TimeoutError("no version after " + std::to_string(after));
          }
          out << "OK version=" << *v << " sum=" << gpu_sum(held_tensor(held, tensor), s);
        } else {
          out << "OK sum=" << gpu_sum(held_tensor(held, tensor), s);
        }
        cudaStreamDestroy(s);
#endif
      } else if (cmd == "gc") {
        auto r = reg->collect_garbage();
        out << "OK dead=" << r.dead_holders << " dropped=" << r.references_dropped << " freed=" << r.tensors_freed
            << " migrated=" << r.tensors_migrated << " lost=" << r.tensors_lost;
      } else if (cmd == "trim") {
        out << "OK slabs=" << reg->trim();
#if MEMCUDA_HAS_CUDA()
      } else if (cmd == "meminfo") {
        // free device memory as the driver sees it (device 0)
        std::size_t free = 0, total = 0;
        if (cudaMemGetInfo(&free, &total) != cudaSuccess) throw Error("cudaMemGetInfo failed");
        out << "OK free=" << free << " total=" << total;
#endif
      } else if (cmd == "leader") {
        out << "OK leader=" << reg->is_leader();
      } else if (cmd == "info") {
        auto i = reg->info(name);
        out << "OK refcount=" << i.refcount << " gen=" << i.generation << " owner_pid=" << i.owner_pid;
      } else if (cmd == "exit") {
        held.clear();
        models.clear();
        writers.clear();
        reg.reset();
        std::cout << "OK" << std::endl;
        return 0;
      } else {
        out << "ERR invalid_argument unknown command '" << cmd << "'";
      }
    } catch (const KindUnavailable& e) {  // the reason, for tests of what a reader lacks
      out.str("");
      out << "ERR " << e.code() << " kind_reason=" << to_string(e.reason()) << " " << e.what();
    } catch (const Error& e) {
      out.str("");
      out << "ERR " << e.code() << " " << e.what();
    } catch (const std::exception& e) {
      out.str("");
      out << "ERR exception " << e.what();
    }
    std::cout << out.str() << std::endl;
  }
  return 0;
}
