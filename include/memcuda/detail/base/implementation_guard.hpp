// One implementation of mem-cuda per process. Two copies of the
// implementation unit in one process (libmemcuda_c.so beside a Python
// extension that has its own, two shared libraries each linking
// memcuda::memcuda with hidden symbols) would each keep their own release
// queue, mapping cache and fd server: a tensor released through one is
// unknown to the other. Every TensorRegistry constructor claims the process
// for its copy; a second copy's claim fails with a clear error instead.
//
// Where the claim lives: the process environment, variable
// MEMCUDA_IMPLEMENTATION, value "<pid>-<exec token>-<copy address>". It is
// the one place every copy sees whatever hides them from each other: a
// symbol looked up through RTLD_DEFAULT misses libraries loaded RTLD_LOCAL
// (Python loads extensions so) and hidden ones; a lock file or an abstract
// socket named after the pid outlives the process or is shared with another
// pid namespace. Children inherit the environment, so a value is ours only
// when its pid is ours and its exec token (the kernel's AT_RANDOM bytes,
// new at every exec, shared by every copy in the process) is ours too; any
// other value is an ancestor's and is replaced. The copy address is an
// inline variable's: copies whose symbols the dynamic linker merged (default
// visibility, STB_GNU_UNIQUE) share it and share their state as well, so
// they are rightly one implementation.
//
// Copies do not share a mutex: two claiming at the same instant may both
// pass once; the overwritten one fails at its next TensorRegistry. A copy
// sets the variable at most once, so setenv can race another thread's
// getenv only at the first registry's construction.
#pragma once

#include <sys/auxv.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "memcuda/config.hpp"
#include "memcuda/error.hpp"

MEMCUDA_NAMESPACE_BEGIN

namespace detail::implementation_guard {

inline constexpr const char* kVariable = "MEMCUDA_IMPLEMENTATION";

// "<pid>-<exec token>-": what every copy in this process writes first.
inline std::string process_prefix() {
  std::uint64_t token = 0;
  if (const void* r = reinterpret_cast<const void*>(::getauxval(AT_RANDOM)))
    std::memcpy(&token, r, sizeof token);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%d-%016llx-", static_cast<int>(::getpid()),
                static_cast<unsigned long long>(token));
  return buf;
}

// Unclaims at exit or dlclose, so that a copy loaded later may claim.
struct Claim {
  std::mutex mutex;
  std::string value;  // what this copy wrote; empty until then
  ~Claim() {
    const char* now = std::getenv(kVariable);
    if (!value.empty() && now != nullptr && value == now) ::unsetenv(kVariable);
  }
};
// This copy's claim; its address names the copy.
inline Claim claim_of_this_copy;

// Throws InternalError when another copy of mem-cuda's implementation has
// claimed this process; claims it otherwise.
inline void claim() {
  Claim& c = claim_of_this_copy;
  std::lock_guard lock(c.mutex);
  const std::string prefix = process_prefix();
  if (c.value.empty() || c.value.compare(0, prefix.size(), prefix) != 0) {
    char addr[32];
    std::snprintf(addr, sizeof addr, "%p", static_cast<const void*>(&c));
    c.value = prefix + addr;  // (re)made after a fork: the pid changed
  }
  const char* now = std::getenv(kVariable);
  if (now != nullptr && std::strncmp(now, prefix.c_str(), prefix.size()) == 0) {
    if (c.value == now) return;
    throw InternalError(
        "two copies of mem-cuda's implementation are in this process (" + std::string(kVariable) + "=" +
        now + " names another than this one, " + c.value +
        "): each would keep its own release queue, caches and fd server. Use one: load libmemcuda_c "
        "or a C++ module that links memcuda::memcuda, not both; a program and the shared libraries it "
        "loads should share one shared library that holds mem-cuda (README.md, \"Using mem-cuda in your "
        "build\")");
  }
  ::setenv(kVariable, c.value.c_str(), 1);
}

}  // namespace detail::implementation_guard

MEMCUDA_NAMESPACE_END
