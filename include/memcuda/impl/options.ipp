// RegistryOptions::from_env (memcuda/options.hpp), the one place that turns
// the MEMCUDA_* variables into registry options (the process-wide ones:
// ProcessOptions::from_env).
#pragma once

#include <charconv>
#include <cstdlib>
#include <string>
#include <string_view>

#include "memcuda/detail/fd/fd_access.hpp"
#include "memcuda/detail/process/process_options.hpp"
#include "memcuda/error.hpp"
#include "memcuda/options.hpp"
#include "memcuda/redis/options.hpp"

MEMCUDA_NAMESPACE_BEGIN


RegistryOptions RegistryOptions::from_env() {
  RegistryOptions o;
  o.redis = redis::options_from_env();  // MEMCUDA_REDIS_URL, _PASSWORD, _PASSWORD_FILE, _USER
  if (auto v = detail::env_value("MEMCUDA_SHARE_REFERENCES")) {
    if (*v != "0" && *v != "1") detail::bad_env("MEMCUDA_SHARE_REFERENCES", *v, "0 or 1");
    o.share_references = *v == "1";
  }
  if (auto v = detail::env_value("MEMCUDA_FLEET")) {
    if (*v != "0" && *v != "1") detail::bad_env("MEMCUDA_FLEET", *v, "0 or 1");
    o.fleet = *v == "1";
  }
  if (auto v = detail::env_value("MEMCUDA_RELEASE_LINGER_MS")) {
    long long ms = -1;
    auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), ms);
    if (ec != std::errc() || p != v->data() + v->size() || ms < 0 || ms > 60000)
      detail::bad_env("MEMCUDA_RELEASE_LINGER_MS", *v, "an integer number of milliseconds, 0..60000");
    o.release_linger = std::chrono::milliseconds(ms);
  }
  if (auto v = detail::env_value("MEMCUDA_REDIS_REPLICA_WAIT_MS")) {
    long long ms = -1;
    auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), ms);
    if (ec != std::errc() || p != v->data() + v->size() || ms < 0 || ms > 60000)
      detail::bad_env("MEMCUDA_REDIS_REPLICA_WAIT_MS", *v, "an integer number of milliseconds, 0..60000 (0: off)");
    o.redis.replica_wait = std::chrono::milliseconds(ms);
  }
  if (auto v = detail::env_value("MEMCUDA_CUDA_ALLOCATION")) {
    auto k = cuda_allocation_from_string(*v);
    if (!k) detail::bad_env("MEMCUDA_CUDA_ALLOCATION", *v, "auto, vmm or ipc");
    o.cuda_allocation = *k;
  }
  if (auto v = detail::env_value("MEMCUDA_DEBUG_POISON")) o.pool.poison = *v != "0";
  if (auto v = detail::env_value("MEMCUDA_RUNTIME_DIR")) {
    if (v->front() != '/') detail::bad_env("MEMCUDA_RUNTIME_DIR", *v, "an absolute path");
    o.runtime_dir = std::string(*v);
  }
  if (auto v = detail::env_value("MEMCUDA_ALLOWED_UIDS"))
    o.allowed_uids = detail::parse_id_list(*v, "MEMCUDA_ALLOWED_UIDS (fix or unset the variable)");
  if (auto v = detail::env_value("MEMCUDA_ALLOWED_GIDS"))
    o.allowed_gids = detail::parse_id_list(*v, "MEMCUDA_ALLOWED_GIDS (fix or unset the variable)");
  const auto p = detail::ProcessOptions::from_env();  // the process-wide ones a registry sets
  o.fd_prefetch = p.fd_prefetch;
  o.import_cache = p.import_cache;
  o.fd_park_window = p.fd_park_window;
  return o;
}


MEMCUDA_NAMESPACE_END  // namespace memcuda
