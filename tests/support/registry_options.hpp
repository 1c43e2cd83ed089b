// The options the registry tests start from: a registry on the test's
// private redis-server, on the host backend, with every option that the
// environment could otherwise set pinned to its built-in value (the test
// main clears MEMCUDA_* too: tests/main.cpp). Each test sets its own lease,
// timeouts and whatever it is about on top.
#pragma once

#include <chrono>

#include "memcuda/options.hpp"
#include "support/redis_server.hpp"

namespace memcuda::test {

inline RegistryOptions host_options(const RedisServer& srv, bool control = true) {
  RegistryOptions o;
  o.redis = srv.options();
  o.control_thread = control;
  o.default_backend = BackendKind::host;
  o.share_references = true;
  o.release_linger = std::chrono::microseconds(0);
  o.pool.poison = false;
  return o;
}

// A tensor the name itself holds (it outlives its handles until removed).
inline CreateOptions persistent() {
  CreateOptions c;
  c.persistent = true;
  return c;
}

}  // namespace memcuda::test
