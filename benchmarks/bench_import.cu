// The steps of a fresh process's first open of one large allocation, cuMem
// (an fd) against legacy IPC, each timed on its own, and the first touch of
// every 2 MiB page after it: where the cuMem open's extra time goes.
//
//   bench_import [--gib G] [--reps N] [--device D]
//
// The parent allocates G GiB twice on device D (cuMemCreate exported as an
// fd; cudaMalloc with its IPC handle) and starts N fresh children for each,
// alternating; each child creates its context (not timed), opens, touches,
// and prints one line of microseconds. The parent prints the medians.
#include <cuda.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* s = nullptr;
  cuGetErrorString(r, &s);
  std::fprintf(stderr, "%s: %s\n", what, s ? s : "?");
  std::exit(2);
}
void check(cudaError_t r, const char* what) {
  if (r == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(r));
  std::exit(2);
}

// One load per 2 MiB page: the cost of the first touch of every page.
__global__ void touch(const unsigned* p, std::size_t pages, unsigned* sink) {
  std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
  if (i < pages && p[i * (std::size_t(2) << 20) / sizeof(unsigned)] == 0xdeadbeefu) atomicAdd(sink, 1u);
}

double touch_all(CUdeviceptr p, std::size_t bytes) {
  unsigned* sink = nullptr;
  check(cudaMalloc(&sink, sizeof(unsigned)), "cudaMalloc");
  std::size_t pages = bytes >> 21;
  auto t = Clock::now();
  touch<<<unsigned((pages + 255) / 256), 256>>>(reinterpret_cast<const unsigned*>(p), pages, sink);
  check(cudaDeviceSynchronize(), "touch");
  double us = us_since(t);
  cudaFree(sink);
  return us;
}

CUmemAllocationProp prop(int device) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

// The child: argv = self --child vmm|ipc device bytes fd|handle-hex.
int child(const std::string& kind, int device, std::size_t bytes, const std::string& arg) {
  check(cudaSetDevice(device), "cudaSetDevice");
  check(cudaFree(nullptr), "context");
  std::ostringstream out;
  auto t0 = Clock::now();
  CUdeviceptr p = 0;
  if (kind == "vmm") {
    CUmemGenericAllocationHandle h{};
    auto t = Clock::now();
    check(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(std::strtoull(arg.c_str(), nullptr, 10)),
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
          "import");
    out << " import " << us_since(t);
    t = Clock::now();
    check(cuMemAddressReserve(&p, bytes, 0, 0, 0), "reserve");
    out << " reserve " << us_since(t);
    t = Clock::now();
    check(cuMemMap(p, bytes, 0, h, 0), "map");
    out << " map " << us_since(t);
    CUmemAccessDesc a{};
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = device;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    t = Clock::now();
    check(cuMemSetAccess(p, bytes, &a, 1), "set access");
    out << " set_access " << us_since(t);
    CUdeviceptr b = 0;
    std::size_t sz = 0;
    check(cuMemGetAddressRange(&b, &sz, p + bytes / 2), "cuMemGetAddressRange");
    if (b != p || sz != bytes) {
      std::fprintf(stderr, "cuMemGetAddressRange: %llx+%zu, mapped %llx+%zu\n", (unsigned long long)b, sz,
                   (unsigned long long)p, bytes);
      return 2;
    }
    int n = 0;
    cudaGetDeviceCount(&n);
    double peers = 0;
    for (int i = 0; i < n; ++i) {
      int can = 0;
      if (i == device || cudaDeviceCanAccessPeer(&can, i, device) != cudaSuccess || !can) continue;
      a.location.id = i;
      t = Clock::now();
      check(cuMemSetAccess(p, bytes, &a, 1), "set access (peer)");
      peers += us_since(t);
    }
    out << " set_access_peers " << peers;
    cuMemRelease(h);
  } else {
    cudaIpcMemHandle_t h{};
    for (std::size_t i = 0; i < sizeof h; ++i) h.reserved[i] = char(std::stoi(arg.substr(2 * i, 2), nullptr, 16));
    void* v = nullptr;
    auto t = Clock::now();
    check(cudaIpcOpenMemHandle(&v, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
    out << " ipc_open " << us_since(t);
    p = reinterpret_cast<CUdeviceptr>(v);
  }
  out << " open " << us_since(t0);
  out << " first_touch " << touch_all(p, bytes) << " second_touch " << touch_all(p, bytes);
  std::printf("%s%s\n", kind.c_str(), out.str().c_str());
  return 0;
}

std::map<std::string, std::vector<double>> run_child(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int pipefd[2];
  if (pipe(pipefd) != 0) std::exit(2);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
  pid_t pid = 0;
  if (posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ) != 0) std::exit(2);
  close(pipefd[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(pipefd[0], buf, sizeof buf)) > 0;) text.append(buf, std::size_t(n));
  close(pipefd[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    std::fprintf(stderr, "child failed: %s\n", text.c_str());
    std::exit(2);
  }
  std::istringstream in(text);
  std::string kind, key;
  double v = 0;
  in >> kind;
  std::map<std::string, std::vector<double>> r;
  while (in >> key >> v) r[kind + " " + key].push_back(v);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 6 && std::string(argv[1]) == "--child")
    return child(argv[2], std::atoi(argv[3]), std::strtoull(argv[4], nullptr, 10), argv[5]);
  double gib = 12.55;  // the Llama-2-7B-shaped state dict, one allocation
  int reps = 5, device = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string f = argv[i];
    if (f == "--gib") gib = std::atof(argv[i + 1]);
    else if (f == "--reps") reps = std::atoi(argv[i + 1]);
    else if (f == "--device") device = std::atoi(argv[i + 1]);
    else { std::fprintf(stderr, "usage: bench_import [--gib G] [--reps N] [--device D]\n"); return 2; }
  }
  check(cudaSetDevice(device), "cudaSetDevice");
  check(cudaFree(nullptr), "context");
  CUmemAllocationProp pr = prop(device);
  std::size_t g = 0;
  check(cuMemGetAllocationGranularity(&g, &pr, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "granularity");
  std::size_t bytes = (std::size_t(gib * double(1ull << 30)) + g - 1) / g * g;
  CUmemGenericAllocationHandle h{};
  check(cuMemCreate(&h, bytes, &pr, 0), "cuMemCreate");
  int fd = -1;
  check(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), "export");
  fcntl(fd, F_SETFD, 0);  // the children inherit it
  void* legacy = nullptr;
  check(cudaMalloc(&legacy, bytes), "cudaMalloc");
  cudaIpcMemHandle_t ih{};
  check(cudaIpcGetMemHandle(&ih, legacy), "cudaIpcGetMemHandle");
  char hex[2 * sizeof ih + 1];
  for (std::size_t i = 0; i < sizeof ih; ++i) std::snprintf(hex + 2 * i, 3, "%02x", unsigned(uint8_t(ih.reserved[i])));
  int n = 0;
  cudaGetDeviceCount(&n);
  std::printf("bench_import: %zu bytes on device %d of %d, granularity %zu, %d fresh children each\n", bytes, device,
              n, g, reps);
  std::map<std::string, std::vector<double>> all;
  for (int r = 0; r < reps; ++r)
    for (const char* kind : {"vmm", "ipc"}) {
      std::string arg = std::string(kind) == "vmm" ? std::to_string(fd) : std::string(hex);
      for (auto& [k, v] : run_child({argv[0], "--child", kind, std::to_string(device), std::to_string(bytes), arg}))
        all[k].insert(all[k].end(), v.begin(), v.end());
    }
  for (auto& [k, v] : all) {
    std::sort(v.begin(), v.end());
    std::printf("%-24s median %10.1f us  min %10.1f us\n", k.c_str(), v[v.size() / 2], v.front());
  }
  return 0;
}
