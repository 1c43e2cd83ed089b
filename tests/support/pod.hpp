// "Pods" for the container tests: a process started with unshare(1) in
// new pid, network, mount, UTS and IPC namespaces, with a private tmpfs on
// /dev/shm and a hostname of its own, as a Kubernetes pod without hostPID,
// hostNetwork or hostIPC. What it shares with the other pods is one
// directory, the Redis server's: the Redis socket and, under it, the
// runtime directory with the fd servers' sockets and the liveness locks.
// Needs root (or a kernel that lets the user make these namespaces).
#pragma once

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/worker.hpp"

namespace memcuda::test {

// argv that runs `inner` as the first process of a new pod named `name`,
// with `env` (NAME=value) added to its environment. SIGKILL of the
// returned process (unshare) kills the whole pod (--kill-child). With
// `share_network`, the pod keeps the host's network namespace (loopback
// included): a fake node of its own hostname, reached over TCP as another
// machine would be.
inline std::vector<std::string> pod_argv(const std::string& name, const std::vector<std::string>& env,
                                         const std::vector<std::string>& inner, bool share_network = false) {
  std::vector<std::string> argv{"/usr/bin/unshare", "--pid", "--mount", "--uts", "--ipc", "--fork",
                                "--kill-child", "--mount-proc", "--", "/bin/sh", "-c",
                                "mount -t tmpfs -o size=256m,mode=1777 pod-shm /dev/shm || exit 97; "
                                "hostname \"$1\" || exit 98; shift; exec /usr/bin/env \"$@\"",
                                "sh", name};
  if (!share_network) argv.insert(argv.begin() + 2, "--net");
  argv.insert(argv.end(), env.begin(), env.end());
  argv.insert(argv.end(), inner.begin(), inner.end());
  return argv;
}

// Why pods cannot run here, or nullopt when they can (a pod that checks its
// own /dev/shm is empty and its hostname is its own).
inline std::optional<std::string> pods_unavailable() {
  if (::geteuid() != 0) return "pods (unshare into new namespaces, mount a tmpfs) need root; CI runs the tests as root";
  if (::access("/usr/bin/unshare", X_OK) != 0) return "no /usr/bin/unshare (util-linux)";
  Child probe(pod_argv("memcuda-probe", {}, {"/bin/sh", "-c", "test -z \"$(ls -A /dev/shm)\" && test \"$(hostname)\" = memcuda-probe && echo pod-ok"}));
  auto l = probe.read_line(std::chrono::seconds(20));
  const int st = probe.wait();
  if (!l || *l != "pod-ok")
    return "unshare cannot make a pod here (exit status " + std::to_string(st) +
           "): the kernel or sandbox refuses new pid, network, mount, UTS or IPC namespaces";
  return std::nullopt;
}

// The directory the pods share: the Redis server's, opened to the pods'
// users (the server's socket is 0700 otherwise), with the runtime directory
// "rt" under it. Short: a runtime directory is at most 63 bytes.
struct PodVolume {
  explicit PodVolume(const RedisServer& srv) : dir(srv.dir().string()), runtime_dir(dir + "/rt") {
    ::chmod(dir.c_str(), 0755);
  }
  std::string dir, runtime_dir;
};

// memcuda_test_worker in a pod, on the shared Redis socket and runtime directory.
inline std::unique_ptr<Child> start_pod_worker(const std::string& pod, const RedisServer& srv, const PodVolume& vol,
                                               const std::vector<std::string>& args,
                                               std::vector<std::string> env = {}) {
  std::vector<std::string> inner{sibling_program("memcuda_test_worker"), "--url", srv.unix_url()};
  inner.insert(inner.end(), args.begin(), args.end());
  env.push_back("MEMCUDA_RUNTIME_DIR=" + vol.runtime_dir);
  return std::make_unique<Child>(pod_argv(pod, env, inner));
}

}  // namespace memcuda::test
