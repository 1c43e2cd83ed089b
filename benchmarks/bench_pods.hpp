// --pods: benchmark children run as containers would, each the first
// process of its own pid, network, mount, UTS and IPC namespaces with a
// private /dev/shm (unshare(1)), sharing with the parent only files: the
// private Redis server's unix socket and the runtime directory. The rows
// taken so sit beside the same rows taken from the parent's namespaces, in
// the same run (docs/benchmarks.md, "Across containers").
#pragma once

#include <unistd.h>

#include <optional>
#include <string>
#include <vector>

#include "bench_common.hpp"

namespace memcuda::bench {

// `argv` as the first process of a new pod named `name`. A SIGKILL of the
// returned command's process (unshare) kills the whole pod.
inline std::vector<std::string> in_pod(const std::string& name, const std::vector<std::string>& argv) {
  std::vector<std::string> out{"/usr/bin/unshare", "--pid", "--net", "--mount", "--uts", "--ipc", "--fork",
                               "--kill-child", "--mount-proc", "--", "/bin/sh", "-c",
                               "mount -t tmpfs -o mode=1777 bench-pod-shm /dev/shm || exit 97; "
                               "hostname \"$1\" || exit 98; shift; exec \"$@\"",
                               "sh", name};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

// Why pods cannot be made here (nullopt: they can). `redis_url` must be a
// unix socket: a pod has a network namespace of its own.
inline std::optional<std::string> pods_unavailable(const std::string& redis_url) {
  if (::geteuid() != 0) return "--pods needs root (unshare into new namespaces, mount a tmpfs)";
  if (::access("/usr/bin/unshare", X_OK) != 0) return "--pods needs /usr/bin/unshare (util-linux)";
  if (redis_url.rfind("unix://", 0) != 0)
    return "--pods needs Redis on a unix socket (a pod has its own network): leave --url out (a private server)";
  auto r = capture(in_pod("bench-probe", {"/bin/sh", "-c", "test -z \"$(ls -A /dev/shm)\" && echo pod-ok"}),
                   std::chrono::milliseconds(20000));
  if (!r || r->find("pod-ok") == std::string::npos)
    return "unshare cannot make a pod here (new pid, network, mount, UTS or IPC namespaces refused)";
  return std::nullopt;
}

}  // namespace memcuda::bench
