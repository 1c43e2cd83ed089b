// The fd service's runtime directory and peer policy
// (include/memcuda/detail/fd/fd_access.hpp, fd_socket_dir.hpp; docs/fd-transfer.md,
// "Runtime directory and peer policy"), between real processes
// (memcuda_fd_peer). The fds are memfds, as in test_fd_transfer.cpp: no GPU.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "memcuda/detail/fd/fd_service.hpp"
#include "memcuda/detail/fd/fd_source.hpp"
#include "memcuda/detail/fd/fd_table.hpp"
#include "memcuda/detail/process/process.hpp"
#include "memcuda/detail/registry/context.hpp"
#include "memcuda/detail/registry/lease/lease.hpp"
#include "memcuda/detail/registry/takeover/standby.hpp"
#include "memcuda/memcuda.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"

using namespace memcuda::detail;
using memcuda::ProtocolError;
using memcuda::test::Child;
namespace fs = std::filesystem;

namespace {

Child peer() { return Child({memcuda::test::sibling_program("memcuda_fd_peer")}); }

// A fresh directory under /tmp (mode 0755, so that a peer of another uid can
// reach a runtime directory in it), removed with everything in it.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/mc-rt-XXXXXX";
    REQUIRE(::mkdtemp(tmpl));
    path = tmpl;
    ::chmod(path.c_str(), 0755);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string sub(const std::string& name) const { return path + "/" + name; }
};

std::string after_ok(const std::string& reply) {
  REQUIRE(reply.starts_with("ok "));
  return reply.substr(3);
}

mode_t mode_of(const std::string& p) {
  struct stat st{};
  REQUIRE(::lstat(p.c_str(), &st) == 0);
  return st.st_mode;
}

bool exists(const std::string& p) {
  struct stat st{};
  return ::lstat(p.c_str(), &st) == 0;
}

std::size_t sockets_in(const std::string& dir) {
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (parse_socket_name(e.path().filename().string())) ++n;
  return n;
}

// Skips the whole run with 77 and the reason (CTest: skipped); only for
// hidden cases, which CTest runs one per process.
[[noreturn]] void skip_case(const std::string& why) {
  std::cout << "SKIPPED: " << why << "\n";
  std::cout.flush();
  std::_Exit(77);
}

}  // namespace

TEST_CASE("runtime directory: names, paths and id lists are parsed strictly", "[fd]") {
  CHECK(normalize_runtime_dir("") == "/tmp/memcuda-" + std::to_string(::geteuid()));
  CHECK(normalize_runtime_dir("/shared/rt//") == "/shared/rt");
  CHECK_THROWS_AS(normalize_runtime_dir("shared/rt"), memcuda::InvalidArgument);
  CHECK_THROWS_AS(normalize_runtime_dir("/" + std::string(kMaxRuntimeDirBytes, 'x')), memcuda::InvalidArgument);

  const std::string n = socket_name(4242, 4026531836, 0xabcdef);
  CHECK(n == "fd-4242-4026531836-0000000000abcdef.sock");
  auto s = parse_socket_name(n);
  REQUIRE(s);
  CHECK(s->pid == 4242);
  CHECK(s->pid_ns == 4026531836u);
  for (const char* bad : {"fd-4242-4026531836-0000000000abcdeF.sock", "fd-4242-4026531836-0000000000abcde.sock",
                          "fd--1-4026531836-0000000000abcdef.sock", "fd-04242-4026531836-0000000000abcdef.sock",
                          "fd-4242-4026531836-0000000000abcdef.new", "fd-4242-0000000000abcdef.sock",
                          "xfd-4242-4026531836-0000000000abcdef.sock", "fd-0-4026531836-0000000000abcdef.sock"}) {
    INFO(bad);
    CHECK_FALSE(parse_socket_name(bad));
  }
  CHECK(parse_socket_path("/rt/" + n, "/rt"));
  CHECK_FALSE(parse_socket_path("/rt/sub/" + n, "/rt"));
  CHECK_FALSE(parse_socket_path("/rt2/" + n, "/rt"));
  CHECK_FALSE(parse_socket_path("/rt/../etc/" + n, "/rt"));

  CHECK(parse_id_list("1000, 1001", "x") == std::vector<std::uint32_t>{1000, 1001});
  for (const char* bad : {"1000,", ",1000", "a", "-1", "1000 1001", "4294967295"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_id_list(bad, "x"), memcuda::InvalidArgument);
  }
}

TEST_CASE("fd sources: only a socket in the reader's own runtime directory", "[security][fd]") {
  ServedSource s;
  s.id = 1;
  s.source.pid = 4242;
  const std::string dir = "/run/shared/memcuda";
  const std::string name = socket_name(4242, 4026531836, 0x0123456789abcdef);
  s.source.address = dir + "/" + name;
  CHECK_NOTHROW(check_fd_source(s, 4242, "t", dir));
  CHECK_THROWS_AS(check_fd_source(s, 4243, "t", dir), ProtocolError);  // not the record's owner
  for (const std::string& bad :
       {"/tmp/" + name, dir + "/sub/" + name, dir + "/../memcuda/" + name, dir + "x/" + name,
        dir + "/" + socket_name(4243, 4026531836, 1), dir + "/fd-4242.sock", std::string("/etc/passwd"),
        std::string("@some-other-program"), "@" + dir + "/" + name, dir + "/" + name + "/",
        std::string("@memcuda-fd-4242-0123456789abcdef")}) {
    INFO(bad);
    s.source.address = bad;
    try {
      check_fd_source(s, 4242, "t", dir);
      FAIL("accepted");
    } catch (const ProtocolError& e) {
      CHECK(e.errc() == memcuda::ProtocolErrc::bad_record);
      CHECK_THAT(e.what(), Catch::Contains(dir));  // says which directory it expected
    }
  }
}

TEST_CASE("runtime directory: created 0700, a symlink or another uid's directory is refused", "[fd]") {
  TempDir t;
  FdAccess a{t.sub("rt"), {}, {}};
  prepare_runtime_dir(a);
  CHECK((mode_of(a.runtime_dir) & 07777) == 0700);
  ::chmod(a.runtime_dir.c_str(), 0755);  // ours: put back to the policy's mode
  prepare_runtime_dir(a);
  CHECK((mode_of(a.runtime_dir) & 07777) == 0700);

  FdAccess shared{t.sub("rt"), {}, {::getegid()}};  // a group: 2770, that group
  prepare_runtime_dir(shared);
  CHECK((mode_of(a.runtime_dir) & 07777) == 02770);

  REQUIRE(::symlink(a.runtime_dir.c_str(), t.sub("link").c_str()) == 0);
  try {
    prepare_runtime_dir(FdAccess{t.sub("link"), {}, {}});
    FAIL("a symlink was accepted");
  } catch (const FdTransferError& e) {
    CHECK(e.reason() == FdErrc::runtime_dir);
    CHECK_THAT(e.what(), Catch::Contains("symbolic link"));
  }
  REQUIRE(::close(::open(t.sub("file").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600)) == 0);
  CHECK_THROWS_AS(prepare_runtime_dir(FdAccess{t.sub("file"), {}, {}}), FdTransferError);
  CHECK_THROWS_AS(prepare_runtime_dir(FdAccess{t.sub("no/such/parent"), {}, {}}), FdTransferError);

  if (::geteuid() == 0) {  // a directory another user made first (in /tmp: squatting)
    const std::string other = t.sub("other");
    REQUIRE(::mkdir(other.c_str(), 0700) == 0);
    REQUIRE(::chown(other.c_str(), 65534, 65534) == 0);
    try {
      prepare_runtime_dir(FdAccess{other, {}, {}});
      FAIL("another uid's directory was accepted");
    } catch (const FdTransferError& e) {
      CHECK(e.reason() == FdErrc::runtime_dir);
      CHECK_THAT(e.what(), Catch::Contains("owned by uid 65534"));
    }
    CHECK_NOTHROW(prepare_runtime_dir(FdAccess{other, {65534}, {}}));  // the policy allows that uid
    CHECK((mode_of(other) & 07777) == 0700);  // not ours: left as it is
  }
}

TEST_CASE("one runtime directory and policy per process: a second one is refused while pinned", "[fd]") {
  TempDir t;
  auto p1 = FdService::pin(FdAccess{t.sub("a"), {}, {}});
  auto p2 = FdService::pin(FdAccess{t.sub("a") + "/", {}, {}});  // the same, once normalized
  CHECK(FdService::access().runtime_dir == t.sub("a"));
  CHECK_THROWS_AS(FdService::pin(FdAccess{t.sub("b"), {}, {}}), memcuda::InvalidArgument);
  CHECK_THROWS_AS(FdService::pin(FdAccess{t.sub("a"), {1000}, {}}), memcuda::InvalidArgument);
  p1.reset();
  p2.reset();
  auto p3 = FdService::pin(FdAccess{t.sub("b"), {}, {}});  // nothing pinned, no service: free again
  CHECK(FdService::access().runtime_dir == t.sub("b"));
}

TEST_CASE("two processes share an fd through a socket in the runtime directory", "[fd]") {
  TempDir t;
  const std::string dir = t.sub("rt");
  Child owner = peer(), reader = peer();
  REQUIRE(owner.ask("use " + dir + " - -") == "ok");
  const std::string addr = after_ok(owner.ask("service"));
  CHECK(addr.starts_with(dir + "/fd-" + std::to_string(owner.pid()) + "-"));
  CHECK(parse_socket_path(addr, dir));
  CHECK(S_ISSOCK(mode_of(addr)));
  CHECK((mode_of(addr) & 0777) == 0600);
  CHECK((mode_of(dir) & 07777) == 0700);
  const std::string src = after_ok(owner.ask("servefd 7 shared-through-the-dir"));
  CHECK(decode_fd_source(src).source.address == addr);  // what a record's fd_source carries

  REQUIRE(reader.ask("use " + dir + " - -") == "ok");
  const std::string pid = std::to_string(owner.pid());
  CHECK(reader.ask("open socket " + pid + " " + src) == "ok socket shared-through-the-dir");
  CHECK(owner.ask("stats").starts_with("ok 1 0 "));  // served once over the socket
  CHECK(reader.ask("open auto " + pid + " " + src).ends_with(" shared-through-the-dir"));

  // A reader whose runtime directory is another refuses the source before
  // it connects: the owner serves nobody more.
  Child stranger = peer();
  REQUIRE(stranger.ask("use " + t.sub("elsewhere") + " - -") == "ok");
  std::string r = stranger.ask("open socket " + pid + " " + src);
  CHECK(r.starts_with("err bad_record "));
  CHECK_THAT(r, Catch::Contains(t.sub("elsewhere")));
  const std::string st = owner.ask("stats");
  CHECK((st.starts_with("ok 1 0 ") || st.starts_with("ok 2 0 ")));  // 2: the auto open took the socket

  owner.send("quit");  // a clean stop removes the socket file
  CHECK(owner.wait() == 0);
  CHECK_FALSE(exists(addr));
}

TEST_CASE("a SIGKILLed server's socket: a reader gets no_server, the next server sweeps it", "[fd]") {
  TempDir t;
  const std::string dir = t.sub("rt");
  Child dead = peer(), live = peer();
  REQUIRE(dead.ask("use " + dir + " - -") == "ok");
  REQUIRE(live.ask("use " + dir + " - -") == "ok");
  const std::string dead_addr = after_ok(dead.ask("service"));
  const std::string src = after_ok(dead.ask("servefd 1 gone"));
  const std::string live_addr = after_ok(live.ask("service"));
  const std::string live_src = after_ok(live.ask("servefd 2 alive"));
  const pid_t dead_pid = dead.pid();
  dead.kill(SIGKILL);
  dead.wait();
  REQUIRE(exists(dead_addr));  // a SIGKILL leaves the file
  CHECK(sockets_in(dir) == 2);

  Child reader = peer();
  REQUIRE(reader.ask("use " + dir + " - -") == "ok");
  std::string r = reader.ask("open socket " + std::to_string(dead_pid) + " " + src);
  CHECK(r.starts_with("err no_server "));
  CHECK_THAT(r, Catch::Contains("Connection refused"));

  Child next = peer();  // a server that starts sweeps the dead one's socket, not the live one's
  REQUIRE(next.ask("use " + dir + " - -") == "ok");
  const std::string next_addr = after_ok(next.ask("service"));
  CHECK_FALSE(exists(dead_addr));
  CHECK(exists(live_addr));
  CHECK(exists(next_addr));
  CHECK(sockets_in(dir) == 2);
  CHECK(reader.ask("open socket " + std::to_string(live.pid()) + " " + live_src) == "ok socket alive");
  CHECK(live.ask("stats").starts_with("ok 1 0 "));  // the sweep's probe is no refusal
}

// A registry's standby (real Redis) with runtime_dir set: it holds the fd
// another process publishes from a socket of that directory, and refuses an
// entry whose socket is in another directory before it asks (a pidfd fetch
// would succeed here as root: only the check keeps it out).
TEST_CASE("standby: holds what another process serves in its runtime directory, refuses another directory's",
          "[fd][vmm][redis]") {
  TempDir t;
  memcuda::test::RedisServer srv;
  memcuda::RegistryOptions o;
  o.redis = srv.options();
  o.name_space = "rd";
  o.runtime_dir = t.sub("rt") + "/";
  Context cb(o);
  CHECK(cb.opts.runtime_dir == t.sub("rt"));  // normalized, as options() shows it
  CHECK(FdService::access().runtime_dir == t.sub("rt"));
  Lease lb(cb);
  Standby sb(cb, lb);
  Child owner = peer(), stranger = peer();
  REQUIRE(owner.ask("use " + t.sub("rt") + " - -") == "ok");
  REQUIRE(stranger.ask("use " + t.sub("other") + " - -") == "ok");
  const std::string src = after_ok(owner.ask("servefd 1 in-the-dir"));
  const std::string src2 = after_ok(stranger.ask("servefd 2 elsewhere"));
  const std::string s1 = std::to_string(owner.pid()) + "-0123456789abcdef";
  const std::string s2 = std::to_string(stranger.pid()) + "-0123456789abcdef";
  const std::string k1 = "vmm:" + s1 + ":1", k2 = "vmm:" + s2 + ":2";
  auto c = srv.connect();
  c.command({"HSET", "rd:memcuda:allocations", k1, s1 + " " + src, k2, s2 + " " + src2});
  c.command({"SET", "rd:memcuda:allocations_version", "by-hand"});
  auto p = sb.sync_once(c, true);
  CHECK(p.fetched == 1);
  CHECK(p.failed == 1);
  auto& holds = Process::get().fds();
  CHECK_FALSE(holds.held(k2));
  {
    UniqueFd fd = holds.dup(k1);
    REQUIRE(fd);
    char buf[16] = {};
    CHECK(::pread(fd.get(), buf, 10, 0) == 10);
    CHECK(std::string(buf) == "in-the-dir");
  }
  CHECK(stranger.ask("stats").starts_with("ok 0 0 "));  // never asked
  c.command({"DEL", "rd:memcuda:allocations"});
  c.command({"SET", "rd:memcuda:allocations_version", "by-hand-2"});
  CHECK(sb.sync_once(c, true).dropped == 1);
  CHECK_FALSE(holds.held(k1));
}

// Needs root: a peer of another uid (setuid), and new network and pid
// namespaces (unshare). Hidden, as test_fd_transfer.cpp's [fd-root] case.
TEST_CASE("peer policy: another uid is refused by SO_PEERCRED, an allowed uid or gid is served",
          "[.][fd-root]") {
  if (::geteuid() != 0) skip_case("a peer of another uid needs root to start (run the tests as root, as CI does)");
  TempDir t;
  Child owner = peer();

  SECTION("default policy: the directory's mode keeps another uid out, with a typed error") {
    const std::string dir = t.sub("rt");
    REQUIRE(owner.ask("use " + dir + " - -") == "ok");
    const std::string src = after_ok(owner.ask("servefd 1 root-only"));
    Child c = peer();
    REQUIRE(c.ask("use " + dir + " - -") == "ok");
    REQUIRE(c.ask("setuid 65534") == "ok");
    std::string r = c.ask("open socket " + std::to_string(owner.pid()) + " " + src);
    CHECK(r.starts_with("err permission "));
    CHECK_THAT(r, Catch::Contains("Permission denied") && Catch::Contains("MEMCUDA_ALLOWED_GIDS"));
  }
  SECTION("a uid policy: the socket is reachable, SO_PEERCRED refuses uids it does not list") {
    const std::string dir = t.sub("rt");
    REQUIRE(owner.ask("use " + dir + " 12345 -") == "ok");
    const std::string src = after_ok(owner.ask("servefd 1 for-12345"));
    CHECK((mode_of(dir) & 07777) == 01777);
    CHECK((mode_of(decode_fd_source(src).source.address) & 0777) == 0666);
    Child c = peer();
    REQUIRE(c.ask("use " + dir + " 12345 -") == "ok");
    REQUIRE(c.ask("setuid 65534") == "ok");
    std::string r = c.ask("open socket " + std::to_string(owner.pid()) + " " + src);
    CHECK(r.starts_with("err permission "));
    CHECK_THAT(r, Catch::Contains("uid 65534") && Catch::Contains("not allowed by the policy") &&
                      Catch::Contains("uids 12345"));
    CHECK(owner.ask("stats").starts_with("ok 0 1 "));  // the server counted (and logged) it
  }
  SECTION("an allowed uid is served") {
    const std::string dir = t.sub("rt");
    REQUIRE(owner.ask("use " + dir + " 65534 -") == "ok");
    const std::string src = after_ok(owner.ask("servefd 1 for-nobody"));
    Child c = peer();
    REQUIRE(c.ask("use " + dir + " 65534 -") == "ok");
    REQUIRE(c.ask("setuid 65534") == "ok");
    CHECK(c.ask("open socket " + std::to_string(owner.pid()) + " " + src) == "ok socket for-nobody");
    CHECK(owner.ask("stats").starts_with("ok 1 0 "));
  }
  SECTION("an allowed gid is served: group directory and socket") {
    const std::string dir = t.sub("rt");
    REQUIRE(owner.ask("use " + dir + " - 65534") == "ok");
    const std::string src = after_ok(owner.ask("servefd 1 for-the-group"));
    struct stat st{};
    REQUIRE(::lstat(dir.c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == 02770);
    CHECK(st.st_gid == 65534);
    CHECK((mode_of(decode_fd_source(src).source.address) & 0777) == 0660);
    Child c = peer();
    REQUIRE(c.ask("use " + dir + " - 65534") == "ok");
    REQUIRE(c.ask("setuid 65534") == "ok");  // uid and gid 65534
    CHECK(c.ask("open socket " + std::to_string(owner.pid()) + " " + src) == "ok socket for-the-group");
  }
}

TEST_CASE("an owner in other network and pid namespaces is reached through the runtime directory",
          "[.][fd-root]") {
  if (::geteuid() != 0) skip_case("new network and pid namespaces need root (unshare)");
  TempDir t;
  const std::string dir = t.sub("rt");
  Child owner = peer();
  std::string ns = owner.ask("newpidns");
  if (ns != "ok") skip_case("cannot make a new pid namespace here: " + ns);
  ns = owner.ask("newnetns");
  if (ns != "ok") skip_case("cannot make a new network namespace here: " + ns);
  // An abstract socket of the owner's network namespace: out of our reach.
  const std::string abstract = "@memcuda-test-netns-" + std::to_string(::getpid());
  REQUIRE(owner.ask("serve " + abstract).starts_with("ok "));
  REQUIRE(owner.ask("memfd 5 abstract").starts_with("ok "));
  Child reader = peer();
  std::string r = reader.ask("fetch socket 5 " + abstract + " 0 -1 0 0");
  CHECK(r.starts_with("err no_server "));

  REQUIRE(owner.ask("use " + dir + " - -") == "ok");
  const std::string src = after_ok(owner.ask("servefd 1 across-namespaces"));
  auto s = decode_fd_source(src);
  CHECK(s.source.pid == 1);  // the first process of its pid namespace
  REQUIRE(reader.ask("use " + dir + " - -") == "ok");
  CHECK(reader.ask("open auto 1 " + src) == "ok socket across-namespaces");
  // pid 1 here is another process: the fast path must not address it.
  r = reader.ask("open pidfd 1 " + src);
  CHECK(r.starts_with("err pidfd_failed "));
  CHECK_THAT(r, Catch::Contains("another pid namespace"));
}
