// Two copies of mem-cuda's implementation in one process are refused with a
// clear error (include/memcuda/detail/base/implementation_guard.hpp), and one
// alone works, also in a forked child that inherited the claim's variable.
//   memcuda_two_implementations LIB_A LIB_B    (MEMCUDA_TEST_REDIS_URL set)
// LIB_A and LIB_B are two builds of tests/two_implementations/probe.cpp,
// loaded RTLD_LOCAL as Python loads extension modules. This program links
// no mem-cuda itself.
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

using Open = int (*)(const char*, const char*, char*, std::size_t);
int failures = 0;
const char* url = nullptr;

void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what.c_str());
  std::fflush(stdout);
  if (!ok) ++failures;
}

Open load(const char* path) {
  void* h = ::dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    std::printf("FAIL: dlopen %s: %s\n", path, ::dlerror());
    std::exit(1);
  }
  return reinterpret_cast<Open>(::dlsym(h, "memcuda_probe_open"));
}

// rc and message of one registry open through `open`.
int open_with(Open open, const std::string& tensor, std::string& msg) {
  char buf[2048] = {};
  int rc = open(url, tensor.c_str(), buf, sizeof buf);
  msg = buf;
  return rc;
}

// Runs `body` in a forked child; true when it exited 0.
template <class F>
bool in_child(F body) {
  std::fflush(stdout);
  pid_t pid = ::fork();
  if (pid == 0) {
    body();
    std::fflush(stdout);
    ::_exit(failures == 0 ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  url = std::getenv("MEMCUDA_TEST_REDIS_URL");
  if (argc != 3 || url == nullptr) {
    std::fprintf(stderr, "usage: MEMCUDA_TEST_REDIS_URL=... %s LIB_A LIB_B\n", argv[0]);
    return 2;
  }
  const std::string tag = std::to_string(::getpid());
  std::string msg;

  // Each library alone, in a child of its own: works.
  for (const char* lib : {argv[1], argv[2]}) {
    check(in_child([&] {
            int rc = open_with(load(lib), "two-impl/alone-" + tag, msg);
            check(rc == 0, std::string(lib) + " alone opens a registry (" + msg + ")");
          }),
          std::string("a process with only ") + lib);
  }

  // Both in this process: the first claims it, the second is refused.
  Open a = load(argv[1]);
  Open b = load(argv[2]);
  int rc = open_with(a, "two-impl/a-" + tag, msg);
  check(rc == 0, "the first library opens a registry (" + msg + ")");
  rc = open_with(b, "two-impl/b-" + tag, msg);
  check(rc == 1 && msg.find("two copies of mem-cuda's implementation") != std::string::npos &&
            msg.find("Use one") != std::string::npos,
        "the second library's registry fails with InternalError naming what to do (rc " + std::to_string(rc) +
            ": " + msg + ")");
  rc = open_with(a, "two-impl/a2-" + tag, msg);
  check(rc == 0, "the first library still opens a registry (" + msg + ")");

  // A forked child inherits the variable with its parent's pid: not a claim
  // on the child, whose one copy works.
  check(in_child([&] {
          int crc = open_with(a, "two-impl/child-" + tag, msg);
          check(crc == 0, "a forked child opens a registry through the same copy (" + msg + ")");
        }),
        "the forked child");

  std::printf("%s\n", failures == 0 ? "two implementations: OK" : "two implementations: FAILED");
  return failures == 0 ? 0 : 1;
}
