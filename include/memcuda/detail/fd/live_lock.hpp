// Liveness that does not depend on pids: every process with a registry
// holds a POSIX record lock on <runtime dir>/live-<pid>-<pid ns>-<16 hex>.lock
// and names it in its session value; any process that shares the directory
// proves its death with F_GETLK. docs/design.md, "Liveness", says why
// record locks, why the rename, and how the sweep keeps ".dead" marks.
#pragma once

#include "memcuda/config.hpp"

#include <fcntl.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>

#include "memcuda/detail/base/log.hpp"
#include "memcuda/detail/fd/fd_access.hpp"
#include "memcuda/detail/fd/fd_socket_dir.hpp"
#include "memcuda/detail/fd/unique_fd.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

enum class LiveVerdict { unknown, alive, dead };

using LiveName = ProcessName;

inline std::string live_name(std::int64_t pid, std::uint64_t pid_ns, std::uint64_t random) {
  return process_name("live-", pid, pid_ns, random, ".lock");
}
inline std::optional<LiveName> parse_live_name(std::string_view n) { return parse_process_name(n, "live-", ".lock"); }

// Whether a lock conflicting with a whole-file write lock is held on `fd`
// by another process: nullopt when fcntl cannot say.
inline std::optional<bool> locked_by_other(int fd) {
  struct flock fl{};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  if (::fcntl(fd, F_GETLK, &fl) != 0) return std::nullopt;
  return fl.l_type != F_UNLCK;
}

class LiveLock {
 public:
  // How long a ".dead" mark stays: far longer than any session key of the
  // dead process can (session_ttl is seconds).
  static constexpr std::time_t kDeadKeep = 600;
  static constexpr std::chrono::seconds kSweepEvery{10};

  // The process's lock, made on first use (and again in a forked child,
  // which inherits the object but not the lock), in the process's runtime
  // directory. Null when that directory cannot hold one (logged once):
  // sessions then carry no "live" field and expiry judges them, as before.
  static std::shared_ptr<LiveLock> acquire() {
    auto& st = state();
    std::lock_guard lk(st.mu);
    if (auto l = st.current.lock(); l && l->pid_ == ::getpid()) return l;
    try {
      FdAccess a = process_fd_access();
      prepare_runtime_dir(a);
      auto l = std::shared_ptr<LiveLock>(new LiveLock(a.runtime_dir));
      st.current = l;
      return l;
    } catch (const std::exception& e) {
      if (!st.warned) log(LogLevel::warn, std::string("no liveness lock in the runtime directory: ") + e.what() +
                                              " (death of this process is seen by its session's expiry only)");
      st.warned = true;
      return nullptr;
    }
  }
  // The lock this process holds now, or null (makes nothing).
  static std::shared_ptr<LiveLock> existing() {
    auto& st = state();
    std::lock_guard lk(st.mu);
    auto l = st.current.lock();
    return l && l->pid_ == ::getpid() ? l : nullptr;
  }

  ~LiveLock() {
    if (pid_ != ::getpid()) return;  // a forked child's copy: the file is the parent's
    ::unlink(path().c_str());
  }
  LiveLock(const LiveLock&) = delete;
  LiveLock& operator=(const LiveLock&) = delete;

  // The session value's "live" field.
  const std::string& field() const noexcept { return field_; }
  const std::string& dir() const noexcept { return dir_; }
  std::string path() const { return dir_ + "/" + name_; }

  // What `field` (another session's "live") says here. unknown: another
  // directory, a malformed field, this very process, or no proof either way.
  LiveVerdict judge(std::string_view field) const {
    if (field.size() <= dir_id_.size() + 1 || !field.starts_with(dir_id_) || field[dir_id_.size()] != '/')
      return LiveVerdict::unknown;
    const std::string_view name = field.substr(dir_id_.size() + 1);
    auto n = parse_live_name(name);
    if (!n) return LiveVerdict::unknown;
    if (std::string_view(name_) == name) return LiveVerdict::alive;  // closing it would drop our own lock
    if (n->pid == ::getpid() && n->pid_ns == pid_namespace_inode()) return LiveVerdict::unknown;
    const std::string p = dir_ + "/" + std::string(name);
    UniqueFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
    if (!fd) {
      if (errno != ENOENT) return LiveVerdict::unknown;
      const std::string dead = p.substr(0, p.size() - 5) + ".dead";
      struct stat st{};
      return ::lstat(dead.c_str(), &st) == 0 && S_ISREG(st.st_mode) ? LiveVerdict::dead : LiveVerdict::unknown;
    }
    struct stat st{};
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return LiveVerdict::unknown;
    auto held = locked_by_other(fd.get());
    if (!held) return LiveVerdict::unknown;
    return *held ? LiveVerdict::alive : LiveVerdict::dead;
  }

  // The sweep of this lock's directory, at most every kSweepEvery (the
  // control thread calls it each tick).
  void tend() {
    const auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard lk(tend_mu_);
      if (now < next_sweep_) return;
      next_sweep_ = now + kSweepEvery;
    }
    sweep(dir_);
  }

  // The sweep described above; returns how many files it renamed or removed.
  static std::size_t sweep(const std::string& dir) {
    std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
    if (!d) return 0;
    std::size_t n = 0;
    const std::time_t now = std::time(nullptr);
    while (dirent* e = ::readdir(d.get())) {
      const std::string_view name = e->d_name;
      const std::string p = dir + "/" + std::string(name);
      struct stat st{};
      if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      if (name.starts_with("live-") && name.ends_with(".dead")) {
        if (parse_live_name(std::string(name.substr(0, name.size() - 5)) + ".lock") && st.st_mtime + kDeadKeep < now)
          n += ::unlink(p.c_str()) == 0;
        continue;
      }
      const bool temporary = name.starts_with(".live-") && name.ends_with(".new");
      if (!temporary && !parse_live_name(name)) continue;
      if (temporary && st.st_mtime + 60 >= now) continue;
      UniqueFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
      if (!fd) continue;
      auto held = locked_by_other(fd.get());
      if (!held || *held) continue;
      if (temporary) {
        n += ::unlink(p.c_str()) == 0;
      } else {
        const std::string dead = p.substr(0, p.size() - 5) + ".dead";
        // Stamped now: its mtime was its owner's start; the keep runs from the death seen.
        (void)::futimens(fd.get(), nullptr);
        n += ::rename(p.c_str(), dead.c_str()) == 0;
      }
    }
    return n;
  }

 private:
  struct State {
    std::mutex mu;  // leaf
    std::weak_ptr<LiveLock> current;
    bool warned = false;
  };
  static State& state() {
    static State s;  // process-wide: the lock file says the process is alive, so there is one
    return s;
  }

  explicit LiveLock(std::string dir) : dir_(std::move(dir)), pid_(::getpid()) {
    struct stat ds{};
    if (::stat(dir_.c_str(), &ds) != 0) throw_errno("stat " + dir_);
    dir_id_ = std::to_string(static_cast<unsigned long long>(ds.st_dev)) + ":" +
              std::to_string(static_cast<unsigned long long>(ds.st_ino));
    sweep(dir_);
    std::random_device rd;
    const std::uint64_t r = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    name_ = live_name(pid_, pid_namespace_inode(), r);
    const std::string tmp = dir_ + "/." + name_ + ".new";
    fd_ = UniqueFd(::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (!fd_) throw_errno("create " + tmp);
    struct flock fl{};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    if (::fcntl(fd_.get(), F_SETLK, &fl) != 0 || ::fchmod(fd_.get(), 0644) != 0 ||
        ::rename(tmp.c_str(), path().c_str()) != 0) {
      const int e = errno;
      ::unlink(tmp.c_str());
      errno = e;
      throw_errno("lock " + path());
    }
    field_ = dir_id_ + "/" + name_;
  }

  [[noreturn]] static void throw_errno(const std::string& what) {
    throw FdTransferError(FdErrc::runtime_dir, what + ": " + std::strerror(errno), errno);
  }

  std::string dir_, dir_id_, name_, field_;
  pid_t pid_;
  UniqueFd fd_;
  std::mutex tend_mu_;  // leaf
  std::chrono::steady_clock::time_point next_sweep_ = std::chrono::steady_clock::now() + kSweepEvery;
};

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
