// Batched fetches and prefetch over the fd socket (fd_wire.hpp,
// fd_table.hpp; docs/fd-transfer.md, "Batches and prefetch"), between
// real processes (memcuda_fd_peer) with memfds. Every fetch here goes over
// the socket (fetch_fd, fetch_many): what a reader in another pid namespace
// does for every allocation.
#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <sstream>
#include <thread>

#include "memcuda/detail/fd/fd_client.hpp"
#include "memcuda/detail/fd/fd_server.hpp"
#include "memcuda/detail/fd/fd_table.hpp"
#include "memcuda/detail/process/process.hpp"
#include "support/process.hpp"
#include "support/timing.hpp"

using namespace memcuda::detail;
using memcuda::test::Child;
using namespace std::chrono_literals;

namespace {

std::string unique_address(const char* what) {
  static int n = 0;
  return "@memcuda-test/fdp/" + std::to_string(::getpid()) + "/" + what + "/" + std::to_string(++n);
}

Child peer() { return Child({memcuda::test::sibling_program("memcuda_fd_peer")}); }

std::vector<std::string> words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> w;
  for (std::string x; in >> x;) w.push_back(x);
  return w;
}

std::string read_fd(int fd) {
  std::string out(256, '\0');
  ssize_t n = ::pread(fd, out.data(), out.size(), 0);
  return out.substr(0, n > 0 ? static_cast<std::size_t>(n) : 0);
}

// A peer serving memfds 1..n at a new address, each holding "a<id>".
std::string serve_n(Child& owner, int n) {
  const std::string addr = unique_address("owner");
  REQUIRE(owner.ask("serve " + addr).starts_with("ok "));
  for (int i = 1; i <= n; ++i) REQUIRE(owner.ask("memfd " + std::to_string(i) + " a" + std::to_string(i)).starts_with("ok "));
  return addr;
}

// The owner's server: requests answered, fds sent along.
std::pair<int, int> server_counts(Child& owner) {
  auto w = words(owner.ask("sstats"));
  REQUIRE(w.size() == 3);
  return {std::stoi(w[1]), std::stoi(w[2])};
}

// A reader's FdTable: parked, hits, dropped, requests.
std::vector<int> parking(Child& reader) {
  auto w = words(reader.ask("parked"));
  REQUIRE(w.size() == 5);
  return {std::stoi(w[1]), std::stoi(w[2]), std::stoi(w[3]), std::stoi(w[4])};
}

// This process's prefetch setting for one case, then the default again.
struct Prefetch {
  Prefetch(int n, std::chrono::milliseconds window) { Process::get().fds().configure(n, window); }
  ~Prefetch() { Process::get().fds().configure(FdTable::kDefaultOffer, FdTable::kDefaultWindow); }
};

}  // namespace

TEST_CASE("a batched fetch returns the fd of every id asked for, an unknown or withdrawn id failing alone", "[fd]") {
  Prefetch off(0, 10s);
  Child owner = peer();
  constexpr int kServed = 300;  // more than one message carries (253 fds): two requests
  const std::string addr = serve_n(owner, kServed);
  REQUIRE(owner.ask("drop 7") == "ok");  // freed by its owner
  std::vector<std::uint64_t> ids;
  for (std::uint64_t i = 1; i <= kServed; ++i) ids.push_back(i);
  ids.push_back(999);  // never served
  auto got = fetch_many(addr, ids, 5s);
  REQUIRE(got.size() == ids.size());
  int ok = 0;
  for (auto& b : got) {
    INFO("id " << b.id);
    if (b.id == 7 || b.id == 999) {
      REQUIRE_FALSE(b.fd);
      try {
        std::rethrow_exception(b.error);
      } catch (const FdTransferError& e) {
        CHECK(e.reason() == FdErrc::unknown_id);
        CHECK_THAT(e.what(), Catch::Contains(std::to_string(b.id)));
      }
      continue;
    }
    REQUIRE(b.fd);
    CHECK(read_fd(b.fd.get()) == "a" + std::to_string(b.id));
    ++ok;
  }
  CHECK(ok == kServed - 1);
  CHECK(server_counts(owner).first == 2);  // 301 ids: 253 + 48

  // From another process too, and small batches in one request each.
  Child reader = peer();
  REQUIRE(reader.ask("prefetch 0 10000") == "ok");
  CHECK(reader.ask("many " + addr + " 3,7,4") == "ok 3=a3 7!unknown_id 4=a4");
  CHECK(server_counts(owner).first == 3);
}

TEST_CASE("an owner sends its other allocations along, and the reader's next opens ask nothing", "[fd]") {
  Child owner = peer();
  const std::string addr = serve_n(owner, 100);
  Child reader = peer();
  REQUIRE(reader.ask("prefetch 64 60000") == "ok");
  CHECK(reader.ask("fetchsock 1 " + addr) == "ok a1");
  // A first request takes FdTable::kFirstOffer along.
  CHECK(server_counts(owner) == std::pair<int, int>{1, FdTable::kFirstOffer});
  CHECK(parking(reader)[0] == FdTable::kFirstOffer);
  for (int i = 2; i <= 9; ++i) CHECK(reader.ask("fetchsock " + std::to_string(i) + " " + addr) == "ok a" + std::to_string(i));
  CHECK(server_counts(owner).first == 1);  // nine opens, one request
  CHECK(parking(reader) == std::vector<int>{0, 8, 0, 1});
  // What came along was used: each next request takes twice as many, up to 64.
  for (int i = 10; i <= 100; ++i) CHECK(reader.ask("fetchsock " + std::to_string(i) + " " + addr) == "ok a" + std::to_string(i));
  CHECK(server_counts(owner) == std::pair<int, int>{4, 8 + 16 + 32 + 40});  // asked: 1, 10, 27, 60
  CHECK(parking(reader) == std::vector<int>{0, 96, 0, 4});
  // Sent once per connection: a request for one sent before brings nothing new.
  CHECK(reader.ask("fetchsock 4 " + addr) == "ok a4");
  CHECK(server_counts(owner) == std::pair<int, int>{5, 96});

  SECTION("without prefetch every open is a request") {
    Child plain = peer();
    REQUIRE(plain.ask("prefetch 0 60000") == "ok");
    for (int i = 1; i <= 5; ++i) CHECK(plain.ask("fetchsock " + std::to_string(i) + " " + addr) == "ok a" + std::to_string(i));
    CHECK(server_counts(owner).first == 5 + 5);
    CHECK(parking(plain)[0] == 0);
  }
}

TEST_CASE("a parked fd goes when its allocation is freed, after its window, and beyond the bound", "[fd]") {
  Child owner = peer();
  const std::string addr = serve_n(owner, 5);
  Child reader = peer();
  REQUIRE(reader.ask("prefetch 64 60000") == "ok");
  REQUIRE(reader.ask("fetchsock 1 " + addr) == "ok a1");
  CHECK(parking(reader)[0] == 4);
  CHECK(reader.ask("memfds") == "ok 4");  // the parked fds: memory held in the reader

  // The owner frees allocation 3: the reader's parked fd alone keeps it,
  // until the owner's notice (the registry's inbox calls drop_allocation).
  REQUIRE(owner.ask("drop 3") == "ok");
  // The server's thread closes the copies it sent a moment after the
  // reader has them: wait for that, then count.
  CHECK(memcuda::test::eventually([&] { return owner.ask("memfds") == "ok 4"; }, 10s));
  CHECK(reader.ask("memfds") == "ok 4");
  REQUIRE(reader.ask("forget peer 3") == "ok");
  CHECK(parking(reader)[0] == 3);
  CHECK(reader.ask("memfds") == "ok 3");  // memfd 3 is gone from every process now

  // The window: what waited longer is dropped at the next call.
  REQUIRE(reader.ask("prefetch 64 200") == "ok");
  std::this_thread::sleep_for(400ms);
  REQUIRE(reader.ask("expire") == "ok");
  CHECK(parking(reader)[0] == 0);
  CHECK(reader.ask("memfds") == "ok 0");
  CHECK(parking(reader)[2] == 4);  // dropped unused: 1 by the notice, 3 by the window

  // The bound: at most FdTable::kMaxParked, whatever the owners send.
  Child big = peer();
  const std::string many = serve_n(big, 300);
  REQUIRE(reader.ask("prefetch 64 60000") == "ok");
  // Unused, the offers stay at kFirstOffer: ask for each first id not sent yet.
  for (int id = 1; id <= 300; id += FdTable::kFirstOffer + 1)
    REQUIRE(reader.ask("fetchsock " + std::to_string(id) + " " + many) == "ok a" + std::to_string(id));
  CHECK(server_counts(big).second > static_cast<int>(FdTable::kMaxParked));
  CHECK(parking(reader)[0] == static_cast<int>(FdTable::kMaxParked));
  CHECK(reader.ask("memfds") == "ok " + std::to_string(FdTable::kMaxParked));
}
