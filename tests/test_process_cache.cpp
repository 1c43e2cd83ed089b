// ProcessCache opens an import once per allocation and without its lock:
// a slow first open (a cuMem fd fetched from a stalled exporter waits up to
// its timeout) must not stall cache hits or opens of other allocations, and
// concurrent first opens of one allocation must share one mapping or one
// error. The opens here are the cache's own callback; what they map is
// plain process memory, since the cache's contract is the same for every
// backend.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/detail/backend/process_cache.hpp"

using namespace memcuda;
using namespace memcuda::detail;

namespace {

class BufferMapping final : public Mapping {
 public:
  explicit BufferMapping(std::size_t n) : buf_(new char[n]) {
    base_ = buf_.get();
    size_ = n;
  }

 private:
  std::unique_ptr<char[]> buf_;
};

// A unique owner per case: the cache is process-wide.
std::string owner_for(const char* what) {
  static std::atomic<int> n{0};
  return std::string("test-process-cache-") + what + "-" + std::to_string(n++);
}

constexpr auto kGenerous = std::chrono::seconds(20);

}  // namespace

TEST_CASE("process cache: a slow first open stalls neither hits nor opens of other allocations", "[process_cache][threads]") {
  auto& pc = Process::get().cache();
  const std::string owner = owner_for("slow");
  // A mapping already open: later gets of it are hits.
  auto [hot_base, hot_keep] = pc.resolve(owner, 1, [] { return std::make_unique<BufferMapping>(64); });
  REQUIRE(hot_base != nullptr);

  std::promise<void> entered, release;
  auto release_f = release.get_future().share();
  auto slow = std::async(std::launch::async, [&] {
    return pc.resolve(owner, 2, [&]() -> std::unique_ptr<Mapping> {
      entered.set_value();
      release_f.wait();  // the stalled exporter
      return std::make_unique<BufferMapping>(64);
    });
  });
  entered.get_future().wait();

  // While that open waits: a hit and another allocation's first open finish.
  auto others = std::async(std::launch::async, [&] {
    auto hit = pc.resolve(owner, 1, [] { return std::make_unique<BufferMapping>(64); });
    auto other = pc.resolve(owner, 3, [] { return std::make_unique<BufferMapping>(64); });
    return std::make_pair(hit.first, other.first != nullptr);
  });
  const bool finished = others.wait_for(kGenerous) == std::future_status::ready;
  release.set_value();  // whatever happened, let the slow open end
  REQUIRE(finished);    // before: both waited on the lock held across the slow open
  auto [hit_base, other_ok] = others.get();
  CHECK(hit_base == hot_base);
  CHECK(other_ok);
  CHECK(slow.get().first != nullptr);
}

TEST_CASE("process cache: concurrent first opens of one allocation share one mapping", "[process_cache][threads]") {
  auto& pc = Process::get().cache();
  const std::string owner = owner_for("once");
  std::atomic<int> opens{0};
  std::promise<void> entered, release;
  auto release_f = release.get_future().share();
  auto open = [&]() -> std::unique_ptr<Mapping> {
    if (opens.fetch_add(1) == 0) {
      entered.set_value();
      release_f.wait();
    }
    return std::make_unique<BufferMapping>(64);
  };
  auto first = std::async(std::launch::async, [&] { return pc.resolve(owner, 7, open); });
  entered.get_future().wait();
  std::vector<std::future<std::pair<void*, std::shared_ptr<void>>>> rest;
  for (int i = 0; i < 4; ++i) rest.push_back(std::async(std::launch::async, [&] { return pc.resolve(owner, 7, open); }));
  // The followers wait on the open in flight: none finishes, none opens.
  for (int spins = 0; spins < 200 && pc.opening() != 1; ++spins) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(pc.opening() == 1);
  release.set_value();
  void* base = first.get().first;
  for (auto& f : rest) CHECK(f.get().first == base);
  CHECK(opens.load() == 1);
  CHECK(pc.opening() == 0);
}

TEST_CASE("process cache: a failed open reaches every waiter, and the next get opens anew", "[process_cache][threads]") {
  auto& pc = Process::get().cache();
  const std::string owner = owner_for("fail");
  std::promise<void> entered, release;
  auto release_f = release.get_future().share();
  auto failing = std::async(std::launch::async, [&] {
    return pc.resolve(owner, 9, [&]() -> std::unique_ptr<Mapping> {
      entered.set_value();
      release_f.wait();
      throw Unavailable("the exporter did not answer");
    });
  });
  entered.get_future().wait();
  auto waiter = std::async(std::launch::async, [&] {
    return pc.resolve(owner, 9, []() -> std::unique_ptr<Mapping> { return std::make_unique<BufferMapping>(8); });
  });
  for (int spins = 0; spins < 200 && pc.opening() != 1; ++spins) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  release.set_value();
  CHECK_THROWS_AS(failing.get(), Unavailable);
  // The waiter either shared the failed open (its error) or came after it
  // and opened anew: never a hang, never a null mapping.
  bool shared_error = false;
  void* got = nullptr;
  try {
    got = waiter.get().first;
  } catch (const Unavailable&) {
    shared_error = true;  // the waiter shared the open's error
  }
  CHECK((shared_error || got != nullptr));
  CHECK(pc.opening() == 0);
  auto again = pc.resolve(owner, 9, [] { return std::make_unique<BufferMapping>(8); });
  CHECK(again.first != nullptr);
}
