// The `memcuda` command-line tool, driven as a user drives it: the real
// binary is run with fork/exec, its stdout, stderr and exit code captured,
// against a private redis-server. The allocator of record is either a
// TensorRegistry in this process (host backend) or a `memcuda serve` child.
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "memcuda/memcuda.hpp"
#include "memcuda/protocol/record.hpp"
#include "memcuda/redis/connection.hpp"
#include "support/gpu.hpp"
#include "support/process.hpp"
#include "support/redis_server.hpp"
#include "support/registry_options.hpp"
#include "support/text.hpp"
#include "support/standby_sync.hpp"
#include "support/worker.hpp"

using namespace memcuda;
using namespace std::chrono_literals;
namespace json = boost::json;

extern char** environ;

namespace {

constexpr int kTtlMs = 400;

using test::cli_path;
using test::contains;

struct Run {
  int code = -1;
  std::string out;
  std::string err;
};

std::ostream& operator<<(std::ostream& os, const Run& r) {
  return os << "exit " << r.code << "\n--- stdout\n" << r.out << "--- stderr\n" << r.err;
}

// Environment changes for one run: a value sets the variable, nullopt
// removes it. MEMCUDA_REDIS_URL is removed unless given, so the caller's
// environment cannot steer the tool.
using Env = std::map<std::string, std::optional<std::string>>;

// Runs the tool to completion (at most `limit`), stdin from /dev/null.
Run memcuda_cli(const std::vector<std::string>& args, Env env = {}, std::chrono::seconds limit = 30s) {
  if (!env.count(redis::kUrlEnv)) env[redis::kUrlEnv] = std::nullopt;
  // Built before fork: this process has threads, so the child may only
  // make async-signal-safe calls before exec.
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    if (!env.count(kv.substr(0, kv.find('=')))) envs.push_back(kv);
  }
  for (const auto& [k, v] : env)
    if (v) envs.push_back(k + "=" + *v);
  std::vector<char*> envp;
  for (auto& s : envs) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_s{cli_path()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);

  int out[2], err[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(err, O_CLOEXEC) == 0);
  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(devnull, 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(devnull);
  ::close(out[1]);
  ::close(err[1]);
  Run r;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* sinks[2] = {&r.out, &r.err};
  int open_fds = 2;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  bool timed_out = false;
  while (open_fds > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    if (::poll(fds, 2, static_cast<int>(left.count())) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[i]->append(buf, static_cast<std::size_t>(n));
      } else {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  if (timed_out) ::kill(pid, SIGKILL);
  for (auto& f : fds)
    if (f.fd >= 0) ::close(f.fd);
  int st = 0;
  ::waitpid(pid, &st, 0);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  INFO("memcuda " << [&] {
    std::string s;
    for (const auto& a : args) s += a + " ";
    return s;
  }() << "\n" << r);
  REQUIRE_FALSE(timed_out);
  return r;
}

// The tool against this server (unix socket), with more arguments.
std::vector<std::string> at(const test::RedisServer& srv, std::vector<std::string> args) {
  args.insert(args.begin(), {"--url", srv.unix_url()});
  return args;
}

json::value parse_json(const Run& r) {
  INFO(r);
  boost::system::error_code ec;
  json::value v = json::parse(r.out, ec);
  REQUIRE_FALSE(ec);
  return v;
}

RegistryOptions host_opts(const test::RedisServer& srv, bool control, std::string ns = {}) {
  auto o = test::host_options(srv, control);
  o.lease_ttl = std::chrono::milliseconds(kTtlMs);
  o.request_timeout = 3s;
  o.name_space = std::move(ns);
  return o;
}

using test::persistent;

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

const json::object* find_holder(const json::array& holders, const std::string& id) {
  for (const auto& h : holders)
    if (h.at("id").as_string() == id) return &h.as_object();
  return nullptr;
}

// A pid that belongs to no process: a child that has exited and been
// reaped (the kernel hands pids out in order, so it is not reused at once).
pid_t dead_pid() {
  pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  ::waitpid(p, nullptr, 0);
  return p;
}

using test::read_until;

std::uint64_t leader_epoch(redis::Connection& c, const std::string& prefix = {}) {
  auto tok = std::string(c.command({"GET", prefix + "memcuda:leader"}).str());
  return std::stoull(tok.substr(0, tok.find(' ')));
}

}  // namespace

TEST_CASE("memcuda ls: empty, sorted table with totals, pattern, JSON", "[cli][redis]") {
  test::RedisServer srv;
  TensorRegistry reg(host_opts(srv, true));
  REQUIRE(reg.is_leader());

  auto r = memcuda_cli(at(srv, {"ls"}));
  CHECK(r.code == 0);
  CHECK(r.out == "0 tensors, 0 B\n");
  auto j = parse_json(memcuda_cli(at(srv, {"ls", "--json"})));
  CHECK(j.at("count").to_number<std::uint64_t>() == 0);
  CHECK(j.at("tensors").as_array().empty());

  auto c = reg.create<std::uint8_t>("c", {3, 1024});
  auto b = reg.create<float>("b/w", {2, 3});
  auto a = reg.create<std::int32_t>("a.x", {4});

  r = memcuda_cli(at(srv, {"ls"}));
  INFO(r);
  REQUIRE(r.code == 0);
  auto ls = lines_of(r.out);
  REQUIRE(ls.size() == 5);
  CHECK(ls[0].rfind("NAME", 0) == 0);
  CHECK(ls[1].rfind("a.x ", 0) == 0);
  CHECK(ls[2].rfind("b/w ", 0) == 0);
  CHECK(ls[3].rfind("c ", 0) == 0);
  CHECK(ls[4] == "3 tensors, 3.0 KiB");
  // aligned columns: every row's backend sits under BACKEND, its bytes
  // end where BYTES ends (right-aligned)
  const auto backend_col = ls[0].find("BACKEND");
  const auto bytes_end = ls[0].find("BYTES") + 5;
  for (int i = 1; i <= 3; ++i) {
    CHECK(ls[i].find("host") == backend_col);
    REQUIRE(ls[i].size() > bytes_end);
    CHECK(ls[i][bytes_end - 1] == 'B');  // "3.0 KiB" and " 16 B" end where BYTES ends
    CHECK(ls[i][bytes_end] == ' ');
  }
  CHECK(contains(ls[1], " 16 B "));
  CHECK(contains(ls[2], " [2,3] "));
  CHECK(contains(ls[3], " 3.0 KiB "));
  CHECK(contains(ls[1], reg.node_id()));

  j = parse_json(memcuda_cli(at(srv, {"--json", "ls"})));
  CHECK(j.at("count").to_number<std::uint64_t>() == 3);
  CHECK(j.at("total_bytes").to_number<std::uint64_t>() == 3 * 1024 + 24 + 16);
  const auto& ts = j.at("tensors").as_array();
  REQUIRE(ts.size() == 3);
  CHECK(ts[0].at("name").as_string() == "a.x");
  CHECK(ts[1].at("name").as_string() == "b/w");
  CHECK(ts[2].at("name").as_string() == "c");
  const auto& t = ts[1].as_object();
  CHECK(t.at("backend").as_string() == "host");
  CHECK(t.at("dtype").as_string() == "f32");
  CHECK(t.at("shape") == json::array{2, 3});
  CHECK(t.at("device").as_int64() == -1);
  CHECK(t.at("bytes").to_number<std::uint64_t>() == 24);
  CHECK(t.at("refcount").as_int64() == 1);
  CHECK(t.at("state").as_string() == "ready");
  CHECK(t.at("generation").to_number<std::uint64_t>() == b.generation());
  CHECK(t.at("node").as_string() == reg.node_id());
  CHECK(t.at("age_ms").as_int64() >= 0);
  CHECK(t.at("age_ms").as_int64() < 60000);

  r = memcuda_cli(at(srv, {"ls", "b*"}));
  CHECK(r.code == 0);
  ls = lines_of(r.out);
  REQUIRE(ls.size() == 3);
  CHECK(ls[1].rfind("b/w ", 0) == 0);
  CHECK(ls[2] == "1 tensor, 24 B matching 'b*'");
  j = parse_json(memcuda_cli(at(srv, {"ls", "--json", "[ac]*"})));
  CHECK(j.at("count").to_number<std::uint64_t>() == 2);
  CHECK(memcuda_cli(at(srv, {"ls", "zz*"})).out == "0 tensors, 0 B matching 'zz*'\n");
}

TEST_CASE("memcuda info: every field, holders with their pids alive or not", "[cli][redis]") {
  test::RedisServer srv;
  TensorRegistry reg(host_opts(srv, true));
  REQUIRE(reg.is_leader());
  auto t = reg.create<float>("w", {2, 3}, persistent());
  // a JSON client holds a reference under the pid of a process that is gone
  const pid_t gone = dead_pid();
  auto c = srv.connect();
  c.command({"LPUSH", "tensor_lifecycle",
             R"({"op":"get","name":"w","pid":)" + std::to_string(gone) + R"(,"reply_to":"cli:r"})"});
  REQUIRE_FALSE(c.blocking(5s, {"BLPOP", "cli:r", "5"}).is_nil());
  const TensorInfo info = reg.info("w");
  REQUIRE(info.refcount == 3);

  auto j = parse_json(memcuda_cli(at(srv, {"info", "w", "--json"})));
  CHECK(j.at("name").as_string() == "w");
  CHECK(j.at("dtype").as_string() == "f32");
  CHECK(j.at("shape") == json::array{2, 3});
  CHECK(j.at("elements").to_number<std::uint64_t>() == 6);
  CHECK(j.at("bytes").to_number<std::uint64_t>() == 24);
  CHECK(j.at("backend").as_string() == "host");
  CHECK(j.at("state").as_string() == "ready");
  CHECK(j.at("refcount").as_int64() == 3);
  CHECK(j.at("generation").to_number<std::uint64_t>() == t.generation());
  CHECK(j.at("epoch").to_number<std::uint64_t>() == info.epoch);
  CHECK(j.at("owner").as_string() == reg.session_id());
  CHECK(j.at("owner_pid").as_int64() == ::getpid());
  CHECK(j.at("owner_alive").as_bool());
  CHECK(j.at("alloc_id").to_number<std::uint64_t>() == info.alloc_id);
  CHECK(j.at("alloc_bytes").to_number<std::uint64_t>() == info.alloc_bytes);
  CHECK(j.at("offset").to_number<std::uint64_t>() == info.offset);
  CHECK(j.at("ctime_ms").as_int64() == info.ctime_ms);
  CHECK(j.at("node").as_string() == info.node);
  CHECK(j.at("this_node").as_bool());
  CHECK_FALSE(j.as_object().contains("shm_name"));  // a memfd: no name in /dev/shm
  CHECK(j.at("fd_source").as_string() == info.fd_source);
  CHECK(j.at("ipc_handle_bytes").to_number<std::uint64_t>() == info.ipc_handle.size());
  std::string hex;
  for (unsigned char ch : info.ipc_handle) {
    char b[3];
    std::snprintf(b, sizeof b, "%02x", ch);
    hex += b;
  }
  CHECK(j.at("ipc_handle").as_string() == hex);
  const auto& hs = j.at("holders").as_array();
  CHECK(hs.size() == 3);
  auto* self = find_holder(hs, reg.session_id());
  REQUIRE(self);
  CHECK(self->at("count").as_int64() == 1);
  CHECK(self->at("pid").as_int64() == ::getpid());
  CHECK(self->at("alive").as_bool());
  auto* dead = find_holder(hs, "pid:" + std::to_string(gone));
  REQUIRE(dead);
  CHECK(dead->at("pid").as_int64() == gone);
  CHECK_FALSE(dead->at("alive").as_bool());
  auto* name = find_holder(hs, "@name");
  REQUIRE(name);
  CHECK(name->at("persistent").as_bool());
  CHECK_FALSE(name->contains("pid"));

  auto r = memcuda_cli(at(srv, {"info", "w"}));
  INFO(r);
  CHECK(r.code == 0);
  CHECK(contains(r.out, "ipc_handle     " + hex + " (" + std::to_string(info.ipc_handle.size()) + " bytes"));
  CHECK(contains(r.out, "generation     " + std::to_string(t.generation()) + "\n"));
  CHECK(contains(r.out, "owner_pid      " + std::to_string(::getpid()) + " (alive)"));
  bool self_line = false, dead_line = false;
  for (const auto& l : lines_of(r.out)) {
    if (contains(l, reg.session_id()) && contains(l, " " + std::to_string(::getpid()) + "  alive")) self_line = true;
    if (contains(l, "pid:" + std::to_string(gone)) && contains(l, "not running")) dead_line = true;
  }
  CHECK(self_line);
  CHECK(dead_line);

  r = memcuda_cli(at(srv, {"info", "nope"}));
  CHECK(r.code == 2);
  CHECK(contains(r.err, "memcuda: info nope: no tensor named 'nope'"));
  CHECK(contains(r.err, "memcuda ls"));
  CHECK(memcuda_cli(at(srv, {"info", "bad name"})).code == 1);
}

TEST_CASE("memcuda create + cat: persistent by default, values decoded per dtype", "[cli][redis]") {
  test::RedisServer srv;
  TensorRegistry reg(host_opts(srv, true));
  REQUIRE(reg.is_leader());

  auto r = memcuda_cli(at(srv, {"create", "v32", "--dtype", "f32", "--shape", "2,3", "--backend", "host"}));
  REQUIRE(r.code == 0);
  CHECK(contains(r.out, "created v32: f32 [2,3], 24 B, host"));
  // the tool has exited: only the name holds the tensor now
  auto info = reg.info("v32");
  CHECK(info.refcount == 1);
  CHECK(info.holders == std::map<std::string, std::int64_t>{{"@name", 1}});
  REQUIRE(memcuda_cli(at(srv, {"create", "i", "--dtype", "int32", "--shape", "[5]", "--backend", "host"})).code == 0);
  REQUIRE(memcuda_cli(at(srv, {"create", "h", "--dtype=f16", "--shape=5", "--backend=host", "--json"})).code == 0);

  {
    auto f = reg.get<float>("v32");
    const std::vector<float> v{1.5f, -2.f, 0.25f, 3.f, 1e10f, -0.125f};
    f.copy_from_host(v);
    auto i = reg.get<std::int32_t>("i");
    const std::vector<std::int32_t> iv{-7, 0, 42, 2147483647, -2147483647 - 1};
    i.copy_from_host(iv);
    auto h = reg.get<memcuda::half>("h");
    // 1, -2, 0.333251953125, +inf, 2^-24 (the smallest subnormal)
    const std::vector<memcuda::half> hv{{0x3C00}, {0xC000}, {0x3555}, {0x7C00}, {0x0001}};
    h.copy_from_host(hv);
  }

  r = memcuda_cli(at(srv, {"cat", "v32", "--head", "4"}));
  INFO(r);
  REQUIRE(r.code == 0);
  auto ls = lines_of(r.out);
  REQUIRE(ls.size() == 3);
  CHECK(ls[0] == "v32: f32 [2,3], 6 elements, 24 B, host, generation " + std::to_string(info.generation));
  CHECK(ls[1] == "1.5 -2 0.25 3");
  CHECK(ls[2] == "(4 of 6 elements shown; --head N shows more)");
  auto j = parse_json(memcuda_cli(at(srv, {"cat", "v32", "--json", "--head", "100"})));
  CHECK(j.at("shown").to_number<std::uint64_t>() == 6);
  CHECK(j.at("elements").to_number<std::uint64_t>() == 6);
  CHECK(j.at("shape") == json::array{2, 3});
  const auto& vals = j.at("values").as_array();
  REQUIRE(vals.size() == 6);
  CHECK(vals[4].as_double() == 1e10);
  CHECK(vals[5].as_double() == -0.125);

  r = memcuda_cli(at(srv, {"cat", "i"}));
  ls = lines_of(r.out);
  REQUIRE(ls.size() == 2);  // all 5 shown: no "more" line
  CHECK(ls[1] == "-7 0 42 2147483647 -2147483648");
  j = parse_json(memcuda_cli(at(srv, {"--json", "cat", "i", "--head", "2"})));
  CHECK(j.at("values") == json::array{-7, 0});

  r = memcuda_cli(at(srv, {"cat", "h", "--head", "4"}));
  ls = lines_of(r.out);
  REQUIRE(ls.size() == 3);
  CHECK(ls[0].rfind("h: f16 [5], 5 elements, 10 B, host", 0) == 0);
  CHECK(ls[1] == "1 -2 0.33325195 inf");
  j = parse_json(memcuda_cli(at(srv, {"cat", "h", "--json"})));
  const auto& hv = j.at("values").as_array();
  REQUIRE(hv.size() == 5);
  CHECK(hv[2].as_double() == 0.333251953125);
  CHECK(hv[3].as_string() == "inf");
  CHECK(hv[4].as_double() == std::ldexp(1.0, -24));
  ls = lines_of(memcuda_cli(at(srv, {"cat", "i", "--head", "0"})).out);
  REQUIRE(ls.size() == 2);
  CHECK(ls[1] == "(0 of 5 elements shown; --head N shows more)");

  // --no-persistent: freed as soon as the tool drops its reference
  r = memcuda_cli(at(srv, {"create", "tmp", "--dtype", "u8", "--shape", "4", "--backend", "host", "--no-persistent"}));
  CHECK(r.code == 0);
  CHECK(contains(r.out, "not persistent"));
  CHECK_THROWS_AS(reg.info("tmp"), NotFound);

  r = memcuda_cli(at(srv, {"create", "v32", "--dtype", "f32", "--shape", "1", "--backend", "host"}));
  CHECK(r.code == 6);
  CHECK(contains(r.err, "memcuda: create v32: "));
  CHECK(contains(r.err, "v32"));
  r = memcuda_cli(at(srv, {"cat", "nope"}));
  CHECK(r.code == 2);
  CHECK(contains(r.err, "no tensor named 'nope'"));
}

TEST_CASE("memcuda create without an allocator of record fails with exit 4", "[cli][redis]") {
  test::RedisServer srv;
  TensorRegistry reader(host_opts(srv, false));  // a process that does not serve
  auto r = memcuda_cli(at(srv, {"create", "w", "--dtype", "f32", "--shape", "2", "--backend", "host"}));
  CHECK(r.code == 4);
  CHECK(contains(r.err, "memcuda: create w: no allocator of record"));
  CHECK(contains(r.err, "memcuda serve"));
  // the tool did not become the allocator of record by accident
  auto c = srv.connect();
  CHECK(c.command({"GET", "memcuda:leader"}).is_nil());
  CHECK(reader.list().empty());
}

TEST_CASE("memcuda rm removes what exists and exits 2 for what is missing", "[cli][redis]") {
  test::RedisServer srv;
  TensorRegistry reg(host_opts(srv, true));
  reg.create<float>("a", {1}, persistent()).release();
  reg.create<float>("b", {1}, persistent()).release();
  reg.create<float>("keep", {1}, persistent()).release();

  auto r = memcuda_cli(at(srv, {"rm", "a", "nope", "b"}));
  CHECK(r.code == 2);
  CHECK(r.out == "removed a\nremoved b\n");
  CHECK(contains(r.err, "memcuda: rm nope: no tensor named 'nope'"));
  auto left = reg.list();
  REQUIRE(left.size() == 1);
  CHECK(left[0].name == "keep");

  auto j = parse_json(memcuda_cli(at(srv, {"rm", "--json", "keep", "gone"})));
  CHECK(j.at("removed") == json::array{"keep"});
  CHECK(j.at("missing") == json::array{"gone"});
  CHECK(reg.list().empty());
  r = memcuda_cli(at(srv, {"rm", "x"}));
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  // a malformed name: nothing is removed
  reg.create<float>("c", {1}, persistent()).release();
  CHECK(memcuda_cli(at(srv, {"rm", "c", "bad name"})).code == 1);
  CHECK(reg.list().size() == 1);
  CHECK(memcuda_cli(at(srv, {"rm"})).code == 1);
}

// Defect: `rm --prefix "$P"` with P unset removed every tensor and exited 0.
TEST_CASE("memcuda rm --prefix with an empty prefix is refused, --all removes everything", "[cli][redis]") {
  test::RedisServer srv;
  TensorRegistry reg(host_opts(srv, true));
  for (const char* n : {"p/a", "p/b", "other"}) reg.create<float>(n, {1}, persistent()).release();

  for (const std::vector<std::string>& args : {std::vector<std::string>{"rm", "--prefix", ""},
                                               std::vector<std::string>{"rm", "--prefix="}}) {
    auto r = memcuda_cli(at(srv, args));
    INFO(r);
    CHECK(r.code == 1);
    CHECK(contains(r.err, "--prefix is empty"));
    CHECK(contains(r.err, "--all"));
    CHECK(reg.list().size() == 3);
  }
  // --all goes alone
  CHECK(memcuda_cli(at(srv, {"rm", "--all", "p/a"})).code == 1);
  CHECK(memcuda_cli(at(srv, {"rm", "--all", "--prefix", "p/"})).code == 1);
  CHECK(reg.list().size() == 3);
  // a prefix that is not empty still works
  auto r = memcuda_cli(at(srv, {"rm", "--prefix", "p/"}));
  CHECK(r.code == 0);
  CHECK(r.out == "removed p/a\nremoved p/b\n");
  REQUIRE(reg.list().size() == 1);
  reg.create<float>("p/c", {1}, persistent()).release();
  r = memcuda_cli(at(srv, {"rm", "--all"}));
  CHECK(r.code == 0);
  CHECK(r.out == "removed other\nremoved p/c\n");
  CHECK(reg.list().empty());

  // the library: an empty prefix is an InvalidArgument, remove_all() says "everything"
  reg.create<float>("q", {1}, persistent()).release();
  CHECK_THROWS_AS(reg.remove_prefix(""), InvalidArgument);
  CHECK(reg.list().size() == 1);
  CHECK(reg.remove_all().removed == std::vector<std::string>{"q"});
  CHECK(reg.list().empty());
}

TEST_CASE("memcuda leader: the lease holder, or exit 3 without one", "[cli][redis]") {
  test::RedisServer srv;
  auto r = memcuda_cli(at(srv, {"leader"}));
  CHECK(r.code == 3);
  CHECK(r.out == "no allocator of record\n");
  CHECK(contains(r.err, "memcuda serve"));
  r = memcuda_cli(at(srv, {"leader", "--json"}));
  CHECK(r.code == 3);
  CHECK(parse_json(r) == json::object{{"present", false}});

  TensorRegistry reg(host_opts(srv, true));
  REQUIRE(reg.is_leader());
  auto c = srv.connect();
  r = memcuda_cli(at(srv, {"leader", "--json"}));
  CHECK(r.code == 0);
  auto j = parse_json(r);
  CHECK(j.at("present").as_bool());
  CHECK(j.at("session").as_string() == reg.session_id());
  CHECK(j.at("epoch").to_number<std::uint64_t>() == leader_epoch(c));
  CHECK(j.at("pid").as_int64() == ::getpid());
  CHECK(j.at("pid_alive").as_bool());
  CHECK(j.at("ttl_ms").as_int64() > 0);
  CHECK(j.at("ttl_ms").as_int64() <= kTtlMs);
  r = memcuda_cli(at(srv, {"leader"}));
  CHECK(r.code == 0);
  CHECK(contains(r.out, "session  " + reg.session_id()));
  CHECK(contains(r.out, "pid      " + std::to_string(::getpid()) + " (alive)"));
  CHECK(contains(r.out, "epoch    " + std::to_string(leader_epoch(c)) + "\n"));
}

TEST_CASE("memcuda stats: per device, leader, queue, and Prometheus text with escaped labels", "[cli][redis]") {
  test::RedisServer srv;
  TensorRegistry reg(host_opts(srv, true));
  REQUIRE(reg.is_leader());
  auto a = reg.create<float>("a", {2, 3});
  auto b = reg.create<std::int32_t>("b", {4});
  auto c = srv.connect();
  const auto epoch = leader_epoch(c);

  auto j = parse_json(memcuda_cli(at(srv, {"stats", "--json"})));
  CHECK(j.at("tensors").to_number<std::uint64_t>() == 2);
  CHECK(j.at("bytes").to_number<std::uint64_t>() == 40);
  const auto& per = j.at("per_device").as_array();
  REQUIRE(per.size() == 1);
  CHECK(per[0].at("backend").as_string() == "host");
  CHECK(per[0].at("tensors").to_number<std::uint64_t>() == 2);
  CHECK(per[0].at("bytes").to_number<std::uint64_t>() == 40);
  CHECK(j.at("leader").at("session").as_string() == reg.session_id());
  CHECK(j.at("leader").at("epoch").to_number<std::uint64_t>() == epoch);
  CHECK(j.at("queue_length").to_number<std::uint64_t>() == 0);
  CHECK(j.at("pools").is_array());
  CHECK(j.at("sessions").is_number());

  auto r = memcuda_cli(at(srv, {"stats"}));
  CHECK(r.code == 0);
  CHECK(r.out.rfind("tensors: 2, 40 B\n", 0) == 0);
  CHECK(contains(r.out, "allocator of record: session " + reg.session_id()));
  CHECK(contains(r.out, "queue length: 0\n"));
  CHECK((contains(r.out, "pools: no pool statistics published\n") || contains(r.out, "pools:\nBACKEND")));

  // A record on a cuda device whose UUID needs escaping in a label value
  // (written directly: this machine may have no GPU).
  TensorInfo odd;
  odd.name = "odd";
  odd.dtype = DType::u8;
  odd.shape = {3};
  odd.bytes = 3;
  odd.backend = BackendKind::cuda;
  odd.device = 1;
  odd.device_uuid = R"(GPU-"q"\s)";
  odd.ipc_handle = std::string(kIpcHandleBytes, '\x01');
  odd.alloc_bytes = 3;
  odd.state = TensorState::ready;
  odd.generation = 999;
  odd.refcount = 1;
  odd.holders = {{"someone", 1}};
  std::vector<redis::Arg> hset{"HSET", "memcuda:tensor:odd"};
  for (auto& [k, v] : protocol::encode_record(odd)) {
    hset.emplace_back(std::move(k));
    hset.emplace_back(std::move(v));
  }
  c.command(std::span<const redis::Arg>(hset));
  c.command({"ZADD", "memcuda:names", "0", "odd"});
  // Statistics read the counters the scripts keep (memcuda:usage), never the
  // records: a record written by hand counts where its counters are written.
  c.command({"HINCRBY", "memcuda:usage", R"(tensors:cuda:1:GPU-"q"\s)", "1"});
  c.command({"HINCRBY", "memcuda:usage", R"(bytes:cuda:1:GPU-"q"\s)", "3"});

  r = memcuda_cli(at(srv, {"stats", "--prometheus"}));
  INFO(r);
  REQUIRE(r.code == 0);
  // every sample belongs to a family announced by # HELP and # TYPE
  std::map<std::string, std::string> types;
  std::map<std::string, double> samples;
  for (const auto& l : lines_of(r.out)) {
    REQUIRE_FALSE(l.empty());
    if (l.rfind("# HELP ", 0) == 0) continue;
    if (l.rfind("# TYPE ", 0) == 0) {
      std::istringstream in(l.substr(7));
      std::string name, type;
      in >> name >> type;
      types[name] = type;
      continue;
    }
    auto sp = l.rfind(' ');
    REQUIRE(sp != std::string::npos);
    std::string series = l.substr(0, sp);
    std::string family = series.substr(0, series.find('{'));
    CHECK(types.count(family) == 1);
    samples[series] = std::stod(l.substr(sp + 1));
  }
  for (const char* f : {"memcuda_tensors", "memcuda_tensor_bytes", "memcuda_pool_in_use_bytes",
                        "memcuda_pool_reserved_bytes", "memcuda_pool_peak_bytes", "memcuda_pool_budget_bytes",
                        "memcuda_pool_slabs", "memcuda_leader_epoch", "memcuda_queue_length", "memcuda_sessions"})
    CHECK(types[f] == "gauge");
  CHECK(samples[R"(memcuda_tensors{backend="host",device="-1",uuid=""})"] == 2);
  CHECK(samples[R"(memcuda_tensor_bytes{backend="host",device="-1",uuid=""})"] == 40);
  CHECK(samples[R"(memcuda_tensors{backend="cuda",device="1",uuid="GPU-\"q\"\\s"})"] == 1);
  CHECK(samples[R"(memcuda_tensor_bytes{backend="cuda",device="1",uuid="GPU-\"q\"\\s"})"] == 3);
  CHECK(samples["memcuda_leader_epoch"] == static_cast<double>(epoch));
  CHECK(samples["memcuda_leader_present"] == 1);
  CHECK(samples["memcuda_queue_length"] == 0);
  CHECK(samples.count("memcuda_sessions") == 1);

  // a command waiting in the queue shows in the queue length
  c.command({"ZREM", "memcuda:names", "odd"});
  c.command({"DEL", "memcuda:tensor:odd"});
  // nobody serves namespace "idle"
  c.command({"LPUSH", "idle:tensor_lifecycle", R"({"op":"get","name":"x"})"});
  j = parse_json(memcuda_cli(at(srv, {"--namespace", "idle", "stats", "--json"})));
  CHECK(j.at("queue_length").to_number<std::uint64_t>() == 1);
  CHECK_FALSE(j.at("leader").at("present").as_bool());
  r = memcuda_cli(at(srv, {"--namespace", "idle", "stats", "--prometheus"}));
  CHECK(contains(r.out, "\nmemcuda_queue_length 1\n"));
  CHECK(contains(r.out, "\nmemcuda_leader_present 0\n"));
  CHECK_FALSE(contains(r.out, "\nmemcuda_leader_epoch "));
}

TEST_CASE("memcuda serve: allocator of record in the foreground, lease released at SIGINT", "[cli][redis]") {
  test::RedisServer srv;
  auto c = srv.connect();
  auto serve = [&] {
    return std::make_unique<test::Child>(std::vector<std::string>{
        cli_path(), "--url", srv.unix_url(), "serve", "--backend", "host", "--lease-ttl", std::to_string(kTtlMs)});
  };
  auto a = serve();
  auto seen = read_until(*a, "allocator of record");
  CHECK(contains(seen, "memcuda serve: session " + std::to_string(a->pid()) + "-"));
  CHECK(contains(seen, "allocator of record (epoch 1)"));

  auto j = parse_json(memcuda_cli(at(srv, {"leader", "--json"})));
  CHECK(j.at("pid").as_int64() == a->pid());

  // the tool creates through it; this process writes, the tool reads back
  REQUIRE(memcuda_cli(at(srv, {"create", "w", "--dtype", "f32", "--shape", "3", "--backend", "host"})).code == 0);
  {
    TensorRegistry reg(host_opts(srv, false));
    auto t = reg.get<float>("w");
    CHECK(t.info().owner_pid == a->pid());
    const std::vector<float> v{1, 2, 3};
    t.copy_from_host(v);
  }
  CHECK(lines_of(memcuda_cli(at(srv, {"cat", "w"})).out).at(1) == "1 2 3");

  // a second one follows; stopping it leaves the lease alone
  auto b = serve();
  seen = read_until(*b, "follower");
  CHECK(contains(seen, "follower (allocator of record: session " + std::to_string(a->pid()) + "-"));
  b->kill(SIGINT);
  CHECK(b->wait() == 0);
  CHECK(std::string(c.command({"GET", "memcuda:leader"}).str()).find(" " + std::to_string(a->pid()) + "-") !=
        std::string::npos);

  a->kill(SIGINT);
  seen = read_until(*a, "stopped");
  CHECK(contains(seen, "received SIGINT: releasing the lease and stopping\n"));
  CHECK(a->wait() == 0);
  CHECK(c.command({"GET", "memcuda:leader"}).is_nil());  // at once, not after the TTL

  // SIGTERM works the same, and a follower takes over and says so
  auto d = serve();
  read_until(*d, "allocator of record");
  auto e = serve();
  read_until(*e, "follower");
  d->kill(SIGTERM);
  CHECK(d->wait() == 0);
  read_until(*e, "allocator of record", 5s);
  j = parse_json(memcuda_cli(at(srv, {"leader", "--json"})));
  CHECK(j.at("pid").as_int64() == e->pid());
  e->kill(SIGINT);
  CHECK(e->wait() == 0);
  CHECK(c.command({"GET", "memcuda:leader"}).is_nil());
}

TEST_CASE("memcuda on the cuda backend: serve, create, cat, info with a 64-byte IPC handle", "[cli][redis][gpu]") {
  MEMCUDA_REQUIRE_GPU();
  test::RedisServer srv;
  test::Child a(
      {cli_path(), "--url", srv.unix_url(), "serve", "--backend", "cuda", "--lease-ttl", "10000"});  // CUDA starts are slow under compute-sanitizer
  read_until(a, "allocator of record");
  auto r =
      memcuda_cli(at(srv, {"create", "g", "--dtype", "bf16", "--shape", "3", "--backend", "cuda", "--device", "0"}));
  REQUIRE(r.code == 0);
  CHECK(contains(r.out, "created g: bf16 [3], 6 B, cuda device 0"));
  {
    RegistryOptions o = host_opts(srv, false);
    o.default_backend = BackendKind::cuda;
    TensorRegistry reg(o);
    auto t = reg.get<memcuda::bfloat16>("g");
    CHECK(t.backend() == BackendKind::cuda);
    const std::vector<memcuda::bfloat16> v{{0x3F80}, {0xC040}, {0x3EC0}};  // 1, -3, 0.375
    t.copy_from_host(v);
  }
  r = memcuda_cli(at(srv, {"cat", "g"}));
  INFO(r);
  REQUIRE(r.code == 0);
  CHECK(lines_of(r.out).at(1) == "1 -3 0.375");
  auto j = parse_json(memcuda_cli(at(srv, {"info", "g", "--json"})));
  CHECK(j.at("backend").as_string() == "cuda");
  CHECK(j.at("device").as_int64() == 0);
  const std::string uuid(j.at("device_uuid").as_string());
  CHECK((uuid.rfind("GPU-", 0) == 0 || uuid.rfind("MIG-", 0) == 0));
  CHECK(j.at("ipc_handle_bytes").as_int64() == 64);
  CHECK(j.at("ipc_handle").as_string().size() == 128);
  CHECK_FALSE(j.as_object().contains("shm_name"));
  CHECK(j.at("owner_pid").as_int64() == a.pid());
  r = memcuda_cli(at(srv, {"stats", "--prometheus"}));
  CHECK(contains(r.out, "\nmemcuda_tensors{backend=\"cuda\",device=\"0\",uuid=\"" + uuid + "\"} 1\n"));
  a.kill(SIGINT);
  CHECK(a.wait() == 0);
}

TEST_CASE("memcuda: wrong password exits 5, no Redis exits 4, with what to do", "[cli][redis]") {
  test::RedisServerOptions so;
  so.requirepass = "s3cret";
  const std::string wrong = "hunter2x";
  test::RedisServer srv(so);
  const std::string port = std::to_string(srv.port());

  auto r = memcuda_cli({"--url", "redis://:" + wrong + "@127.0.0.1:" + port, "ls"});
  CHECK(r.code == 5);
  CHECK(contains(r.err, "memcuda: ls: Redis at redis://127.0.0.1:" + port + " rejected the credentials"));
  // the hint names the environment, not a password in --url (ps shows command lines)
  CHECK(contains(r.err, "MEMCUDA_REDIS_PASSWORD"));
  CHECK_FALSE(contains(r.err, ":PASSWORD@"));
  CHECK_FALSE(contains(r.err, "--url redis://"));
  CHECK_FALSE(contains(r.err, wrong));  // the password is never echoed
  r = memcuda_cli({"--url", "redis://127.0.0.1:" + port, "stats"});
  CHECK(r.code == 5);
  CHECK(contains(r.err, "requires a password"));
  r = memcuda_cli({"--url", "redis://:" + wrong + "@127.0.0.1:" + port, "--json", "leader"});
  CHECK(r.code == 5);
  CHECK(parse_json(r).at("error").at("exit_code").as_int64() == 5);
  CHECK(parse_json(r).at("error").at("code").as_string() == "redis_auth");
  CHECK(memcuda_cli({"--url", "redis://:s3cret@127.0.0.1:" + port, "ls"}).code == 0);
  // the password from the environment, for a URL (given or from MEMCUDA_REDIS_URL) that has none
  CHECK(memcuda_cli({"--url", "redis://127.0.0.1:" + port, "ls"}, {{redis::kPasswordEnv, "s3cret"}}).code == 0);
  CHECK(memcuda_cli({"ls"}, {{redis::kUrlEnv, "redis://127.0.0.1:" + port}, {redis::kPasswordEnv, "s3cret"}})
            .code == 0);
  r = memcuda_cli({"--url", "redis://127.0.0.1:" + port, "ls"}, {{redis::kPasswordEnv, wrong}});
  CHECK(r.code == 5);
  CHECK_FALSE(contains(r.err, wrong));
  // a password in the URL wins over the variable
  CHECK(memcuda_cli({"--url", "redis://:s3cret@127.0.0.1:" + port, "ls"}, {{redis::kPasswordEnv, wrong}}).code == 0);

  const std::string nobody = std::to_string(test::free_tcp_port());
  r = memcuda_cli({"--url", "redis://127.0.0.1:" + nobody, "ls"});
  CHECK(r.code == 4);
  CHECK(contains(r.err, "memcuda: ls: no Redis at redis://127.0.0.1:" + nobody));
  CHECK(contains(r.err, "start redis-server"));
  CHECK(contains(r.err, "(the address came from --url)"));
  r = memcuda_cli({"info", "w", "--json"}, {{redis::kUrlEnv, "redis://127.0.0.1:" + nobody}});
  CHECK(r.code == 4);
  CHECK(contains(r.err, "(the address came from MEMCUDA_REDIS_URL)"));
  CHECK(parse_json(r).at("error").at("code").as_string() == "redis_connection");
  CHECK(
      memcuda_cli({"create", "w", "--dtype", "f32", "--shape", "1"}, {{redis::kUrlEnv, "redis://127.0.0.1:" + nobody}})
          .code == 4);
  // MEMCUDA_REDIS_URL is the default address; --url wins over it
  CHECK(memcuda_cli({"ls"}, {{redis::kUrlEnv, "redis://:s3cret@127.0.0.1:" + port}}).code == 0);
  CHECK(memcuda_cli({"ls", "--url", "redis://:s3cret@127.0.0.1:" + port},
                    {{redis::kUrlEnv, "redis://127.0.0.1:" + nobody}})
            .code == 0);
  CHECK(memcuda_cli({"ls", "--url", "redis://:s3cret@127.0.0.1:" + port}, {{redis::kUrlEnv, "not a url"}}).code == 0);
  r = memcuda_cli({"ls"}, {{redis::kUrlEnv, "http://x"}});
  CHECK(r.code == 1);
  CHECK(contains(r.err, "MEMCUDA_REDIS_URL"));
}

TEST_CASE("memcuda --namespace isolates registries on one Redis", "[cli][redis]") {
  test::RedisServer srv;
  TensorRegistry reg(host_opts(srv, true, "teamA"));
  REQUIRE(reg.is_leader());
  auto t = reg.create<float>("w", {2});

  auto r = memcuda_cli(at(srv, {"--namespace", "teamA", "ls"}));
  CHECK(r.code == 0);
  CHECK(contains(r.out, "1 tensor, 8 B"));
  CHECK(memcuda_cli(at(srv, {"ls"})).out == "0 tensors, 0 B\n");
  CHECK(memcuda_cli(at(srv, {"ls", "--namespace=teamB"})).out == "0 tensors, 0 B\n");
  CHECK(memcuda_cli(at(srv, {"info", "w", "--namespace", "teamB"})).code == 2);
  CHECK(memcuda_cli(at(srv, {"info", "w", "--namespace", "teamA"})).code == 0);
  CHECK(memcuda_cli(at(srv, {"leader", "--namespace", "teamA"})).code == 0);
  CHECK(memcuda_cli(at(srv, {"leader"})).code == 3);
  r = memcuda_cli(at(srv, {"--namespace", "teamB", "create", "w", "--dtype", "f32", "--shape", "2"}));
  CHECK(r.code == 4);
  CHECK(contains(r.err, "(namespace 'teamB')"));
  REQUIRE(memcuda_cli(
              at(srv, {"--namespace", "teamA", "create", "v", "--dtype", "f32", "--shape", "2", "--backend", "host"}))
              .code == 0);
  CHECK(reg.list().size() == 2);
  CHECK(memcuda_cli(at(srv, {"--namespace", "teamA", "rm", "v"})).code == 0);
  CHECK(memcuda_cli(at(srv, {"--namespace", "bad ns!", "ls"})).code == 1);
}

TEST_CASE("memcuda usage errors exit 1 and say what to do", "[cli]") {
  // Nothing listens here: a command that reached for Redis would exit 4.
  const std::string url = "redis://127.0.0.1:" + std::to_string(test::free_tcp_port());
  auto usage = [&](std::vector<std::string> args, const std::string& says) {
    args.insert(args.begin(), {"--url", url});
    auto r = memcuda_cli(args);
    INFO(r);
    CHECK(r.code == 1);
    CHECK(contains(r.err, says));
    CHECK(r.out.empty());
  };
  usage({}, "no command given");
  usage({"frobnicate"}, "unknown command 'frobnicate'");
  usage({"ls", "--bogus"}, "unknown option '--bogus' for 'ls' (see memcuda ls --help)");
  usage({"ls", "a*", "b*"}, "quote the pattern");
  usage({"info"}, "memcuda: info: missing the tensor NAME");
  usage({"info", "a", "b"}, "'b' is extra");
  usage({"cat", "w", "--head", "-1"}, "option '--head': -1 is out of range");
  usage({"cat", "w", "--head", "ten"}, "option '--head': 'ten' is not an integer");
  usage({"cat", "w", "--head"}, "option '--head' needs a value");
  usage({"create", "w", "--dtype", "f33", "--shape", "2"}, "'f33' is not a dtype");
  usage({"create", "w", "--dtype", "f32", "--shape", "2,x"}, "'2,x' is not a list of dimensions");
  usage({"create", "w", "--dtype", "f32", "--shape", "2,-3"}, "dimension -3 is negative");
  usage({"create", "w", "--dtype", "f32"}, "memcuda: create w: needs --shape");
  usage({"create", "w", "--shape", "2"}, "memcuda: create w: needs --dtype");
  usage({"create", "a b", "--dtype", "f32", "--shape", "2"}, "byte 0x20 at offset 1 is not allowed");
  usage({"create", "w", "--dtype", "f32", "--shape", "2", "--backend", "tpu"}, "'tpu' is not a backend");
  usage({"create", "w", "--dtype", "f32", "--shape", "2", "--persistent", "--no-persistent"}, "exclude each other");
  usage({"serve", "--lease-ttl", "5"}, "option '--lease-ttl': 5 is out of range");
  usage({"leader", "now"}, "memcuda: leader now: takes no arguments ('now' is extra)");
  usage({"ls", "--json=yes"}, "option '--json' takes no value");
  usage({"ls", "--namespace", "a", "--namespace", "b"}, "option '--namespace' given twice");
  usage({"help", "frobnicate"}, "no command 'frobnicate'");
  auto r = memcuda_cli({"--url", "http://x", "ls"});
  CHECK(r.code == 1);
  CHECK(contains(r.err, "invalid Redis URL 'http://x'"));
  // with --json the error is a JSON document too
  const std::pair<std::vector<std::string>, std::string> json_usage[] = {
      {{"--json", "frobnicate"}, "memcuda: unknown command 'frobnicate'"},
      {{"stats", "--prometheus", "--json"}, "memcuda: stats: --prometheus and --json exclude each other"}};
  for (const auto& [args, says] : json_usage) {
    r = memcuda_cli(args);
    CHECK(r.code == 1);
    auto e = parse_json(r).at("error");
    CHECK(e.at("code").as_string() == "usage");
    CHECK(e.at("exit_code").as_int64() == 1);
    CHECK(contains(r.err, says));
  }

  r = memcuda_cli({"--help"});
  CHECK(r.code == 0);
  for (const char* cmd : {"ls", "info", "rm", "leader", "stats", "serve", "create", "cat"})
    CHECK(contains(r.out, std::string("\n  ") + cmd + " "));
  CHECK(contains(r.out, "exit codes:"));
  CHECK(contains(r.out, "  5  Redis rejected the credentials"));
  r = memcuda_cli({"cat", "--help"});
  CHECK(r.code == 0);
  CHECK(r.out.rfind("usage: memcuda cat NAME [--head N]\n", 0) == 0);
  CHECK(memcuda_cli({"help", "create"}).out.rfind("usage: memcuda create NAME --dtype DT", 0) == 0);
  r = memcuda_cli({"--version"});
  CHECK(r.out == std::string("memcuda ") + kVersionString + "\n");
}

TEST_CASE("memcuda gc drops the references of a dead JSON client and reports it", "[cli][redis]") {
  test::RedisServer srv;
  TensorRegistry reg(host_opts(srv, true));
  auto t = reg.create<float>("g", {4});
  auto c = srv.connect();
  {
    test::Child sleeper({"/bin/sh", "-c", "exec sleep 60"});
    c.command({"LPUSH", "tensor_lifecycle",
               R"({"op":"get","name":"g","pid":)" + std::to_string(sleeper.pid()) + R"(,"reply_to":"r"})"});
    REQUIRE_FALSE(c.blocking(std::chrono::seconds(5), {"BLPOP", "r", "5"}).is_nil());
    REQUIRE(reg.info("g").refcount == 2);
  }  // killed and reaped
  auto j = parse_json(memcuda_cli(at(srv, {"gc", "--json"})));
  // the leader's own periodic collection may have been first
  if (j.at("references_dropped").to_number<std::uint64_t>() == 1) CHECK(j.at("dead_holders").to_number<std::uint64_t>() == 1);
  CHECK(reg.info("g").refcount == 1);
  auto r = memcuda_cli(at(srv, {"gc"}));
  CHECK(r.code == 0);
  CHECK(contains(r.out, "dead holders 0, references dropped 0"));
}

// What a takeover did is visible from the tool. The allocator of
// record (a `memcuda serve`) owns a persistent host tensor that no other
// process holds, and is killed with SIGKILL; the standby `memcuda serve`
// adopts the shm object in place. `info` shows the record's alloc_kind
// before and after, `stats` the pool's adopted and copied bytes (text, JSON
// and Prometheus), and nothing was copied.
TEST_CASE("memcuda info shows alloc_kind, stats shows adopted and copied bytes after a takeover", "[cli][redis]") {
  test::RedisServer srv;
  auto serve = [&] {
    return std::make_unique<test::Child>(std::vector<std::string>{
        cli_path(), "--url", srv.unix_url(), "serve", "--backend", "host", "--lease-ttl", std::to_string(kTtlMs)});
  };
  auto a = serve();
  read_until(*a, "allocator of record");
  REQUIRE(memcuda_cli(at(srv, {"create", "w", "--dtype", "f32", "--shape", "1024", "--backend", "host"})).code == 0);

  auto j = parse_json(memcuda_cli(at(srv, {"info", "w", "--json"})));
  CHECK(j.at("alloc_kind").as_string() == "host_memfd");
  CHECK(j.at("owner_pid").as_int64() == a->pid());
  CHECK_FALSE(j.as_object().contains("shm_name"));  // nothing named in /dev/shm
  const std::string handle(j.at("ipc_handle").as_string());
  // the memfd's identity (st_dev, st_ino), from the record's fd source
  auto file_of = [](const std::string& source) {
    std::vector<std::string> p;  // "v1;<id>;<pid>;<fd>;<dev>;<ino>;<address>"
    std::size_t at = 0;
    for (int i = 0; i < 6; ++i) {
      const auto semi = source.find(';', at);
      if (semi == std::string::npos) return std::string();
      p.push_back(source.substr(at, semi - at));
      at = semi + 1;
    }
    return p[4] + ":" + p[5];
  };
  const std::string file = file_of(std::string(j.at("fd_source").as_string()));
  REQUIRE_FALSE(file.empty());
  auto text = memcuda_cli(at(srv, {"info", "w"})).out;
  CHECK(contains(text, "alloc_kind"));
  CHECK(contains(text, "host_memfd"));

  // before any takeover both counters are there and zero (the leader
  // publishes its pool statistics at each lease renewal)
  for (auto until = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < until;) {
    j = parse_json(memcuda_cli(at(srv, {"stats", "--json"})));
    if (!j.at("pools").as_array().empty()) break;
    std::this_thread::sleep_for(100ms);
  }
  {
    INFO(json::serialize(j));
    REQUIRE(j.at("pools").as_array().size() == 1);
    CHECK(j.at("pools").at(0).at("adopted_bytes").to_number<std::uint64_t>() == 0);
    CHECK(j.at("pools").at(0).at("copied_bytes").to_number<std::uint64_t>() == 0);
  }

  auto b = serve();
  read_until(*b, "follower");
  {
    auto c = srv.connect();  // the standby holds w's fd before a dies: w's memory lives on in it
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (!test::standby_synced(c, b->pid(), {"w"}) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(20ms);
    REQUIRE(test::standby_synced(c, b->pid(), {"w"}));
  }
  a->kill(SIGKILL);
  a->wait();
  read_until(*b, "allocator of record", 10s);

  // the new leader's statistics, once its takeover round has adopted w
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  std::uint64_t adopted = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    j = parse_json(memcuda_cli(at(srv, {"stats", "--json"})));
    const auto& pools = j.at("pools").as_array();
    if (!pools.empty() && (adopted = pools.at(0).at("adopted_bytes").to_number<std::uint64_t>()) >= 4096) break;
    std::this_thread::sleep_for(100ms);
  }
  INFO(json::serialize(j));
  CHECK(adopted == 4096);
  CHECK(j.at("pools").at(0).at("copied_bytes").to_number<std::uint64_t>() == 0);

  text = memcuda_cli(at(srv, {"stats"})).out;
  const auto lines = lines_of(text);
  bool header = false, row = false;
  for (const auto& l : lines) {
    if (contains(l, "BACKEND") && contains(l, "ADOPTED") && contains(l, "COPIED")) header = true;
    if (l.rfind("host", 0) == 0 && contains(l, "4.0 KiB") && l.size() > 2 && l.substr(l.size() - 3) == "0 B")
      row = true;
  }
  INFO(text);
  CHECK(header);
  CHECK(row);  // ADOPTED 4.0 KiB, COPIED (the last column) 0 B

  text = memcuda_cli(at(srv, {"stats", "--prometheus"})).out;
  CHECK(contains(text, "# TYPE memcuda_pool_adopted_bytes_total counter\n"));
  CHECK(contains(text, "# TYPE memcuda_pool_copied_bytes_total counter\n"));
  CHECK(contains(text, R"(memcuda_pool_adopted_bytes_total{backend="host",device="-1",uuid=""} 4096)" "\n"));
  CHECK(contains(text, R"(memcuda_pool_copied_bytes_total{backend="host",device="-1",uuid=""} 0)" "\n"));

  // the record now names the standby, and the same memfd (same key, same
  // file, served by the standby now): adopted, not copied
  j = parse_json(memcuda_cli(at(srv, {"info", "w", "--json"})));
  CHECK(j.at("alloc_kind").as_string() == "host_memfd");
  CHECK(j.at("owner_pid").as_int64() == b->pid());
  CHECK(std::string(j.at("ipc_handle").as_string()) == handle);
  CHECK(file_of(std::string(j.at("fd_source").as_string())) == file);
  CHECK(contains(std::string(j.at("fd_source").as_string()), "/fd-" + std::to_string(b->pid()) + "-"));

  b->kill(SIGINT);
  CHECK(b->wait() == 0);
}

TEST_CASE("memcuda quarantine: lists a malformed record moved aside, clears it, stats count it", "[cli][redis]") {
  test::RedisServer srv;
  TensorRegistry reg(host_opts(srv, true));
  REQUIRE(reg.is_leader());
  auto c = srv.connect();
  auto r = memcuda_cli(at(srv, {"quarantine"}));
  CHECK(r.code == 0);
  CHECK(contains(r.out, "no quarantined records"));
  c.command({"SET", "memcuda:tensor:X", "junk"});
  c.command({"ZADD", "memcuda:names", "0", "X"});
  CHECK(memcuda_cli(at(srv, {"gc"})).code == 0);  // GC from any process quarantines
  r = memcuda_cli(at(srv, {"quarantine"}));
  INFO(r);
  CHECK(r.code == 0);
  CHECK(contains(r.out, "tensor:X\ta string where a tensor record (a hash) belongs"));
  auto j = parse_json(memcuda_cli(at(srv, {"stats", "--json"})));
  CHECK(j.at("quarantined").as_int64() == 1);
  CHECK(memcuda_cli(at(srv, {"ls"})).code == 0);
  CHECK(memcuda_cli(at(srv, {"quarantine", "clear"})).code == 1);  // usage
  r = memcuda_cli(at(srv, {"quarantine", "clear", "tensor:X"}));
  CHECK(r.code == 0);
  CHECK(contains(r.out, "cleared tensor:X"));
  CHECK(c.command({"EXISTS", "memcuda:quarantine:tensor:X"}).integer() == 0);
  CHECK(memcuda_cli(at(srv, {"quarantine", "clear", "tensor:X"})).code == 2);  // not quarantined
}
