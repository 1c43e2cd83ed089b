// Who holds a reference to a tensor: the one grammar of holder ids
// ("<pid>-<16 hex>" a registry session, "pid:<n>" and "pid:<n>@<ns>" JSON
// clients, "@name", "anonymous", anything else free-form; docs/protocol.md,
// "Holders", says how each is judged alive), used by the registry, the
// garbage collector, the migration and the CLI. The Lua scripts know only
// "@name" (scripts.hpp), which they write.
#pragma once

#include "memcuda/config.hpp"

#include <signal.h>
#include <sys/types.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "memcuda/protocol/command.hpp"

MEMCUDA_NAMESPACE_BEGIN namespace detail {

class HolderId {
 public:
  enum class Kind { session, pid, name, anonymous, other };

  static constexpr std::string_view kName = "@name";
  static constexpr std::string_view kAnonymous = "anonymous";

  explicit HolderId(std::string id) : id_(std::move(id)), kind_(classify(id_)) {}
  static HolderId for_pid(std::int64_t pid, std::optional<std::uint64_t> pid_ns = std::nullopt) {
    return HolderId("pid:" + std::to_string(pid) + (pid_ns ? "@" + std::to_string(*pid_ns) : std::string()));
  }
  static HolderId anonymous() { return HolderId(std::string(kAnonymous)); }
  static HolderId name() { return HolderId(std::string(kName)); }

  const std::string& str() const noexcept { return id_; }
  Kind kind() const noexcept { return kind_; }
  bool is_session() const noexcept { return kind_ == Kind::session; }

  // The process the id names (a session's or a JSON client's pid), when it
  // names one that could exist.
  std::optional<pid_t> pid() const { return pid_of(id_); }

  static bool is_session_id(std::string_view h) { return classify(h) == Kind::session; }

  static Kind classify(std::string_view h) {
    if (h == kName) return Kind::name;
    if (h == kAnonymous) return Kind::anonymous;
    if (h.starts_with("pid:")) return split_pid(h.substr(4)) ? Kind::pid : Kind::other;
    auto dash = h.find('-');
    if (dash == 0 || dash == std::string_view::npos || h.size() - dash - 1 != 16) return Kind::other;
    for (std::size_t i = 0; i < dash; ++i)
      if (!std::isdigit(static_cast<unsigned char>(h[i]))) return Kind::other;
    for (std::size_t i = dash + 1; i < h.size(); ++i)
      if (!std::isxdigit(static_cast<unsigned char>(h[i]))) return Kind::other;
    return Kind::session;
  }

  static std::optional<pid_t> pid_of(std::string_view h) {
    switch (classify(h)) {
      case Kind::pid: return split_pid(h.substr(4))->first;
      case Kind::session: return parse_pid(h.substr(0, h.find('-')));
      default: return std::nullopt;
    }
  }

  // The pid namespace a "pid:<n>@<ns>" holder names; nullopt untagged.
  static std::optional<std::uint64_t> pid_namespace_of(std::string_view h) {
    if (classify(h) != Kind::pid) return std::nullopt;
    return split_pid(h.substr(4))->second;
  }

  // Whether a process with this pid exists on this machine (EPERM: it
  // exists but is someone else's).
  static bool process_alive(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

  // Whether a "pid:..." holder may still hold, judged from pid namespace
  // `here`: a holder tagged with another namespace cannot be seen from here
  // (its pid would name an unrelated process), so it is kept.
  static bool pid_holder_alive(std::string_view h, std::uint64_t here) {
    const auto ns = pid_namespace_of(h);
    if (ns && *ns != here) return true;
    const auto pid = pid_of(h);
    return !pid || process_alive(*pid);
  }

 private:
  // "<n>" or "<n>@<ns inode>" after "pid:".
  static std::optional<std::pair<pid_t, std::optional<std::uint64_t>>> split_pid(std::string_view t) {
    const auto at = t.find('@');
    const auto pid = parse_pid(t.substr(0, at));
    if (!pid) return std::nullopt;
    if (at == std::string_view::npos) return std::pair{*pid, std::optional<std::uint64_t>()};
    const auto digits = t.substr(at + 1);
    std::uint64_t ns = 0;
    auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), ns);
    if (digits.empty() || ec != std::errc() || p != digits.data() + digits.size() || ns == 0) return std::nullopt;
    return std::pair{*pid, std::optional<std::uint64_t>(ns)};
  }

  static std::optional<pid_t> parse_pid(std::string_view digits) {
    std::int64_t v = 0;
    auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (digits.empty() || ec != std::errc() || p != digits.data() + digits.size() || v <= 0 || v > 0x7fffffff)
      return std::nullopt;
    return static_cast<pid_t>(v);
  }

  std::string id_;
  Kind kind_;
};

// Holder id for a lifecycle command: the explicit holder, else the pid
// (tagged with its namespace when the command says it), else "anonymous"
// (a plain redis-cli client).
inline std::string holder_of(const protocol::Command& c) {
  if (c.holder) return *c.holder;
  if (c.pid) return HolderId::for_pid(*c.pid, c.pid_ns).str();
  return std::string(HolderId::kAnonymous);
}

}  MEMCUDA_NAMESPACE_END  // namespace memcuda::detail
