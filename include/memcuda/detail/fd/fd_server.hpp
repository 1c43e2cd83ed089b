// FdServer: hands the fds this process owns to other processes that its
// peer policy allows (docs/fd-transfer.md): by default the same uid, or
// root; FdAccess (fd_access.hpp) adds uids and gids. SO_PEERCRED is the
// check, so peers in other pid or network namespaces (containers sharing
// the runtime directory) are served like any other.
//
// The owner (the fd service's thread) calls serve_once(timeout) in its
// loop; the server has no thread of its own. wake() and stop() end a
// waiting serve_once() from any thread. A new peer gets at most io_timeout
// to send its first request, so a stuck peer delays the owner's thread by
// that much at worst. Served connections are kept for their next request
// (up to kMaxKept; docs/fd-transfer.md, "Bytes on the wire").
#pragma once

#include "memcuda/config.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <mutex>
#include <string>
#include <string_view>
#include <map>
#include <unordered_set>
#include <vector>

#include "memcuda/detail/fd/fd_access.hpp"
#include "memcuda/detail/fd/fd_error.hpp"
#include "memcuda/detail/fd/fd_limit.hpp"
#include "memcuda/detail/fd/fd_wire.hpp"
#include "memcuda/detail/fd/unique_fd.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

struct FdServerOptions {
  // A path (what FdService uses: a socket in the runtime directory) or
  // "@name" (abstract: one network namespace only; tests, older setups).
  std::string address;
  // Time a connected peer has to send its request.
  std::chrono::milliseconds io_timeout{500};
  int backlog = 64;
  // Who is served besides this uid and root (allowed_uids, allowed_gids),
  // and so the mode of a path socket; runtime_dir is not used here.
  FdAccess access{};
};

// Fds a reply sends along besides those asked for, at most (the client
// names its own bound; this caps it).
inline constexpr std::size_t kMaxOffer = 64;

// An fd a server serves, borrowed, and the key of its allocation.
struct ServedEntry {
  int fd = -1;
  std::string key;
};

// Connections a server keeps open for their next request. A peer whose
// connection was dropped reconnects (the client retries a kept connection
// that the server closed once).
inline constexpr std::size_t kMaxKept = 128;

enum class ServeResult {
  idle,     // nothing happened before the timeout (or a wake())
  served,   // a peer got its fd
  refused,  // a peer was refused (credentials) or answered with an error
  stopped,  // stop() was called
};

class FdServer {
  struct Conn {
    UniqueFd fd;
    std::unordered_set<std::uint64_t> sent;
  };

 public:
  // Binds and listens. Throws InvalidArgument for a bad address and
  // FdTransferError (system, or exhausted) when the socket cannot be made,
  // e.g. the address is in use by a live server.
  explicit FdServer(FdServerOptions opt) : opt_(std::move(opt)) {
    raise_nofile_limit();
    sockaddr_un sa;
    socklen_t len = fdwire::make_address(opt_.address, &sa);
    listen_ = fdwire::make_socket();
    if (!listen_) fail("socket()", errno);
    // Non-blocking: a peer that gives up between poll() and accept() must not
    // leave the owner's thread blocked in accept().
    ::fcntl(listen_.get(), F_SETFL, ::fcntl(listen_.get(), F_GETFL) | O_NONBLOCK);
    if (opt_.address[0] == '@') {
      if (::bind(listen_.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0) fail("bind", errno);
      if (::listen(listen_.get(), opt_.backlog) != 0) fail("listen", errno);
    } else {
      bind_path();
    }
    wake_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake_) fail("eventfd()", errno);
    // The spare fd lets an exhausted server still accept and tell the peer
    // why, instead of leaving it in the backlog, where poll() keeps waking.
    spare_ = UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  }
  // Removes the socket file: a clean shutdown leaves nothing behind (a
  // SIGKILL leaves a file no one listens on; servers that start sweep it).
  ~FdServer() {
    if (owns_path_) ::unlink(opt_.address.c_str());
  }
  FdServer(const FdServer&) = delete;
  FdServer& operator=(const FdServer&) = delete;

  const std::string& address() const noexcept { return opt_.address; }
  // Serves `fd` under `id` until remove(id). The fd stays the caller's (it is
  // borrowed, never closed here) and must stay open until remove() returns;
  // after that the server never touches it again (it sends a dup taken under
  // the lock). Re-adding an id replaces it. `key` names the allocation to
  // a client that receives the fd unasked (prefetch), so that it can drop
  // the fd when told the allocation was freed. Thread-safe.
  void add(std::uint64_t id, int fd, std::string key = {}) {
    MEMCUDA_EXPECTS(fd >= 0, InvalidArgument, "FdServer::add: negative fd");
    std::lock_guard lk(mu_);
    fds_[id] = {fd, std::move(key)};
  }
  // True when the id was served. Thread-safe.
  bool remove(std::uint64_t id) {
    std::lock_guard lk(mu_);
    return fds_.erase(id) != 0;
  }
  std::size_t size() const {
    std::lock_guard lk(mu_);
    return fds_.size();
  }

  // Ends a serve_once() that is waiting, from any thread.
  void wake() noexcept {
    std::uint64_t one = 1;
    ssize_t r = ::write(wake_.get(), &one, sizeof one);
    (void)r;
  }
  // Makes this and every later serve_once() return `stopped`.
  void stop() noexcept {
    stopping_.store(true);
    wake();
  }
  bool stopping() const noexcept { return stopping_.load(); }

  // Waits up to `timeout` for peers and answers every request ready: a new
  // peer's, and those on kept connections. Returns `served` when any peer
  // got its fd, else `refused` when one was refused or answered with an
  // error, else `idle`. Call from one thread at a time (the owner's). Never
  // throws for what a peer sends or does; throws FdTransferError only if
  // poll() itself fails.
  ServeResult serve_once(std::chrono::milliseconds timeout) {
    if (stopping_.load()) return ServeResult::stopped;
    std::vector<pollfd> p;
    p.reserve(2 + kept_.size());
    p.push_back({listen_.get(), POLLIN, 0});
    p.push_back({wake_.get(), POLLIN, 0});
    for (const Conn& k : kept_) p.push_back({k.fd.get(), POLLIN, 0});
    auto ms = std::clamp<std::int64_t>(timeout.count(), 0, std::numeric_limits<int>::max());
    int n = ::poll(p.data(), static_cast<nfds_t>(p.size()), static_cast<int>(ms));
    if (n < 0 && errno != EINTR) fail("poll", errno);
    if (p[1].revents) {
      std::uint64_t v;
      ssize_t r = ::read(wake_.get(), &v, sizeof v);
      (void)r;
    }
    if (stopping_.load()) return ServeResult::stopped;
    if (n <= 0) return ServeResult::idle;
    ServeResult out = ServeResult::idle;
    auto note = [&out](ServeResult r) {
      if (r == ServeResult::served || (r == ServeResult::refused && out == ServeResult::idle)) out = r;
    };
    // Kept connections first (a new one may evict the oldest of them).
    std::vector<int> ready;
    for (std::size_t i = 2; i < p.size(); ++i)
      if (p[i].revents) ready.push_back(p[i].fd);
    for (int fd : ready) note(serve_kept(fd));
    if (p[0].revents & POLLIN) {
      Conn conn{UniqueFd(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK)), {}};
      if (!conn.fd) {
        int err = errno;
        if (is_fd_exhaustion(err)) note(answer_exhausted(err));
        // else EAGAIN (the peer gave up), ECONNABORTED, ...
      } else {
        fdwire::Received msg;
        ssize_t got = read_request(conn.fd.get(), &msg);
        if (got < 0) {
          note(refuse("peer sent no request within " + std::to_string(opt_.io_timeout.count()) + " ms"));
        } else if (got > 0) {  // 0: a sweeper probing that this server lives (fd_service.hpp)
          bool keep = false;
          note(handle(conn, msg, &keep));
          if (keep) keep_open(std::move(conn));
        }
      }
    }
    return out;
  }

  // Connections kept open now (tests).
  std::size_t kept() const noexcept { return kept_count_.load(); }

  // Counters for tests and stats.
  std::uint64_t served() const noexcept { return served_.load(); }
  std::uint64_t refused() const noexcept { return refused_.load(); }
  // Requests answered with fds, and fds sent unasked.
  std::uint64_t requests() const noexcept { return requests_.load(); }
  std::uint64_t offered() const noexcept { return offered_.load(); }
  // The last refusal or failure, for the owner's log.
  std::string last_error() const {
    std::lock_guard lk(mu_);
    return last_error_;
  }

 private:
  // A path socket appears under its name only once it listens: bound under
  // "<name>.new" (".sock" replaced), given the policy's mode and group, then
  // renamed. So a sweeper (fd_service.hpp) that finds a name whose connect
  // is refused knows its server is gone, never one between bind and listen.
  void bind_path() {
    const std::string& path = opt_.address;
    std::string tmp = path.ends_with(".sock") ? path.substr(0, path.size() - 5) + ".new" : path + ".new";
    sockaddr_un sa;
    socklen_t len = fdwire::make_address(tmp, &sa);
    ::unlink(tmp.c_str());  // a leftover of this very name: ours to replace
    if (::bind(listen_.get(), reinterpret_cast<const sockaddr*>(&sa), len) != 0) fail("bind", errno);
    auto undo = [&](const char* call, int err) {
      ::unlink(tmp.c_str());
      fail(call, err);
    };
    if (!opt_.access.allowed_gids.empty() &&
        ::chown(tmp.c_str(), static_cast<uid_t>(-1), opt_.access.allowed_gids.front()) != 0)
      undo("chown of the socket to the first allowed gid", errno);
    if (::chmod(tmp.c_str(), socket_mode(opt_.access)) != 0) undo("chmod of the socket", errno);
    if (::listen(listen_.get(), opt_.backlog) != 0) undo("listen", errno);
    struct stat st{};
    if (::lstat(path.c_str(), &st) == 0) undo("bind", EADDRINUSE);  // never replace another's socket
    if (::rename(tmp.c_str(), path.c_str()) != 0) undo("rename into place", errno);
    owns_path_ = true;
  }

  [[noreturn]] void fail(const std::string& call, int err) const {
    std::string what = "fd server at '" + opt_.address + "': " + call;
    if (is_fd_exhaustion(err)) throw_fd_exhausted(what, err);
    std::string hint = err == EADDRINUSE ? " (another live process serves this address; each "
                                           "process needs its own)"
                                         : "";
    throw FdTransferError(FdErrc::system, what + " failed: " + std::strerror(err) + hint, err);
  }

  // Records a refusal. Counted before any answer goes out, so a peer that
  // has its answer can rely on the counters (the tests do).
  ServeResult refuse(const std::string& why) {
    {
      std::lock_guard lk(mu_);
      last_error_ = why;
    }
    refused_.fetch_add(1);
    return ServeResult::refused;
  }

  // The credential check. SO_PEERCRED holds the peer's credentials from the
  // time it called connect(), translated into our namespaces by the kernel
  // (a uid our user namespace cannot map reads as the overflow uid, 65534;
  // a pid our pid namespace cannot see reads as 0). Pid namespaces do not
  // matter here: a peer that reached the socket file and passes the uid/gid
  // policy is served wherever it runs.
  std::string check_peer(int conn) const {
    ucred cr{};
    socklen_t len = sizeof cr;
    if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0)
      return std::string("cannot read the peer's credentials (SO_PEERCRED): ") + std::strerror(errno);
    return peer_refusal(opt_.access, cr);
  }

  // Waits up to io_timeout for the peer's one message. Every answer, a
  // refusal included, is sent only after the request was read: closing a
  // unix socket with unread data resets the peer's side (ECONNRESET), and
  // the peer would lose our answer with it. Room for one fd: a request
  // must carry none, one shows that it did, the kernel drops the rest.
  ssize_t read_request(int conn, fdwire::Received* msg) {
    pollfd p{conn, POLLIN, 0};
    int n;
    do n = ::poll(&p, 1, static_cast<int>(opt_.io_timeout.count()));
    while (n < 0 && errno == EINTR);
    if (n <= 0) return -1;
    return fdwire::recv_message(conn, fdwire::kMaxRequest + 16, msg, 1);
  }

  // Answers one request read from `conn`. *keep: the connection may serve
  // the peer's next request (it passed the policy and sent a well-formed
  // request); a refused or malformed one is closed.
  ServeResult handle(Conn& c, const fdwire::Received& msg, bool* keep) {
    *keep = false;
    const int conn = c.fd.get();
    fdwire::Request req;
    std::string why;
    fdwire::Status st = fdwire::Status::ok;
    if (why = check_peer(conn); !why.empty()) {
      why = "refused: " + why;
      st = fdwire::Status::refused;
    } else if (!msg.fds.empty()) {
      why = "requests must not carry fds";
      st = fdwire::Status::bad_request;
    } else if (msg.truncated) {
      why = "request longer than " + std::to_string(fdwire::kMaxRequest) + " bytes";
      st = fdwire::Status::bad_request;
    } else {
      st = fdwire::decode_request(msg.bytes, &req, &why);
    }
    if (st != fdwire::Status::ok) {
      refuse(why);
      fdwire::send_message(conn, fdwire::encode_reply({st, why, {}}));
      return ServeResult::refused;
    }
    *keep = true;  // an unknown id or a failed dup is the request's, not the peer's fault
    std::vector<UniqueFd> copies;
    int dup_errno = 0;
    fdwire::Reply rep;
    {
      std::lock_guard lk(mu_);
      rep = answer(c.sent, req, &copies, &dup_errno);
    }
    std::vector<int> raw;
    for (const auto& d : copies) raw.push_back(d.get());
    std::size_t asked = 0, offered = 0, failed = 0;
    for (const auto& e : rep.entries) {
      if (e.status != fdwire::Status::ok) ++failed;
      else (e.offered ? offered : asked) += 1;
    }
    if (dup_errno)
      rep.message = is_fd_exhaustion(dup_errno)
                        ? fd_exhaustion_message("fd server (pid " + std::to_string(::getpid()) + ") dup", dup_errno)
                        : std::string("fd server: dup failed: ") + std::strerror(dup_errno);
    else if (failed)
      rep.message = "this process (pid " + std::to_string(::getpid()) +
                    ") serves no allocation under some of the ids asked for (freed, or the records are stale)";
    if (failed) refuse(rep.message);  // counted before the answer goes out (the tests rely on it)
    served_.fetch_add(asked);
    offered_.fetch_add(offered);
    requests_.fetch_add(1);
    if (fdwire::send_message(conn, fdwire::encode_reply(rep), raw) < 0) {
      int err = errno;
      served_.fetch_sub(asked);
      offered_.fetch_sub(offered);
      requests_.fetch_sub(1);
      *keep = false;
      return refuse(std::string("sending the fds failed: ") + std::strerror(err));
    }
    for (const auto& e : rep.entries)
      if (e.status == fdwire::Status::ok) c.sent.insert(e.id);
    return asked ? ServeResult::served : ServeResult::refused;
  }

  // The entries answering `req` and the fds to send with them (one per ok
  // entry, in order): every id asked for, each on its own (an unknown one
  // fails alone), then up to req.offer (capped at kMaxOffer) allocations
  // not in `sent` (what this connection already received), those made
  // after the ids asked for first (a model's tensors are allocated in a
  // row), then those before. *dup_errno: a dup that failed. Any allocation
  // served is one the peer may ask for by id (its policy was checked), so
  // an offer gives it nothing it could not have. Called under mu_.
  fdwire::Reply answer(const std::unordered_set<std::uint64_t>& sent, const fdwire::Request& req,
                       std::vector<UniqueFd>* copies, int* dup_errno) const {
    fdwire::Reply rep;
    // False when a dup failed (out of fds): nothing more is offered then.
    auto take = [&](std::uint64_t id, const ServedEntry* s, bool offered) {
      fdwire::Entry e;
      e.id = id;
      e.offered = offered;
      if (!s) {
        e.status = fdwire::Status::unknown_id;
      } else if (UniqueFd d(::fcntl(s->fd, F_DUPFD_CLOEXEC, 0)); d) {
        e.key = s->key;
        copies->push_back(std::move(d));
      } else if (offered) {
        return false;  // an offer is no answer: leave it out
      } else {
        e.status = fdwire::Status::server_error;
        *dup_errno = errno;
      }
      rep.entries.push_back(std::move(e));
      return true;
    };
    std::uint64_t top = 0, bottom = ~std::uint64_t{0};
    for (std::uint64_t id : req.ids) {
      auto it = fds_.find(id);
      take(id, it == fds_.end() ? nullptr : &it->second, false);
      top = std::max(top, id);
      bottom = std::min(bottom, id);
    }
    std::size_t room =
        *dup_errno ? 0 : std::min({std::size_t{req.offer}, kMaxOffer, fdwire::kMaxBatch - req.ids.size()});
    auto offer = [&](std::uint64_t id, const ServedEntry& s) {
      if (sent.count(id) || std::find(req.ids.begin(), req.ids.end(), id) != req.ids.end()) return;
      room = take(id, &s, true) ? room - 1 : 0;
    };
    for (auto it = fds_.upper_bound(top); room && it != fds_.end(); ++it) offer(it->first, it->second);
    for (auto it = std::make_reverse_iterator(fds_.lower_bound(bottom)); room && it != fds_.rend(); ++it)
      offer(it->first, it->second);
    return rep;
  }

  // A kept connection is readable: its peer's next request, or its close.
  // The request is already there, so nothing here waits.
  ServeResult serve_kept(int fd) {
    auto it = std::find_if(kept_.begin(), kept_.end(), [fd](const Conn& k) { return k.fd.get() == fd; });
    if (it == kept_.end()) return ServeResult::idle;
    fdwire::Received msg;
    ssize_t got = fdwire::recv_message(fd, fdwire::kMaxRequest + 16, &msg, 1);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return ServeResult::idle;
    bool keep = false;
    ServeResult r = got > 0 ? handle(*it, msg, &keep) : ServeResult::idle;  // 0 or an error: the peer left
    if (!keep) {
      kept_.erase(it);
    } else {
      Conn k = std::move(*it);  // most recently used last
      kept_.erase(it);
      kept_.push_back(std::move(k));
    }
    kept_count_.store(kept_.size());
    return r;
  }

  void keep_open(Conn conn) {
    if (kept_.size() >= kMaxKept) kept_.erase(kept_.begin());  // the least recently used
    kept_.push_back(std::move(conn));
    kept_count_.store(kept_.size());
  }

  // accept() hit EMFILE/ENFILE: free the spare fd, take the peer, tell it the
  // server is exhausted, and keep the spare for next time.
  ServeResult answer_exhausted(int err) {
    std::string why = fd_exhaustion_message("fd server (pid " + std::to_string(::getpid()) + ") accept", err);
    refuse(why);
    spare_.reset();
    UniqueFd conn(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (conn) {
      fdwire::Received msg;
      read_request(conn.get(), &msg);  // an fd it carried is closed with msg
      fdwire::send_message(conn.get(), fdwire::encode_reply({fdwire::Status::server_error, why, {}}));
    }
    conn.reset();
    spare_ = UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    return ServeResult::refused;
  }

  FdServerOptions opt_;
  UniqueFd listen_, wake_, spare_;
  bool owns_path_ = false;  // a socket file of ours to remove
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> served_{0}, refused_{0}, requests_{0}, offered_{0};
  mutable std::mutex mu_;  // guards fds_ and last_error_; never held across a wait
  std::map<std::uint64_t, ServedEntry> fds_;  // ordered: offers follow the ids asked for
  std::string last_error_;
  // Connections kept for their peers' next requests, least recently used
  // first, each with the ids it was sent (offers skip those). Only the
  // serving thread touches them.
  std::vector<Conn> kept_;
  std::atomic<std::size_t> kept_count_{0};
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
