// memcuda_soak_worker: one real mem-cuda process of the soak test
// (tests/test_soak.cpp) and of the Redis fault tests under load
// (support/redis_load.hpp). It runs a seeded random mix of create / get /
// release / remove / rewrite+verify / audit over a small pool of shared
// names, while other processes do the same and some are killed.
//
//   memcuda_soak_worker --url URL --seed N --ops N --backend host|cuda
//                       [--ttl MS] [--timeout MS] [--no-control] [--names N]
//                       [--faults] [--replica-wait MS] [--reconnect MS]
//   memcuda_soak_worker --url URL --reader N [--verify]   (see reader.hpp)
//
// --ops -1 runs until SIGTERM. --faults is for runs while Redis fails over
// or stalls: Redis errors (a broken connection, READONLY, a timeout) and
// an `unavailable` reply are counted too, the mix also re-publishes in
// place and bumps the model version of "soak.", and the reference audit
// only checks refcount == the sum of the holders, not this session's own
// count (a failover may drop a reference or a release, also one sent in the
// background: the session's end settles it, docs/operations.md); leaked
// references are counted in the DONE line, not fatal.
//
// Output (stdout, one line each): "START session=<id> pid=<pid> leader=<0|1>"
// once the registry is up, "AT <n>" every ops/50 operations (every 100
// when unbounded), then "DONE ops=.. creates=.. gets=.. ... errors=.."
// at the end (exit 0; the handles still held are released by their
// destructors). Any unexpected exception or corrupt data prints
// "FAIL <what>" on stdout and stderr and exits 1.
//
// Errors that concurrency makes normal are counted, not fatal: NotFound
// (the name was removed meanwhile), AlreadyExists, StaleHandle (removed or
// re-created between a create and its publish), Lost, NotLeader and
// TimeoutError (no allocator of record answered in time).
//
// Data rule (sound under any interleaving): every tensor is u32 and only its
// creator writes it, always with the same pattern derived from (name,
// generation, index). The creator writes the pattern, then publish()es
// (event_version >= 1). A reader verifies a tensor only when it knows it was
// published: the record it opened had event_version >= 1, or a later info()
// of the same generation has. Until then the block may hold anything (pool
// blocks are reused and not zeroed), so an unpublished tensor is not checked.
// Rewrites by the creator store the same values, so a concurrent reader can
// never see anything but the pattern. A held handle keeps its memory: a
// block reused for another tensor while we hold it shows as a mismatch.
//
// Reference audit: this process is single-threaded, so the holder count of
// its session in a tensor's Hash must equal the number of distinct
// references it holds to that generation (copies, and gets of a name it
// already holds, share one: count distinct handles), plus at most those it
// holds to earlier generations of the name: a takeover moves a record to a
// new generation with its references (the old handle's release follows
// it), while a name removed and created again counts none of them. It may
// only be larger after a create whose outcome we could not learn
// (NotLeader or TimeoutError on a create: the allocator may have executed
// it for us).
// At the end, once every handle is released, no record in Redis may name
// this session as a holder (again, except after such creates).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cinttypes>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "memcuda/model.hpp"
#include "memcuda/redis/connection.hpp"
#include "soak_reader.hpp"

using namespace memcuda;

namespace {

volatile std::sig_atomic_t g_stop = 0;
void on_term(int) { g_stop = 1; }

std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::uint64_t name_hash(const std::string& s) {
  std::uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

std::uint32_t pattern(const std::string& name, std::uint64_t gen, std::uint64_t i) {
  return static_cast<std::uint32_t>(mix64(name_hash(name) ^ mix64(gen) ^ (i * 0x2545f4914f6cdd1dULL)));
}

struct Failure {
  std::string what;
};

[[noreturn]] void fail(const std::string& what) { throw Failure{what}; }

struct Held {
  SharedTensor<std::uint32_t> t;
  bool creator = false;
};

class Soak {
 public:
  Soak(TensorRegistry& reg, std::uint64_t seed, int names, bool faults)
      : reg_(reg), rng_(seed), faults_(faults), lossy_(faults) {
    for (int i = 0; i < names; ++i) pool_.push_back("soak." + std::to_string(i));
  }

  // ops < 0: until SIGTERM.
  void run(long ops) {
    const long step = ops < 0 ? 100 : std::max(1L, ops / 50);
    for (long i = 0; ops < 0 ? !g_stop : i < ops; ++i) {
      if (i % step == 0) std::cout << "AT " << i << std::endl;  // progress, for the test's kill schedule
      ++ops_;
      int r = pick(100);
      try {
        if (r < 25) do_create();
        else if (r < 55) do_get();
        else if (r < 72) do_release();
        else if (r < 80) do_remove();
        else if (r < 92) do_check();
        else if (faults_ && r < 95) do_publish();
        else do_audit();
      } catch (const NotFound& e) {
        count(e);
      } catch (const AlreadyExists& e) {
        count(e);
      } catch (const StaleHandle& e) {
        count(e);
      } catch (const Lost& e) {
        count(e);
      } catch (const NotLeader& e) {
        count(e);
      } catch (const TimeoutError& e) {
        count(e);
      } catch (const RedisError& e) {
        if (!faults_) throw;
        count(e);
      } catch (const Unavailable& e) {  // "the outcome is unknown": the link broke while the leader ran it
        if (!faults_) throw;
        count(e);
      }
      // Anything else (memcuda::Error of another kind, std::exception,
      // Failure) propagates to main and fails the run.
    }
  }

  // Drops every handle (each release is one script call).
  void release_all() {
    releases_ += static_cast<long>(held_.size());
    held_.clear();
    reg_.flush();  // releases are sent in the background: the check below reads Redis directly
  }

  // Once every handle is released, no record may still name this session
  // as a holder. Only a create whose outcome we could not learn (NotLeader
  // or TimeoutError: the allocator may have executed it after we gave up)
  // can leave one behind; a create that raced with a remove knew its
  // generation and must not leave its reference held.
  void check_no_leaked_references(const RegistryOptions& o) {
    redis::Connection c(o.redis);
    static constexpr const char* kHeld = R"lua(
local n, where = 0, {}
for _, pat in ipairs({'*memcuda:tensor:*', '*memcuda:removed:*'}) do  -- '{memcuda}:' on a cluster
  for _, k in ipairs(redis.call('KEYS', pat)) do
    -- a key of another type (a fault a test injected) holds no reference
    local v = 0
    if redis.call('TYPE', k)['ok'] == 'hash' then v = tonumber(redis.call('HGET', k, 'holder:' .. ARGV[1]) or '0') or 0 end
    if v > 0 then
      n = n + v
      table.insert(where, k .. ' (generation ' .. tostring(redis.call('HGET', k, 'generation')) .. ') x' .. v)
    end
  end
end
return {n, where}
)lua";
    auto r = c.command({"EVAL", kHeld, "0", reg_.session_id()});
    leaked_ = r[0].integer();
    if (leaked_ > uncertain_creates_ && !lossy_) {
      std::string where;
      for (std::size_t i = 0; i < r[1].size(); ++i) where += " " + std::string(r[1][i].str());
      fail(std::to_string(leaked_) + " reference(s) of this session (" + reg_.session_id() +
           ") are still in Redis after every handle was released:" + where + "; creates without a reply: " +
           std::to_string(uncertain_creates_) + ", creates that raced with a remove: " +
           std::to_string(raced_creates_));
    }
  }

  std::string summary() const {
    std::ostringstream o;
    long errors = 0;
    for (const auto& [k, v] : errors_) errors += v;
    o << "DONE ops=" << ops_ << " creates=" << creates_ << " gets=" << gets_ << " releases=" << releases_
      << " removes=" << removes_ << " rewrites=" << rewrites_ << " verified=" << verified_
      << " unverified=" << unverified_ << " audits=" << audits_ << " raced_creates=" << raced_creates_
      << " uncertain_creates=" << uncertain_creates_ << " publishes=" << publishes_ << " versions=" << versions_
      << " leaked_refs=" << leaked_ << " lossy=" << lossy_ << " errors=" << errors;
    for (const auto& [k, v] : errors_) o << " " << k << "=" << v;
    return o.str();
  }

 private:
  int pick(int n) { return static_cast<int>(std::uniform_int_distribution<int>(0, n - 1)(rng_)); }
  const std::string& any_name() { return pool_[static_cast<std::size_t>(pick(static_cast<int>(pool_.size())))]; }

  void count(const Error& e) {
    std::string code = e.code();
    ++errors_[code];
    if (code == "not_leader" || code == "timeout" || code == "redis_connection" || code == "redis_io")
      ambiguous_ = true;
  }

  Shape random_shape() {
    int r = pick(100);
    if (r < 3) return Shape{0};        // empty tensor: valid, 0 bytes
    if (r < 6) return Shape{};         // scalar
    if (r < 60) return Shape{1 + pick(2048)};
    return Shape{1 + pick(48), 1 + pick(48)};
  }

  void write_pattern(const SharedTensor<std::uint32_t>& t) {
    std::vector<std::uint32_t> v(t.size());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = pattern(t.name(), t.generation(), i);
    t.copy_from_host(v);
  }

  void verify(const SharedTensor<std::uint32_t>& t, const char* when) {
    std::vector<std::uint32_t> v(t.size());
    t.copy_to_host(v);
    for (std::size_t i = 0; i < v.size(); ++i) {
      auto want = pattern(t.name(), t.generation(), i);
      if (v[i] != want) {
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "data corruption (%s): '%s' generation %" PRIu64 " element %zu of %zu is 0x%08x, expected 0x%08x",
                      when, t.name().c_str(), t.generation(), i, v.size(), v[i], want);
        fail(buf);
      }
    }
    ++verified_;
  }

  // True when the tensor's creator has finished writing it (published).
  bool known_published(const SharedTensor<std::uint32_t>& t) {
    if (published_.count(t.generation())) return true;
    if (t.info().event_version >= 1) {
      published_.insert(t.generation());
      return true;
    }
    return false;
  }

  void hold(SharedTensor<std::uint32_t> t, bool creator) {
    held_.push_back(Held{std::move(t), creator});
    // keep the working set small: drop a random one beyond 24 handles
    if (held_.size() > 24) {
      held_.erase(held_.begin() + pick(static_cast<int>(held_.size())));
      ++releases_;
    }
  }

  void check_handle(const SharedTensor<std::uint32_t>& t, const std::string& name) {
    if (t.name() != name) fail("get('" + name + "') returned a handle named '" + t.name() + "'");
    if (t.dtype() != DType::u32) fail("'" + name + "' came back with dtype " + std::string(to_string(t.dtype())));
    if (t.generation() == 0) fail("'" + name + "' has generation 0");
    if (t.bytes() != 4 * t.size()) fail("'" + name + "': bytes do not match the shape");
    if (t.size() > 0 && t.data() == nullptr) fail("'" + name + "': null data pointer");
  }

  void do_create() {
    const std::string& name = any_name();
    CreateOptions co;
    co.persistent = pick(10) == 0;
    std::optional<SharedTensor<std::uint32_t>> made;
    try {
      made = reg_.create<std::uint32_t>(name, random_shape(), co);
    } catch (const NotFound&) {
      // "vanished right after its creation" (a create has no other
      // NotFound): removed by another process between the allocator's
      // reply and our read of the record.
      ++raced_creates_;
      throw;
    } catch (const StaleHandle&) {  // "replaced right after its creation"
      ++raced_creates_;
      throw;
    } catch (const NotLeader&) {  // no reply in time: it may still have been executed for us
      ++uncertain_creates_;
      throw;
    } catch (const RedisError&) {  // TimeoutError, or the link broke (--faults)
      ++uncertain_creates_;
      throw;
    }
    ++creates_;
    held_.push_back(Held{std::move(*made), true});
    const auto& t = held_.back().t;  // no copy: one Held per reference
    check_handle(t, name);
    write_pattern(t);
    // From here on readers may check it. StaleHandle (removed meanwhile) is
    // counted by run(); the handle stays held either way.
    t.publish();
    published_.insert(t.generation());
    verify(t, "creator, after publish");
    if (held_.size() > 24) {
      held_.erase(held_.begin());
      ++releases_;
    }
  }

  void do_get() {
    const std::string& name = any_name();
    auto t = reg_.get<std::uint32_t>(name);
    ++gets_;
    check_handle(t, name);
    if (known_published(t)) verify(t, "reader, at get");
    else ++unverified_;
    hold(std::move(t), false);
  }

  void do_release() {
    if (held_.empty()) return;
    held_.erase(held_.begin() + pick(static_cast<int>(held_.size())));
    ++releases_;
  }

  void do_remove() {
    reg_.remove(any_name());
    ++removes_;
  }

  // The creator rewrites its pattern (the same values); anybody verifies
  // what it holds once the tensor is known to be published.
  void do_check() {
    if (held_.empty()) return;
    auto& h = held_[static_cast<std::size_t>(pick(static_cast<int>(held_.size())))];
    if (h.creator) {
      write_pattern(h.t);
      ++rewrites_;
    }
    if (!known_published(h.t)) {
      std::optional<TensorInfo> i;
      try {
        i = reg_.info(h.t.name());
      } catch (const NotFound&) {
      }
      if (i && i->generation == h.t.generation() && i->event_version >= 1) published_.insert(h.t.generation());
    }
    if (known_published(h.t)) verify(h.t, h.creator ? "creator, rewrite" : "reader, held");
    else ++unverified_;
    (void)h.t.valid();  // one round trip; must not throw
  }

  // The creator writes its pattern again and publishes in place, or any
  // process bumps the version of the model "soak." (the names it holds).
  void do_publish() {
    if (pick(2) == 0) {
      for (auto& h : held_)
        if (h.creator) {
          write_pattern(h.t);
          h.t.publish();
          ++publishes_;
          return;
        }
    }
    versions_ = static_cast<long>(publish_version(reg_, "soak."));
  }

  // Our holder count in the Hash equals the references we hold.
  void do_audit() {
    if (held_.empty()) return;
    const auto& h = held_[static_cast<std::size_t>(pick(static_cast<int>(held_.size())))];
    const std::string name = h.t.name();
    const std::uint64_t gen = h.t.generation();
    TensorInfo i = reg_.info(name);  // NotFound: counted
    ++audits_;
    if (i.generation != gen) return;  // the name moved on; the old record is not readable by name
    // One reference per distinct handle: a get of a name this process
    // already holds shares the held handle (in-process reference sharing).
    // Handles of earlier generations of the name count here when a
    // takeover moved the record (not when the name was created again).
    std::set<const void*> handles, earlier;
    for (const auto& x : held_) {
      if (x.t.generation() == gen) handles.insert(x.t.handle().get());
      else if (x.t.generation() < gen && x.t.name() == name) earlier.insert(x.t.handle().get());
    }
    const auto expect = static_cast<std::int64_t>(handles.size());
    const auto most = expect + static_cast<std::int64_t>(earlier.size());
    std::int64_t mine = 0;
    if (auto it = i.holders.find(reg_.session_id()); it != i.holders.end()) mine = it->second;
    std::int64_t sum = 0;
    for (const auto& [k, v] : i.holders) sum += v;
    if (sum != i.refcount)
      fail("'" + name + "' generation " + std::to_string(gen) + ": refcount " + std::to_string(i.refcount) +
           " but its holders sum to " + std::to_string(sum));
    if (lossy_) return;  // a failover may have dropped a reference or a release of ours
    if (mine < expect || (!ambiguous_ && mine > most))
      fail("'" + name + "' generation " + std::to_string(gen) + ": this session (" + reg_.session_id() +
           ") holds " + std::to_string(expect) + " reference(s) (and " + std::to_string(most - expect) +
           " to earlier generations) but the Hash says holder:" + reg_.session_id() + "=" + std::to_string(mine));
  }

  TensorRegistry& reg_;
  std::mt19937_64 rng_;
  std::vector<std::string> pool_;
  std::vector<Held> held_;
  std::set<std::uint64_t> published_;
  std::map<std::string, long> errors_;
  bool faults_ = false, ambiguous_ = false, lossy_ = false;
  long raced_creates_ = 0, uncertain_creates_ = 0, leaked_ = 0, publishes_ = 0, versions_ = 0;
  long ops_ = 0, creates_ = 0, gets_ = 0, releases_ = 0, removes_ = 0, rewrites_ = 0, verified_ = 0,
       unverified_ = 0, audits_ = 0;
};

void report_failure(const std::string& what) {
  std::cout << "FAIL " << what << std::endl;
  std::cerr << "memcuda_soak_worker[" << ::getpid() << "] FAIL " << what << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGTERM, on_term);
  RegistryOptions o = RegistryOptions::from_env();
  std::optional<BackendKind> backend;
  std::uint64_t seed = 1;
  long ops = 1000;
  int names = 24, reader = 0;
  bool faults = false, verify_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) {
        std::cerr << "missing value after " << a << "\n";
        std::exit(2);
      }
      return std::string(argv[++i]);
    };
    try {
      if (a == "--url") o.redis = redis::parse_url(next());
      else if (a == "--seed") seed = std::stoull(next());
      else if (a == "--ops") ops = std::stol(next());
      else if (a == "--names") names = std::stoi(next());
      else if (a == "--no-control") o.control_thread = false;
      else if (a == "--faults") faults = true;
      else if (a == "--reader") reader = std::stoi(next());
      else if (a == "--verify") verify_only = true;
      else if (a == "--replica-wait") o.redis.replica_wait = std::chrono::milliseconds(std::stoll(next()));
      else if (a == "--reconnect") o.redis.reconnect_timeout = std::chrono::milliseconds(std::stoll(next()));
      else if (a == "--ttl") o.lease_ttl = std::chrono::milliseconds(std::stoll(next()));
      else if (a == "--timeout") o.request_timeout = std::chrono::milliseconds(std::stoll(next()));
      else if (a == "--backend") {
        std::string b = next();
        backend = backend_from_string(b);
        if (!backend) throw std::invalid_argument("unknown backend '" + b + "'");
      } else {
        std::cerr << "unknown argument " << a << "\n";
        return 2;
      }
    } catch (const std::exception& e) {
      std::cerr << "bad argument " << a << ": " << e.what() << "\n";
      return 2;
    }
  }
  if (names < 1 || ops < -1 || reader < 0) {
    std::cerr << "--names and --reader must be >= 1 and --ops >= -1\n";
    return 2;
  }
  o.default_backend = backend;
  try {
    TensorRegistry reg(o);
    std::cout << "START session=" << reg.session_id() << " pid=" << ::getpid() << " leader=" << reg.is_leader()
              << std::endl;
    if (reader > 0) return run_reader(reg, reader, verify_only, g_stop);
    Soak soak(reg, seed, names, faults);
    soak.run(ops);
    soak.release_all();  // every handle still held, before the registry goes
    reg.check();
    soak.check_no_leaked_references(o);
    const std::string done = soak.summary();
    std::cout << done << std::endl;
    return 0;
  } catch (const Failure& f) {
    report_failure(f.what);
  } catch (const Error& e) {
    report_failure(std::string("unexpected ") + e.code() + ": " + e.what());
  } catch (const std::exception& e) {
    report_failure(std::string("unexpected exception: ") + e.what());
  }
  return 1;
}
