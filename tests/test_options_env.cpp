// RegistryOptions: RegistryOptions{} reads no environment; from_env() applies
// every MEMCUDA_* variable of docs/operations.md ("Environment") and refuses a
// malformed one by name; TensorRegistry's default constructor uses from_env().
#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "support/redis_server.hpp"
#include "support/text.hpp"

using namespace memcuda;
using namespace std::chrono_literals;

namespace {

// Sets variables for one test case and puts back what was there.
class EnvGuard {
 public:
  void set(const std::string& k, const std::string& v) {
    save(k);
    ::setenv(k.c_str(), v.c_str(), 1);
  }
  void unset(const std::string& k) {
    save(k);
    ::unsetenv(k.c_str());
  }
  ~EnvGuard() {
    for (const auto& [k, v] : saved_) {
      if (v) ::setenv(k.c_str(), v->c_str(), 1);
      else ::unsetenv(k.c_str());
    }
  }

 private:
  void save(const std::string& k) {
    if (saved_.count(k)) return;
    const char* e = std::getenv(k.c_str());
    saved_[k] = e ? std::optional<std::string>(e) : std::nullopt;
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

const char* const kRegistryVars[] = {"MEMCUDA_REDIS_URL",         "MEMCUDA_REDIS_PASSWORD",    "MEMCUDA_REDIS_USER",
                                     "MEMCUDA_REDIS_PASSWORD_FILE", "MEMCUDA_SHARE_REFERENCES", "MEMCUDA_RELEASE_LINGER_MS",
                                     "MEMCUDA_CUDA_ALLOCATION",   "MEMCUDA_DEBUG_POISON",     "MEMCUDA_RUNTIME_DIR",
                                     "MEMCUDA_ALLOWED_UIDS",      "MEMCUDA_ALLOWED_GIDS",     "MEMCUDA_FD_PREFETCH",
                                     "MEMCUDA_FD_PARK_MS"};

}  // namespace

TEST_CASE("RegistryOptions{} reads no environment, from_env() applies every variable", "[options]") {
  EnvGuard env;
  env.set("MEMCUDA_REDIS_URL", "redis://10.1.2.3:7000/2");
  env.set("MEMCUDA_REDIS_PASSWORD", "pw");
  env.set("MEMCUDA_REDIS_USER", "alice");
  env.unset("MEMCUDA_REDIS_PASSWORD_FILE");
  env.set("MEMCUDA_SHARE_REFERENCES", "0");
  env.set("MEMCUDA_RELEASE_LINGER_MS", "250");
  env.set("MEMCUDA_CUDA_ALLOCATION", "ipc");
  env.set("MEMCUDA_DEBUG_POISON", "1");
  env.set("MEMCUDA_RUNTIME_DIR", "/shared/memcuda");
  env.set("MEMCUDA_ALLOWED_UIDS", "1000, 1001");
  env.set("MEMCUDA_ALLOWED_GIDS", "100");
  env.set("MEMCUDA_FD_PREFETCH", "8");
  env.set("MEMCUDA_FD_PARK_MS", "300");

  const RegistryOptions plain{};
  CHECK(plain.redis.host == "127.0.0.1");
  CHECK(plain.redis.port == 6379);
  CHECK(plain.redis.db == 0);
  CHECK(plain.redis.password.empty());
  CHECK(plain.redis.user.empty());
  CHECK(plain.share_references);
  CHECK(plain.release_linger == 0us);
  CHECK_FALSE(plain.cuda_allocation);
  CHECK_FALSE(plain.pool.poison);
  CHECK(plain.runtime_dir.empty());
  CHECK(plain.allowed_uids.empty());
  CHECK(plain.allowed_gids.empty());
  CHECK(plain.fd_prefetch == 64);
  CHECK(plain.fd_park_window == 1500ms);

  const auto e = RegistryOptions::from_env();
  CHECK(e.redis.host == "10.1.2.3");
  CHECK(e.redis.port == 7000);
  CHECK(e.redis.db == 2);
  CHECK(e.redis.password == "pw");
  CHECK(e.redis.user == "alice");
  CHECK_FALSE(e.share_references);
  CHECK(e.release_linger == 250ms);
  CHECK(e.cuda_allocation == CudaAllocation::ipc);
  CHECK(e.pool.poison);
  CHECK(e.runtime_dir == "/shared/memcuda");
  CHECK(e.allowed_uids == std::vector<std::uint32_t>{1000, 1001});
  CHECK(e.allowed_gids == std::vector<std::uint32_t>{100});
  CHECK(e.fd_prefetch == 8);
  CHECK(e.fd_park_window == 300ms);
  // everything else is the plain default
  CHECK(e.client_connections == plain.client_connections);
  CHECK(e.lease_ttl == plain.lease_ttl);

  env.set("MEMCUDA_REDIS_PASSWORD_FILE", "/run/secrets/redis");  // wins over the password
  CHECK(RegistryOptions::from_env().redis.password_file == "/run/secrets/redis");

  // empty is unset: the defaults
  for (const char* v : kRegistryVars) env.set(v, "");
  const auto d = RegistryOptions::from_env();
  CHECK(d.redis.host == "127.0.0.1");
  CHECK(d.share_references);
  CHECK(d.release_linger == 0us);
  CHECK_FALSE(d.cuda_allocation);
  CHECK_FALSE(d.pool.poison);
  CHECK(d.runtime_dir.empty());
  CHECK(d.allowed_uids.empty());
  CHECK(d.fd_prefetch == 64);
  CHECK(d.fd_park_window == 1500ms);
}

TEST_CASE("from_env() refuses a malformed variable with InvalidArgument naming it", "[options]") {
  EnvGuard env;
  for (const char* v : kRegistryVars) env.unset(v);
  auto from_env = [] { (void)RegistryOptions::from_env(); };
  env.set("MEMCUDA_SHARE_REFERENCES", "yes");
  CHECK(test::invalid_argument_of(from_env).find("MEMCUDA_SHARE_REFERENCES is 'yes'") != std::string::npos);
  env.set("MEMCUDA_SHARE_REFERENCES", "1");
  CHECK(RegistryOptions::from_env().share_references);
  for (const char* bad : {"-1", "60001", "5ms", "x"}) {
    env.set("MEMCUDA_RELEASE_LINGER_MS", bad);
    INFO(bad);
    CHECK(test::invalid_argument_of(from_env).find("MEMCUDA_RELEASE_LINGER_MS") != std::string::npos);
  }
  env.set("MEMCUDA_RELEASE_LINGER_MS", "60000");
  CHECK(RegistryOptions::from_env().release_linger == 60s);
  env.set("MEMCUDA_CUDA_ALLOCATION", "VMM");
  CHECK(test::invalid_argument_of(from_env).find("MEMCUDA_CUDA_ALLOCATION") != std::string::npos);
  env.unset("MEMCUDA_CUDA_ALLOCATION");
  env.set("MEMCUDA_REDIS_URL", "http://x");
  CHECK(test::invalid_argument_of(from_env).find("MEMCUDA_REDIS_URL") != std::string::npos);
  env.unset("MEMCUDA_REDIS_URL");
  env.set("MEMCUDA_RUNTIME_DIR", "relative/dir");
  CHECK(test::invalid_argument_of(from_env).find("MEMCUDA_RUNTIME_DIR is 'relative/dir'") != std::string::npos);
  env.unset("MEMCUDA_RUNTIME_DIR");
  for (const char* bad : {"1000,", "alice", "-1", "1000;1001", "4294967295"}) {
    INFO(bad);
    env.set("MEMCUDA_ALLOWED_UIDS", bad);
    CHECK(test::invalid_argument_of(from_env).find("MEMCUDA_ALLOWED_UIDS") != std::string::npos);
    env.unset("MEMCUDA_ALLOWED_UIDS");
    env.set("MEMCUDA_ALLOWED_GIDS", bad);
    CHECK(test::invalid_argument_of(from_env).find("MEMCUDA_ALLOWED_GIDS") != std::string::npos);
    env.unset("MEMCUDA_ALLOWED_GIDS");
  }
  for (const char* bad : {"-1", "254", "x", "8 "}) {
    INFO(bad);
    env.set("MEMCUDA_FD_PREFETCH", bad);
    CHECK(test::invalid_argument_of(from_env).find("MEMCUDA_FD_PREFETCH") != std::string::npos);
  }
  env.set("MEMCUDA_FD_PREFETCH", "0");
  CHECK(RegistryOptions::from_env().fd_prefetch == 0);
  for (const char* bad : {"-1", "60001", "5ms"}) {
    INFO(bad);
    env.set("MEMCUDA_FD_PARK_MS", bad);
    CHECK(test::invalid_argument_of(from_env).find("MEMCUDA_FD_PARK_MS") != std::string::npos);
  }
}

TEST_CASE("the option groups are views of one RegistryOptions", "[options]") {
  RegistryOptions o;
  o.control().lease_ttl = 900ms;
  o.sharing().release_linger = 3ms;
  o.connection().client_connections = 2;
  o.allocation().default_device = 1;
  CHECK(o.lease_ttl == 900ms);
  CHECK(o.release_linger == 3ms);
  CHECK(o.client_connections == 2);
  CHECK(o.default_device == 1);
  ControlOptions c = o.control();  // a group copies out and back as a unit
  c.gc_interval = 50ms;
  o.control() = c;
  CHECK(o.gc_interval == 50ms);
  CHECK(o.lease_ttl == 900ms);
}

TEST_CASE("TensorRegistry's default constructor takes its options from the environment", "[options][redis]") {
  test::RedisServer srv;
  EnvGuard env;
  for (const char* v : kRegistryVars) env.unset(v);
  env.set("MEMCUDA_REDIS_URL", srv.unix_url());
  env.set("MEMCUDA_SHARE_REFERENCES", "0");
  env.set("MEMCUDA_RELEASE_LINGER_MS", "7");
  TensorRegistry reg;
  CHECK(reg.options().redis.path == srv.options().path);
  CHECK_FALSE(reg.options().share_references);
  CHECK(reg.options().release_linger == 7ms);
  // share_references off: a second get takes a second reference in Redis
  CreateOptions host;
  host.backend = BackendKind::host;
  auto t = reg.create<float>("env/t", {2}, host);
  auto a = reg.get<float>("env/t");
  CHECK(reg.info("env/t").refcount == 2);

  // With options given, the environment is not consulted.
  RegistryOptions o;
  o.redis = srv.options();
  o.control_thread = false;
  TensorRegistry plain(o);
  CHECK(plain.options().share_references);
  CHECK(plain.options().release_linger == 0us);
}
