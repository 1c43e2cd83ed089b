// Real child processes for multi-process tests: fork + exec with the
// child's stdin and stdout on pipes, line-oriented.
#pragma once

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace memcuda::test {

// Test helper programs sit next to the test binary (also in a flattened
// bundle on a GPU host), so they are found relative to /proc/self/exe.
inline std::string sibling_program(const std::string& name) {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error("readlink /proc/self/exe failed");
  buf[n] = 0;
  auto p = std::filesystem::path(buf).parent_path() / name;
  if (::access(p.c_str(), X_OK) != 0) throw std::runtime_error("helper program not found: " + p.string());
  return p.string();
}

class Child {
 public:
  explicit Child(const std::vector<std::string>& argv) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    to_ = in[1];
    from_ = out[0];
  }
  ~Child() {
    if (to_ >= 0) ::close(to_);
    if (from_ >= 0) ::close(from_);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }

  void send(const std::string& line) {
    std::string l = line + "\n";
    if (::write(to_, l.data(), l.size()) != static_cast<ssize_t>(l.size()))
      throw std::runtime_error("write to child failed");
  }

  // The next line of the child's stdout, or nullopt after the timeout / EOF.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (auto nl = buf_.find('\n'); nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{from_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char tmp[4096];
      ssize_t n = ::read(from_, tmp, sizeof tmp);
      if (n <= 0) return std::nullopt;
      buf_.append(tmp, static_cast<std::size_t>(n));
    }
  }

  // Sends a command and returns the reply line ("" when none came).
  std::string ask(const std::string& line, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    send(line);
    return read_line(timeout).value_or("");
  }

  void kill(int sig = SIGKILL) {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  // Waits for exit; returns the exit code, or 128+signal.
  int wait() {
    if (pid_ <= 0) return status_;
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return status_;
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1;
  int from_ = -1;
  int status_ = -1;
  std::string buf_;
};

}  // namespace memcuda::test
