// memcuda_fd_peer: a real process for tests/test_fd_transfer.cpp. It reads
// one command per line on stdin and answers one line on stdout:
//   serve ADDR                 run an FdServer at ADDR on a thread   -> ok PID
//   memfd ID TEXT              make a memfd holding TEXT, serve it  -> ok FD DEV INO
//   hold ID ADDR               fetch ID from ADDR (socket), keep it, serve it too -> ok FD DEV INO
//   fetch MODE ID ADDR [PID RFD DEV INO]   MODE: socket|pidfd|auto  -> ok socket|pidfd TEXT
//   read ID                    the text of a held or made fd        -> ok TEXT
//   stats                      -> ok SERVED REFUSED PIDFD_DISABLED_ERRNO
//   limit EXTRA                soft = hard RLIMIT_NOFILE = lowest free fd + EXTRA -> ok LOWEST
//   setuid UID                 drop to UID (and gid UID, no groups)  -> ok
//   newpidns                   continue in a child in a new pid namespace -> ok
//   newnetns                   move to a new network namespace      -> ok
// The registry's fd service (fd_service.hpp), IDS a comma list or "-":
//   use DIR UIDS GIDS          pin the process's runtime dir and policy -> ok
//   service                    start the service                    -> ok ADDRESS
//   servefd ID TEXT            a memfd holding TEXT, served by it    -> ok FD_SOURCE
//   open MODE OWNER_PID FD_SOURCE   check the source as a reader does, fetch -> ok socket|pidfd TEXT
// Batches and prefetch (fd_wire.hpp, fd_table.hpp):
//   drop ID                    stop serving ID and close it (the owner frees it) -> ok
//   prefetch N MS              FdTable::configure(N, MS)            -> ok
//   fetchsock ID ADDR          fetch_fd over the socket (offers parked) -> ok TEXT
//   many ADDR IDS              fetch_many, IDS "1,2,3"   -> ok ID=TEXT|ID!REASON ...
//   parked                     -> ok PARKED HITS DROPPED REQUESTS
//   expire                     FdTable::expire                      -> ok
//   forget OWNER ALLOC         FdTable::drop_allocation             -> ok
//   memfds                     memfds open in this process           -> ok N
//   sstats                     -> ok REQUESTS OFFERED (the server's)
// Failures answer "err REASON message" (REASON: FdErrc name, bad_record, or "error").
#include <sched.h>
#include <grp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include <dirent.h>

#include "memcuda/detail/fd/fd_client.hpp"
#include "memcuda/detail/fd/fd_server.hpp"
#include "memcuda/detail/fd/fd_service.hpp"
#include "memcuda/detail/fd/fd_source.hpp"
#include "memcuda/detail/fd/fd_table.hpp"
#include "memcuda/detail/process/process.hpp"

using namespace memcuda::detail;

namespace {

std::unique_ptr<FdServer> server;
std::jthread server_thread;
std::map<std::uint64_t, UniqueFd> fds;  // made or held, by allocation id
std::shared_ptr<void> pin;
std::shared_ptr<FdService> service;
std::map<std::uint64_t, std::unique_ptr<ServedFd>> served;

std::vector<std::uint32_t> ids(const std::string& text) {
  return text == "-" ? std::vector<std::uint32_t>{} : parse_id_list(text, "ids");
}

std::string read_all(int fd) {
  std::string out(4096, '\0');
  ssize_t n = ::pread(fd, out.data(), out.size(), 0);
  out.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  return out;
}

std::string describe(std::uint64_t id, int fd) {
  if (server) server->add(id, fd, "host:peer:" + std::to_string(id));
  FdIdentity idn = fd_identity(fd);
  return "ok " + std::to_string(fd) + " " + std::to_string(idn.dev) + " " + std::to_string(idn.ino);
}

std::string run(const std::string& line) {
  std::istringstream in(line);
  std::string cmd;
  in >> cmd;
  if (cmd == "serve") {
    std::string addr;
    in >> addr;
    server = std::make_unique<FdServer>(FdServerOptions{addr});
    server_thread = std::jthread([s = server.get()] {
      while (s->serve_once(std::chrono::milliseconds(200)) != ServeResult::stopped) {
      }
    });
    return "ok " + std::to_string(::getpid());
  }
  if (cmd == "memfd") {
    std::uint64_t id;
    std::string text;
    in >> id >> text;
    UniqueFd fd(::memfd_create("memcuda-fd-peer", MFD_CLOEXEC));
    if (!fd || ::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
      return std::string("err error memfd: ") + std::strerror(errno);
    std::string r = describe(id, fd.get());
    fds[id] = std::move(fd);
    return r;
  }
  if (cmd == "hold") {
    std::uint64_t id;
    std::string addr;
    in >> id >> addr;
    UniqueFd fd = fetch_fd(addr, id);
    std::string r = describe(id, fd.get());
    fds[id] = std::move(fd);
    return r;
  }
  if (cmd == "fetch") {
    std::string mode;
    FdSource src;
    std::uint64_t id;
    in >> mode >> id >> src.address >> src.pid >> src.remote_fd >> src.identity.dev >> src.identity.ino;
    FetchOptions opt;
    opt.path = mode == "socket" ? FdPath::socket_only : mode == "pidfd" ? FdPath::pidfd_only : FdPath::automatic;
    Fetched f = fetch(src, id, opt);
    return std::string("ok ") + (f.via_pidfd ? "pidfd " : "socket ") + read_all(f.fd.get());
  }
  if (cmd == "read") {
    std::uint64_t id;
    in >> id;
    auto it = fds.find(id);
    return it == fds.end() ? "err error no such id" : "ok " + read_all(it->second.get());
  }
  if (cmd == "stats") {
    return "ok " + std::to_string(server ? server->served() : service ? service->served() : 0) + " " +
           std::to_string(server ? server->refused() : service ? service->refused() : 0) + " " +
           std::to_string(pidfd_fast_path_disabled_errno());
  }
  if (cmd == "limit") {
    rlim_t extra;
    in >> extra;
    int lowest = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    ::close(lowest);
    rlimit rl{static_cast<rlim_t>(lowest) + extra, static_cast<rlim_t>(lowest) + extra};
    if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) return std::string("err error setrlimit: ") + std::strerror(errno);
    return "ok " + std::to_string(lowest);
  }
  if (cmd == "setuid") {
    unsigned uid;
    in >> uid;
    if (::setgroups(0, nullptr) != 0 || ::setresgid(uid, uid, uid) != 0 || ::setresuid(uid, uid, uid) != 0)
      return std::string("err error setuid: ") + std::strerror(errno);
    return "ok";
  }
  if (cmd == "newnetns") {
    if (::unshare(CLONE_NEWNET) != 0) return std::string("err error unshare(CLONE_NEWNET): ") + std::strerror(errno);
    return "ok";
  }
  if (cmd == "use") {
    std::string dir, uids, gids;
    in >> dir >> uids >> gids;
    pin.reset();
    pin = FdService::pin(FdAccess{dir, ids(uids), ids(gids)});
    return "ok";
  }
  if (cmd == "service") {
    service = FdService::acquire();
    return "ok " + service->address();
  }
  if (cmd == "servefd") {
    std::uint64_t id;
    std::string text;
    in >> id >> text;
    UniqueFd fd(::memfd_create("memcuda-fd-peer", MFD_CLOEXEC));
    if (!fd || ::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
      return std::string("err error memfd: ") + std::strerror(errno);
    if (!service) service = FdService::acquire();
    auto s = std::make_unique<ServedFd>(service, std::move(fd), "k" + std::to_string(id), "t");
    std::string r = "ok " + s->source_text();
    served[id] = std::move(s);
    return r;
  }
  if (cmd == "open") {
    std::string mode, text;
    std::int64_t owner = 0;
    in >> mode >> owner >> text;
    ServedSource src = decode_fd_source(text);
    check_fd_source(src, owner, "open");
    FetchOptions opt;
    opt.path = mode == "socket" ? FdPath::socket_only : mode == "pidfd" ? FdPath::pidfd_only : FdPath::automatic;
    Fetched f = fetch(src.source, src.id, opt);
    return std::string("ok ") + (f.via_pidfd ? "pidfd " : "socket ") + read_all(f.fd.get());
  }
  if (cmd == "newpidns") {
    if (::unshare(CLONE_NEWPID) != 0) return std::string("err error unshare(CLONE_NEWPID): ") + std::strerror(errno);
    pid_t child = ::fork();
    if (child < 0) return std::string("err error fork: ") + std::strerror(errno);
    if (child > 0) {  // the parent only relays the child's exit
      int st = 0;
      ::waitpid(child, &st, 0);
      ::_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 1);
    }
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    return "ok";
  }
  if (cmd == "drop") {
    std::uint64_t id;
    in >> id;
    if (server) server->remove(id);
    fds.erase(id);
    return "ok";
  }
  if (cmd == "prefetch") {
    int n = 0;
    long long ms = 0;
    in >> n >> ms;
    Process::get().fds().configure(n, std::chrono::milliseconds(ms));
    return "ok";
  }
  if (cmd == "fetchsock") {
    std::uint64_t id;
    std::string addr;
    in >> id >> addr;
    return "ok " + read_all(fetch_fd(addr, id).get());
  }
  if (cmd == "many") {
    std::string addr, list;
    in >> addr >> list;
    std::vector<std::uint64_t> want;
    for (std::uint32_t v : parse_id_list(list, "ids")) want.push_back(v);
    std::string r = "ok";
    for (auto& b : fetch_many(addr, want)) {
      r += " " + std::to_string(b.id);
      if (b.fd) {
        r += "=" + read_all(b.fd.get());
        continue;
      }
      try {
        std::rethrow_exception(b.error);
      } catch (const FdTransferError& e) {
        r += std::string("!") + to_string(e.reason());
      }
    }
    return r;
  }
  if (cmd == "parked") {
    auto& p = Process::get().fds();
    return "ok " + std::to_string(p.parked()) + " " + std::to_string(p.hits()) + " " + std::to_string(p.dropped()) +
           " " + std::to_string(p.requests());
  }
  if (cmd == "expire") {
    Process::get().fds().expire();
    return "ok";
  }
  if (cmd == "forget") {
    std::string owner;
    std::uint64_t alloc = 0;
    in >> owner >> alloc;
    Process::get().fds().drop_allocation(owner, alloc);
    return "ok";
  }
  if (cmd == "memfds") {
    int n = 0;
    if (DIR* d = ::opendir("/proc/self/fd")) {
      while (dirent* e = ::readdir(d)) {
        char target[256] = {};
        std::string path = std::string("/proc/self/fd/") + e->d_name;
        ssize_t len = ::readlink(path.c_str(), target, sizeof target - 1);
        if (len > 0 && std::string(target, static_cast<std::size_t>(len)).starts_with("/memfd:memcuda-fd-peer")) ++n;
      }
      ::closedir(d);
    }
    return "ok " + std::to_string(n);
  }
  if (cmd == "sstats") {
    return "ok " + std::to_string(server ? server->requests() : service ? service->requests() : 0) + " " +
           std::to_string(server ? server->offered() : service ? service->offered() : 0);
  }
  return "err error unknown command: " + cmd;
}

}  // namespace

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line == "quit") break;
    std::string reply;
    try {
      reply = run(line);
    } catch (const FdTransferError& e) {
      reply = std::string("err ") + to_string(e.reason()) + " " + e.what();
    } catch (const memcuda::ProtocolError& e) {
      reply = std::string("err bad_record ") + e.what();
    } catch (const std::exception& e) {
      reply = std::string("err error ") + e.what();
    }
    std::cout << reply << std::endl;
  }
  if (server) server->stop();
  served.clear();
  service.reset();  // a clean stop: the socket file goes
  return 0;
}
