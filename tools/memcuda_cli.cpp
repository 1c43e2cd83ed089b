// memcuda: the command-line tool of mem-cuda (docs/cli.md).
//
// Every command but `serve` opens its TensorRegistry with control_thread =
// false: a command-line tool must never become the allocator of record by
// accident, since the memory it allocated would die with it a moment later.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "cli/args.hpp"
#include "cli/exit_codes.hpp"
#include "cli/format.hpp"
#include "cli/prometheus.hpp"
#include "memcuda/memcuda.hpp"

namespace memcuda::cli {
namespace {

namespace json = boost::json;

// ---- commands, their options and their help -------------------------------

struct CommandDoc {
  std::string_view name;
  std::string_view brief;  // the synopsis in the command list
  std::string_view synopsis;
  std::string_view summary;
  std::string_view details;
};

constexpr CommandDoc kDocs[] = {
    {"ls", "ls [PATTERN]", "memcuda ls [PATTERN]", "list tensors, sorted by name (PATTERN: a glob, default *)",
     "Columns: NAME BACKEND DTYPE SHAPE DEVICE BYTES REFS STATE AGE NODE, then a totals line.\n"
     "Quote the pattern so the shell does not expand it: memcuda ls 'layer.*'.\n"},
    {"info", "info NAME", "memcuda info NAME", "every field of one tensor, and its holders",
     "Holders that name a process (a session \"<pid>-<hex>\" or \"pid:<pid>\") are shown with\n"
     "their pid and whether that pid is alive on this machine.\n"},
    {"rm", "rm NAME... | --prefix P | --all", "memcuda rm NAME... | memcuda rm --prefix P | memcuda rm --all",
     "remove tensors by name or prefix, 1000 names per script (memory goes with the last holder)",
     "Exit code 2 when any name was not found; the others are still removed.\n"
     "  --prefix P   every tensor whose name starts with P (not empty: an unset shell\n"
     "               variable must not mean every tensor; that is --all)\n"
     "  --all        every tensor of the registry (namespace)\n"},
    {"get-many", "get-many NAME... | --prefix P | --glob G",
     "memcuda get-many NAME... | memcuda get-many --prefix P | memcuda get-many --glob G",
     "open many tensors in one round trip and report each (references dropped at exit)",
     "Takes a reference to every name at once, as a consumer opening a model does, maps each,\n"
     "prints one line per tensor (name, dtype, shape, size, backend, generation) and one per\n"
     "name that could not be opened, with its error code. Exit code 2 when a name was not\n"
     "found, 6 when one failed otherwise.\n"
     "  --prefix P   every tensor whose name starts with P\n"
     "  --glob G     every tensor whose name matches G (* ? [..] [!..]; quote it)\n"},
    {"create-many", "create-many NAME[=DT:DIMS]... [--dtype DT --shape DIMS]",
     "memcuda create-many NAME[=DT:DIMS]... [--dtype DT] [--shape DIMS] [--device N] [--backend host|cuda] "
     "[--no-persistent] [--timeout MS]",
     "create many tensors in one request, all or nothing",
     "One create_many command to the allocator of record: when one name is taken, none is\n"
     "created. Each operand is NAME (dtype and shape from --dtype and --shape) or\n"
     "NAME=DTYPE:DIMS (its own, e.g. w=f32:2,3; step=i64: for a scalar). Persistent unless\n"
     "--no-persistent, as for create; the other options are create's.\n"},
    {"gc", "gc", "memcuda gc", "collect garbage now: drop references of dead processes, report what was reclaimed",
     "Dead holders are expired registry sessions and JSON client pids that no longer exist on\n"
     "this machine. The allocator of record also does this every gc_interval on its own.\n"},
    {"quarantine", "quarantine [clear ID...|--all]", "memcuda quarantine [clear ID... | clear --all]",
     "list malformed records the allocator of record moved aside, or delete them",
     "A key of the wrong Redis type under a tensor's name, or a record whose fields do not\n"
     "parse, is moved aside by the allocator of record's garbage collection (its data kept,\n"
     "unchanged) so that it breaks nothing else. Without operands: the quarantined records,\n"
     "their ids and why. `clear ID...` deletes them for good; exit code 2 when an id was not\n"
     "quarantined.\n"
     "  --all   with clear: every quarantined record\n"},
    {"leader", "leader", "memcuda leader", "who holds the allocator-of-record lease",
     "Exit code 3 when nobody does (start one with `memcuda serve`).\n"},
    {"stats", "stats [--prometheus]", "memcuda stats [--prometheus]",
     "tensors and bytes per device, pools (with bytes adopted or copied by takeovers), sessions, queue",
     "  --prometheus   the same in the Prometheus text exposition format\n"},
    {"serve", "serve [--backend B] [--lease-ttl MS]", "memcuda serve [--backend host|cuda] [--lease-ttl MS]",
     "host the allocator of record in the foreground until SIGINT/SIGTERM",
     "Prints each change between allocator of record and follower. Tensors this process\n"
     "allocates live as long as it runs. With --json: one JSON object per line (event).\n"
     "  --backend host|cuda   default backend of this registry (default: cuda if a GPU is usable)\n"
     "  --lease-ttl MS        allocator-of-record lease time to live (default 1500)\n"},
    {"create", "create NAME --dtype DT --shape DIMS",
     "memcuda create NAME --dtype DT --shape DIMS [--device N] [--backend host|cuda] [--no-persistent] [--timeout MS]",
     "create a tensor through the allocator of record",
     "The tensor is persistent (it stays after this command exits, until `memcuda rm`) unless\n"
     "--no-persistent is given, in which case it is freed again as soon as the command exits.\n"
     "Needs a running allocator of record (`memcuda serve`); exit code 4 otherwise.\n"
     "  --dtype DT       bool u8 i8 i16 i32 i64 u16 u32 u64 f16 bf16 f32 f64 (or float32, int64...)\n"
     "  --shape DIMS     comma-separated dimensions: 2,3 (\"\" or [] for a scalar)\n"
     "  --device N       CUDA device ordinal (cuda backend)\n"
     "  --backend B      host or cuda (default: cuda if a GPU is usable, else host)\n"
     "  --persistent     the default, spelled out\n"
     "  --no-persistent  free the tensor when this command exits\n"
     "  --timeout MS     how long to wait for the allocator of record (default 5000)\n"},
    {"cat", "cat NAME [--head N]", "memcuda cat NAME [--head N]", "print the first N elements of a tensor (default 10)",
     "Elements are decoded per dtype; f16 and bf16 are shown as float.\n"
     "  --head N   how many elements, in row-major order (default 10)\n"},
    {"help", "help [COMMAND]", "memcuda help [COMMAND]", "this text, or the help of one command", ""},
};

const std::map<std::string, std::vector<OptionSpec>, std::less<>>& command_options() {
  // create-many takes create's options (and applies them to every entry)
  const std::vector<OptionSpec> create_options = {{"--dtype", true},    {"--shape", true},         {"--device", true},
                                                  {"--backend", true},  {"--persistent", false},   {"--no-persistent", false},
                                                  {"--timeout", true}};
  static const std::map<std::string, std::vector<OptionSpec>, std::less<>> m = {
      {"ls", {}},
      {"info", {}},
      {"rm", {{"--prefix", true}, {"--all", false}}},
      {"get-many", {{"--prefix", true}, {"--glob", true}}},
      {"create-many", create_options},
      {"gc", {}},
      {"quarantine", {{"--all", false}}},
      {"leader", {}},
      {"stats", {{"--prometheus", false}}},
      {"serve", {{"--backend", true}, {"--lease-ttl", true}}},
      {"create", create_options},
      {"cat", {{"--head", true}}},
      {"help", {}},
  };
  return m;
}

const CommandDoc* doc_of(std::string_view name) {
  for (const auto& d : kDocs)
    if (d.name == name) return &d;
  return nullptr;
}

constexpr std::string_view kExitCodes =
    "exit codes:\n"
    "  0  ok\n"
    "  1  usage error (unknown command or option, malformed name, dtype, shape or value)\n"
    "  2  not found (no tensor of that name)\n"
    "  3  no leader (`memcuda leader`: nobody holds the allocator-of-record lease)\n"
    "  4  no allocator of record answered, or Redis unreachable or timed out\n"
    "  5  Redis rejected the credentials\n"
    "  6  any other error\n";

constexpr std::string_view kGlobalHelp =
    "global options (every command):\n"
    "  --url URL        Redis: redis://[[user]:password@]host[:port][/db] or unix:///path.sock\n"
    "                   (default: $MEMCUDA_REDIS_URL, else redis://127.0.0.1:6379); the password\n"
    "                   is better in $MEMCUDA_REDIS_PASSWORD (and an ACL user in $MEMCUDA_REDIS_USER):\n"
    "                   a URL on the command line is visible to every user in ps\n"
    "  --namespace NS   registry namespace (every key prefixed \"NS:\"); default: none\n"
    "  --json           machine-readable output: one JSON document on stdout\n"
    "  --help, -h       help\n"
    "  --version        the mem-cuda version\n";

std::string global_help() {
  std::string s =
      "memcuda - inspect and manage the mem-cuda tensor registry\n\n"
      "usage: memcuda [--url URL] [--namespace NS] [--json] COMMAND [ARGS]\n\ncommands:\n";
  std::size_t w = 0;
  for (const auto& d : kDocs) w = std::max(w, d.brief.size());
  for (const auto& d : kDocs)
    s += "  " + std::string(d.brief) + std::string(w - d.brief.size() + 2, ' ') + std::string(d.summary) + "\n";
  s += "\n" + std::string(kGlobalHelp) + "\n" + std::string(kExitCodes) +
       "\n`memcuda COMMAND --help` describes one command; docs/cli.md has examples.\n";
  return s;
}

std::string command_help(const CommandDoc& d) {
  return "usage: " + std::string(d.synopsis) + "\n\n" + std::string(d.summary) + "\n\n" + std::string(d.details) +
         (d.details.empty() ? "" : "\n") + std::string(kGlobalHelp) + "\n" + std::string(kExitCodes);
}

// ---- context --------------------------------------------------------------

struct Context {
  ParsedArgs args;
  bool json = false;
  redis::Options redis;
  std::string url_origin;  // "--url", "MEMCUDA_REDIS_URL" or "the default"
  std::string name_space;

  // The registry as seen by this command; see the file comment for why
  // only `serve` hosts the control thread.
  RegistryOptions registry_options(bool control_thread) const {
    RegistryOptions o = RegistryOptions::from_env();  // the MEMCUDA_* variables, then the flags
    o.redis = redis;
    o.name_space = name_space;
    o.control_thread = control_thread;
    return o;
  }

  // The registry for messages: URL without the password, and the namespace.
  std::string where() const {
    return redis.describe() + (name_space.empty() ? "" : " (namespace '" + name_space + "')");
  }
};

void print_json(const json::value& v) { std::cout << json::serialize(v) << "\n"; }

std::int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

json::array shape_json(const Shape& s) {
  json::array a;
  for (auto d : s) a.emplace_back(d);
  return a;
}

// A device column: the ordinal, "-" for host memory.
std::string device_text(BackendKind b, int device) { return b == BackendKind::host ? "-" : std::to_string(device); }

std::string alive_text(pid_t pid) { return pid_alive(pid) ? "alive" : "not running"; }

std::string one_operand(const Context& c, std::string_view what) {
  const auto& ops = c.args.operands;
  if (ops.empty()) throw UsageError("missing the tensor " + std::string(what));
  if (ops.size() > 1)
    throw UsageError("takes one " + std::string(what) + ", got " + std::to_string(ops.size()) + " ('" + ops[1] +
                     "' is extra)");
  validate_name(ops[0]);
  return ops[0];
}

void no_operands(const Context& c) {
  if (!c.args.operands.empty()) throw UsageError("takes no arguments ('" + c.args.operands[0] + "' is extra)");
}

std::optional<BackendKind> backend_option(const Context& c) {
  auto b = c.args.get("--backend");
  if (!b) return std::nullopt;
  auto k = backend_from_string(*b);
  if (!k) throw UsageError("option '--backend': '" + *b + "' is not a backend (use host or cuda)");
  return k;
}

// Two-column "key  value" lines, keys padded to the widest.
std::string key_values(const std::vector<std::pair<std::string, std::string>>& kv) {
  std::size_t w = 0;
  for (const auto& [k, v] : kv) w = std::max(w, k.size());
  std::string out;
  for (const auto& [k, v] : kv) out += k + std::string(w - k.size() + 2, ' ') + v + "\n";
  return out;
}

// ---- ls -------------------------------------------------------------------

json::object tensor_summary_json(const TensorInfo& t, std::int64_t now) {
  json::object o;
  o["name"] = t.name;
  o["backend"] = to_string(t.backend);
  o["dtype"] = to_string(t.dtype);
  o["shape"] = shape_json(t.shape);
  o["device"] = t.device;
  o["device_uuid"] = t.device_uuid;
  o["bytes"] = t.bytes;
  o["refcount"] = t.refcount;
  o["state"] = to_string(t.state);
  o["ctime_ms"] = t.ctime_ms;
  o["age_ms"] = std::max<std::int64_t>(0, now - t.ctime_ms);
  o["node"] = t.node;
  o["generation"] = t.generation;
  return o;
}

int cmd_ls(Context& c) {
  if (c.args.operands.size() > 1)
    throw UsageError("takes at most one PATTERN, got " + std::to_string(c.args.operands.size()) +
                     " (quote the pattern so the shell does not expand it: memcuda ls 'w*')");
  const std::string pattern = c.args.operands.empty() ? "*" : c.args.operands[0];
  TensorRegistry reg(c.registry_options(false));
  // A page of records at a time, printed as it comes: memory stays that of
  // two pages whatever the registry holds. The next page is read while this
  // one is formatted (its cursor is known once this one is in), so Redis and
  // the client's parsing are not idle while the client prints.
  const auto now = now_ms();
  std::uint64_t total = 0, count = 0;
  std::string after;
  std::future<ListPage> ahead;
  auto next_page = [&] {
    ListPage page = ahead.valid() ? ahead.get() : reg.list_page(pattern, after, 1000);
    after = std::move(page.next);
    if (!after.empty())
      ahead = std::async(std::launch::async, [&reg, &pattern, a = after] { return reg.list_page(pattern, a, 1000); });
    for (const auto& t : page.tensors) total += t.bytes;
    count += page.tensors.size();
    return std::move(page.tensors);
  };
  if (c.json) {
    std::cout << "{\"pattern\":" << json::serialize(json::value(pattern)) << ",\"tensors\":[";
    bool first = true;
    do {
      for (const auto& t : next_page()) {
        std::cout << (first ? "" : ",") << json::serialize(tensor_summary_json(t, now));
        first = false;
      }
    } while (!after.empty());
    std::cout << "],\"count\":" << count << ",\"total_bytes\":" << total << "}\n";
    return kOk;
  }
  {
    Table tab({{"NAME"},
               {"BACKEND"},
               {"DTYPE"},
               {"SHAPE"},
               {"DEVICE", true},
               {"BYTES", true},
               {"REFS", true},
               {"STATE"},
               {"AGE", true},
               {"NODE"}});
    do {
      auto page = next_page();
      for (const auto& t : page)
        tab.add({t.name, std::string(to_string(t.backend)), std::string(to_string(t.dtype)),
                 shape_to_string(t.shape), device_text(t.backend, t.device), human_bytes(t.bytes),
                 std::to_string(t.refcount), std::string(to_string(t.state)), human_age(now - t.ctime_ms), t.node});
      if (!tab.empty()) std::cout << tab.flush();
    } while (!after.empty());
  }
  std::cout << count << (count == 1 ? " tensor, " : " tensors, ") << human_bytes(total)
            << (pattern == "*" ? "" : " matching '" + pattern + "'") << "\n";
  return kOk;
}

// ---- info -----------------------------------------------------------------

// The holder id of a persistent tensor's own reference (docs/design.md).
constexpr std::string_view kNameHolder = memcuda::detail::HolderId::kName;

struct HolderView {
  std::string id;
  std::int64_t count;
  std::optional<pid_t> pid;
  bool alive = false;
};

std::vector<HolderView> holders_of(const TensorInfo& t) {
  std::vector<HolderView> hs;
  for (const auto& [id, n] : t.holders) {
    HolderView h{id, n, holder_pid(id)};
    if (h.pid) h.alive = pid_alive(*h.pid);
    hs.push_back(std::move(h));
  }
  return hs;
}

// The record's alloc_kind; a record written before the field existed
// reads as its backend's legacy kind (docs/protocol.md).
std::string alloc_kind_text(const TensorInfo& t) {
  if (!t.alloc_kind.empty()) return t.alloc_kind;
  return t.backend == BackendKind::cuda ? "cuda_ipc" : "host_shm";
}

int cmd_info(Context& c) {
  const std::string name = one_operand(c, "NAME");
  TensorRegistry reg(c.registry_options(false));
  const TensorInfo t = reg.info(name);
  const auto now = now_ms();
  const auto holders = holders_of(t);
  const bool same_node = t.node == reg.node_id();
  const auto owner_pid = static_cast<pid_t>(t.owner_pid);

  if (c.json) {
    json::object o = tensor_summary_json(t, now);
    o["elements"] = t.elements();
    o["strides"] = shape_json(t.strides());
    o["this_node"] = same_node;
    o["ipc_handle"] = hex(t.ipc_handle);
    o["ipc_handle_bytes"] = t.ipc_handle.size();
    if (t.backend == BackendKind::host) o["shm_name"] = t.ipc_handle;
    o["offset"] = t.offset;
    o["alloc_bytes"] = t.alloc_bytes;
    o["alloc_id"] = t.alloc_id;
    o["alloc_kind"] = alloc_kind_text(t);
    o["epoch"] = t.epoch;
    o["owner"] = t.owner;
    o["owner_pid"] = t.owner_pid;
    o["owner_alive"] = pid_alive(owner_pid);
    o["create_id"] = t.create_id;
    o["event_handle"] = hex(t.event_handle);
    o["event_version"] = t.event_version;
    json::array hs;
    for (const auto& h : holders) {
      json::object ho{{"id", h.id}, {"count", h.count}};
      if (h.pid) {
        ho["pid"] = *h.pid;
        ho["alive"] = h.alive;
      }
      if (h.id == kNameHolder) ho["persistent"] = true;
      hs.push_back(std::move(ho));
    }
    o["holders"] = std::move(hs);
    print_json(o);
    return kOk;
  }

  auto opt = [](const std::string& s) { return s.empty() ? std::string("-") : s; };
  std::string handle = t.ipc_handle.empty() ? "-" : hex(t.ipc_handle);
  handle += " (" + std::to_string(t.ipc_handle.size()) + " bytes";
  if (t.backend == BackendKind::host && !t.ipc_handle.empty()) handle += ", shm object " + t.ipc_handle;
  handle += ")";
  std::cout << key_values({
      {"name", t.name},
      {"dtype", std::string(to_string(t.dtype))},
      {"shape", shape_to_string(t.shape) + " (" + std::to_string(t.elements()) + " elements, strides " +
                    shape_to_string(t.strides()) + ")"},
      {"bytes", std::to_string(t.bytes) + " (" + human_bytes(t.bytes) + ")"},
      {"backend", std::string(to_string(t.backend))},
      {"device", std::to_string(t.device)},
      {"device_uuid", opt(t.device_uuid)},
      {"state", std::string(to_string(t.state))},
      {"refcount", std::to_string(t.refcount)},
      {"generation", std::to_string(t.generation)},
      {"epoch", std::to_string(t.epoch)},
      {"owner", opt(t.owner)},
      {"owner_pid", std::to_string(t.owner_pid) + (t.owner_pid > 0 ? " (" + alive_text(owner_pid) + ")" : "")},
      {"node", opt(t.node) + (same_node ? " (this node)" : " (another node: pids below are checked here)")},
      {"ctime", std::to_string(t.ctime_ms) + " (" + human_age(now - t.ctime_ms) + " ago)"},
      {"ipc_handle", handle},
      {"offset", std::to_string(t.offset)},
      {"alloc_bytes", std::to_string(t.alloc_bytes)},
      {"alloc_id", std::to_string(t.alloc_id)},
      {"alloc_kind", alloc_kind_text(t) + (t.alloc_kind.empty() ? " (not in the record: written before the field)" : "")},
      {"create_id", opt(t.create_id)},
      {"event_handle", t.event_handle.empty() ? "-" : hex(t.event_handle)},
      {"event_version", std::to_string(t.event_version)},
      {"holders", std::to_string(holders.size())},
  });
  if (!holders.empty()) {
    Table tab({{"  HOLDER"}, {"COUNT", true}, {"PID", true}, {"PROCESS"}});
    for (const auto& h : holders) {
      std::string what = h.pid                 ? (h.alive ? "alive" : "not running")
                         : h.id == kNameHolder ? "the name itself (persistent)"
                                               : "-";
      tab.add({"  " + h.id, std::to_string(h.count), h.pid ? std::to_string(*h.pid) : "-", what});
    }
    std::cout << tab.render();
  }
  return kOk;
}

// ---- rm -------------------------------------------------------------------

// ---- gc -------------------------------------------------------------------

int cmd_gc(Context& c) {
  if (!c.args.operands.empty()) throw UsageError("gc takes no operands");
  TensorRegistry reg(c.registry_options(false));
  auto r = reg.collect_garbage();
  if (c.json) {
    print_json(json::object{{"dead_holders", r.dead_holders},
                            {"references_dropped", r.references_dropped},
                            {"tensors_freed", r.tensors_freed},
                            {"sessions_pruned", r.sessions_pruned},
                            {"records_quarantined", r.records_quarantined}});
  } else {
    std::cout << "dead holders " << r.dead_holders << ", references dropped " << r.references_dropped
              << ", tensors freed " << r.tensors_freed << ", stale sessions pruned " << r.sessions_pruned
              << ", malformed records quarantined " << r.records_quarantined << "\n";
  }
  return kOk;
}

// ---- leader ---------------------------------------------------------------

json::object leader_json(const LeaderInfo& l) {
  json::object o{{"present", l.present}};
  if (!l.present) return o;
  o["session"] = l.session;
  o["epoch"] = l.epoch;
  o["ttl_ms"] = l.ttl_ms;
  if (auto pid = holder_pid(l.session)) {
    o["pid"] = *pid;
    o["pid_alive"] = pid_alive(*pid);
  }
  return o;
}

std::string leader_line(const LeaderInfo& l) {
  if (!l.present) return "none (no allocator of record)";
  std::string s = "session " + l.session;
  if (auto pid = holder_pid(l.session)) s += ", pid " + std::to_string(*pid) + " (" + alive_text(*pid) + ")";
  return s + ", epoch " + std::to_string(l.epoch) + ", lease " + std::to_string(l.ttl_ms) + " ms left";
}

int cmd_leader(Context& c) {
  no_operands(c);
  TensorRegistry reg(c.registry_options(false));
  const LeaderInfo l = reg.leader();
  if (c.json) print_json(leader_json(l));
  if (!l.present) {
    if (!c.json) std::cout << "no allocator of record\n";
    std::cerr << "memcuda: leader: nobody holds the allocator-of-record lease in " << c.where()
              << ": start one with `memcuda serve`\n";
    return kNoLeader;
  }
  if (c.json) return kOk;
  std::vector<std::pair<std::string, std::string>> kv{{"session", l.session}};
  if (auto pid = holder_pid(l.session)) kv.emplace_back("pid", std::to_string(*pid) + " (" + alive_text(*pid) + ")");
  kv.emplace_back("epoch", std::to_string(l.epoch));
  kv.emplace_back("lease", std::to_string(l.ttl_ms) + " ms left");
  std::cout << "allocator of record:\n";
  for (auto& [k, v] : kv) k = "  " + k;
  std::cout << key_values(kv);
  return kOk;
}

// ---- stats ----------------------------------------------------------------

std::string prometheus_text(const RegistryStats& s) {
  namespace pm = prometheus;
  pm::Writer w;
  auto dev_labels = [](BackendKind b, int device, const std::string& uuid) {
    return pm::Labels{{"backend", std::string(to_string(b))}, {"device", std::to_string(device)}, {"uuid", uuid}};
  };
  std::vector<pm::Sample> tensors, bytes;
  for (const auto& d : s.per_device) {
    tensors.push_back({dev_labels(d.backend, d.device, d.device_uuid), d.tensors});
    bytes.push_back({dev_labels(d.backend, d.device, d.device_uuid), d.bytes});
  }
  w.family("memcuda_tensors", "gauge", "Named tensors in the registry, per backend and device.", tensors);
  w.family("memcuda_tensor_bytes", "gauge", "Logical bytes of the named tensors, per backend and device.", bytes);
  struct PoolMetric {
    std::string_view name, help;
    std::uint64_t PoolStats::*field;
  };
  const PoolMetric pool_metrics[] = {
      {"memcuda_pool_in_use_bytes", "Bytes handed out by the allocator of record's pool.", &PoolStats::in_use},
      {"memcuda_pool_reserved_bytes", "Bytes the pool holds from the driver or the OS.", &PoolStats::reserved},
      {"memcuda_pool_peak_bytes", "Peak of the pool's bytes in use.", &PoolStats::peak_in_use},
      {"memcuda_pool_budget_bytes", "The pool's byte budget (0: none).", &PoolStats::budget},
      {"memcuda_pool_slabs", "Slabs the pool holds.", &PoolStats::slabs},
  };
  // Counters since the allocator of record started: what takeovers cost.
  const PoolMetric pool_counters[] = {
      {"memcuda_pool_adopted_bytes_total", "Bytes of dead allocators' tensors adopted in place (no copy).",
       &PoolStats::adopted_bytes},
      {"memcuda_pool_copied_bytes_total", "Bytes of dead allocators' tensors copied into new memory (migration).",
       &PoolStats::copied_bytes},
  };
  auto emit_pool = [&](const PoolMetric& m, std::string_view type) {
    std::vector<pm::Sample> v;
    for (const auto& p : s.pools) v.push_back({dev_labels(p.backend, p.device, p.device_uuid), p.*m.field});
    w.family(m.name, type, m.help, v);
  };
  for (const auto& m : pool_metrics) emit_pool(m, "gauge");
  for (const auto& m : pool_counters) emit_pool(m, "counter");
  w.gauge("memcuda_leader_present", "1 when a process holds the allocator-of-record lease.", s.leader.present ? 1 : 0);
  w.family("memcuda_leader_epoch", "gauge", "Epoch of the allocator-of-record lease (counts takeovers).",
           s.leader.present ? std::vector<pm::Sample>{{{}, s.leader.epoch}} : std::vector<pm::Sample>{});
  w.gauge("memcuda_queue_length", "Lifecycle commands waiting for the allocator of record.", s.queue_length);
  w.gauge("memcuda_quarantined_records", "Malformed records moved aside (memcuda quarantine).", s.quarantined);
  w.gauge("memcuda_sessions", "Live registry sessions.", s.sessions);
  return w.text();
}

int cmd_stats(Context& c) {
  no_operands(c);
  if (c.args.has("--prometheus") && c.json) throw UsageError("--prometheus and --json exclude each other");
  TensorRegistry reg(c.registry_options(false));
  const RegistryStats s = reg.stats();
  if (c.args.has("--prometheus")) {
    std::cout << prometheus_text(s);
    return kOk;
  }
  if (c.json) {
    json::array per, pools;
    for (const auto& d : s.per_device)
      per.push_back(json::object{{"backend", to_string(d.backend)},
                                 {"device", d.device},
                                 {"device_uuid", d.device_uuid},
                                 {"tensors", d.tensors},
                                 {"bytes", d.bytes}});
    for (const auto& p : s.pools)
      pools.push_back(json::object{{"backend", to_string(p.backend)},
                                   {"device", p.device},
                                   {"device_uuid", p.device_uuid},
                                   {"in_use", p.in_use},
                                   {"reserved", p.reserved},
                                   {"peak_in_use", p.peak_in_use},
                                   {"budget", p.budget},
                                   {"slabs", p.slabs},
                                   {"allocations", p.allocations},
                                   {"frees", p.frees},
                                   {"largest_free", p.largest_free},
                                   {"adopted_bytes", p.adopted_bytes},
                                   {"copied_bytes", p.copied_bytes}});
    print_json(json::object{{"tensors", s.tensors},
                            {"bytes", s.bytes},
                            {"per_device", per},
                            {"leader", leader_json(s.leader)},
                            {"pools", pools},
                            {"sessions", s.sessions},
                            {"queue_length", s.queue_length},
                            {"quarantined", s.quarantined}});
    return kOk;
  }
  std::cout << "tensors: " << s.tensors << ", " << human_bytes(s.bytes) << "\n";
  if (!s.per_device.empty()) {
    Table t({{"BACKEND"}, {"DEVICE", true}, {"UUID"}, {"TENSORS", true}, {"BYTES", true}});
    for (const auto& d : s.per_device)
      t.add({std::string(to_string(d.backend)), device_text(d.backend, d.device),
             d.device_uuid.empty() ? "-" : d.device_uuid, std::to_string(d.tensors), human_bytes(d.bytes)});
    std::cout << t.render();
  }
  std::cout << "allocator of record: " << leader_line(s.leader) << "\n";
  if (s.pools.empty()) {
    std::cout << "pools: no pool statistics published\n";
  } else {
    std::cout << "pools:\n";
    Table t({{"BACKEND"},
             {"DEVICE", true},
             {"IN USE", true},
             {"RESERVED", true},
             {"PEAK", true},
             {"BUDGET", true},
             {"SLABS", true},
             {"ADOPTED", true},
             {"COPIED", true}});
    for (const auto& p : s.pools)
      t.add({std::string(to_string(p.backend)), device_text(p.backend, p.device), human_bytes(p.in_use),
             human_bytes(p.reserved), human_bytes(p.peak_in_use), p.budget ? human_bytes(p.budget) : "none",
             std::to_string(p.slabs), human_bytes(p.adopted_bytes), human_bytes(p.copied_bytes)});
    std::cout << t.render();
  }
  std::cout << "sessions: " << s.sessions << "\n";
  std::cout << "queue length: " << s.queue_length << "\n";
  if (s.quarantined) std::cout << "malformed records: " << s.quarantined << " quarantined (`memcuda quarantine`)\n";
  return kOk;
}

// ---- serve ----------------------------------------------------------------

void emit_line(const std::string& s) {
  std::cout << s << std::endl;  // flushed: someone may be waiting for this line
}

int cmd_serve(Context& c) {
  no_operands(c);
  RegistryOptions o = c.registry_options(true);
  o.default_backend = backend_option(c);
  if (auto ttl = c.args.get("--lease-ttl"))
    o.lease_ttl = std::chrono::milliseconds(parse_int_option("--lease-ttl", *ttl, 30, 24LL * 3600 * 1000));

  // Blocked before the registry starts its thread, which inherits the mask:
  // the signals then reach only sigtimedwait below, never a thread that
  // would die of them with the lease still held.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGHUP);
  if (int e = pthread_sigmask(SIG_BLOCK, &stop, nullptr); e != 0)
    throw std::system_error(e, std::generic_category(), "pthread_sigmask");
  // A closed stdout (`memcuda serve | head -1`) must not kill the allocator
  // of record: writes fail quietly instead, and it goes on serving.
  ::signal(SIGPIPE, SIG_IGN);

  std::optional<TensorRegistry> reg;
  reg.emplace(o);
  const std::string session = reg->session_id();
  if (c.json)
    print_json(json::object{{"event", "started"},
                            {"session", session},
                            {"pid", ::getpid()},
                            {"url", c.redis.describe()},
                            {"namespace", c.name_space},
                            {"lease_ttl_ms", o.lease_ttl.count()}});
  else
    emit_line("memcuda serve: session " + session + " (pid " + std::to_string(::getpid()) + ") on " + c.where() +
              ", lease ttl " + std::to_string(o.lease_ttl.count()) + " ms");
  std::cout.flush();

  auto announce = [&](bool leader) {
    LeaderInfo l;
    try {
      l = reg->leader();
    } catch (const RedisError&) {
      // Redis is away, or refuses our credentials for now (a password
      // rotation): the control thread keeps trying, and this process keeps
      // what it owns.
      l = {};
    }
    if (c.json) {
      json::object ev{{"event", leader ? "leader" : "follower"}};
      if (l.present) {
        ev["epoch"] = l.epoch;
        ev["leader_session"] = l.session;
      }
      print_json(ev);
      std::cout.flush();
      return;
    }
    if (leader)
      emit_line("allocator of record" + (l.present ? " (epoch " + std::to_string(l.epoch) + ")" : std::string()));
    else
      emit_line("follower (allocator of record: " + leader_line(l) + ")");
  };

  bool leader = reg->is_leader();
  announce(leader);
  int sig = 0;
  for (;;) {
    timespec poll{0, 100'000'000};
    sig = sigtimedwait(&stop, nullptr, &poll);
    if (sig > 0) break;
    if (errno != EAGAIN && errno != EINTR) throw std::system_error(errno, std::generic_category(), "sigtimedwait");
    if (bool now = reg->is_leader(); now != leader) {
      leader = now;
      announce(leader);
    }
  }
  const std::string signame = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP";
  if (!c.json) emit_line("received " + signame + ": releasing the lease and stopping");
  reg.reset();  // stops the control thread; the lease goes at once
  if (c.json) {
    print_json(json::object{{"event", "stopped"}, {"signal", signame}});
    std::cout.flush();
  } else {
    emit_line("stopped");
  }
  return kOk;
}

// ---- create ---------------------------------------------------------------

std::string dtype_names() {
  std::string s;
  for (DType d : kAllDTypes) s += (s.empty() ? "" : " ") + std::string(to_string(d));
  return s;
}

// ---- what create and create-many share ------------------------------------

// --dtype, when given.
std::optional<DType> dtype_option(const Context& c) {
  auto dt = c.args.get("--dtype");
  if (!dt) return std::nullopt;
  auto dtype = dtype_from_string(*dt);
  if (!dtype) throw UsageError("option '--dtype': '" + *dt + "' is not a dtype (use one of: " + dtype_names() + ")");
  return dtype;
}

// --persistent / --no-persistent (persistent by default), --backend, --device.
CreateOptions create_options(const Context& c) {
  if (c.args.has("--persistent") && c.args.has("--no-persistent"))
    throw UsageError("--persistent and --no-persistent exclude each other");
  CreateOptions co;
  co.persistent = !c.args.has("--no-persistent");
  co.backend = backend_option(c);
  if (auto d = c.args.get("--device")) co.device = static_cast<int>(parse_int_option("--device", *d, 0, 1023));
  return co;
}

// A client registry whose requests wait --timeout for the allocator of record.
RegistryOptions create_registry_options(const Context& c) {
  RegistryOptions o = c.registry_options(false);
  if (auto t = c.args.get("--timeout"))
    o.request_timeout = std::chrono::milliseconds(parse_int_option("--timeout", *t, 1, 3600 * 1000));
  return o;
}

int cmd_create(Context& c) {
  const std::string name = one_operand(c, "NAME");
  const auto dtype = dtype_option(c);
  if (!dtype) throw UsageError("needs --dtype (one of: " + dtype_names() + ")");
  auto sh = c.args.get("--shape");
  if (!sh) throw UsageError("needs --shape, e.g. --shape 2,3 (\"\" for a scalar)");
  auto shape = parse_shape(*sh);
  if (!shape)
    throw UsageError("option '--shape': '" + *sh + "' is not a list of dimensions (write them as 2,3 or [2,3])");
  (void)byte_size(*dtype, *shape);  // rank, dimension and size limits, before talking to anyone
  const CreateOptions co = create_options(c);

  TensorRegistry reg(create_registry_options(c));
  // Fail at once rather than after the request timeout when nobody serves.
  if (!reg.leader().present)
    throw NotLeader("no allocator of record in " + c.where() + ": nobody holds the lease, so nobody would allocate '" +
                    name + "'");
  auto t = reg.create_any(name, *dtype, *shape, co);
  const TensorInfo info = t.info();
  t.release();  // this command's reference; a persistent tensor keeps its name's

  if (c.json) {
    json::object o2 = tensor_summary_json(info, now_ms());
    o2["persistent"] = co.persistent;
    o2["refcount"] = info.refcount - 1;
    print_json(o2);
    return kOk;
  }
  std::cout << "created " << name << ": " << to_string(info.dtype) << " " << shape_to_string(info.shape) << ", "
            << human_bytes(info.bytes) << ", " << to_string(info.backend)
            << (info.backend == BackendKind::cuda ? " device " + std::to_string(info.device) : std::string())
            << ", generation " << info.generation << "\n";
  if (co.persistent)
    std::cout << "persistent: it stays after this command exits; `memcuda rm " << name << "` removes it\n";
  else
    std::cout << "not persistent: freed again now that this command dropped its reference\n";
  return kOk;
}

// ---- cat ------------------------------------------------------------------

int cmd_cat(Context& c) {
  const std::string name = one_operand(c, "NAME");
  std::uint64_t head = 10;
  if (auto h = c.args.get("--head"))
    head = static_cast<std::uint64_t>(parse_int_option("--head", *h, 0, std::int64_t{1} << 40));
  TensorRegistry reg(c.registry_options(false));
  auto t = reg.get<void>(name);
  const std::uint64_t total = t.size();
  const std::uint64_t n = std::min(head, total);
  const std::size_t item = itemsize(t.dtype());
  std::vector<std::byte> buf(static_cast<std::size_t>(n) * item);
  t.copy_to_host(buf);

  if (c.json) {
    json::array vals;
    for (std::uint64_t i = 0; i < n; ++i) vals.push_back(element_json(t.dtype(), buf.data() + i * item));
    print_json(json::object{{"name", t.name()},
                            {"dtype", to_string(t.dtype())},
                            {"shape", shape_json(t.shape())},
                            {"elements", total},
                            {"bytes", t.bytes()},
                            {"backend", to_string(t.backend())},
                            {"generation", t.generation()},
                            {"shown", n},
                            {"values", vals}});
    return kOk;
  }
  std::cout << t.name() << ": " << to_string(t.dtype()) << " " << shape_to_string(t.shape()) << ", " << total
            << (total == 1 ? " element, " : " elements, ") << human_bytes(t.bytes()) << ", " << to_string(t.backend())
            << ", generation " << t.generation() << "\n";
  std::string line;
  for (std::uint64_t i = 0; i < n; ++i) line += (i ? " " : "") + element_text(t.dtype(), buf.data() + i * item);
  if (n > 0) std::cout << line << "\n";
  if (n < total) std::cout << "(" << n << " of " << total << " elements shown; --head N shows more)\n";
  if (total == 0) std::cout << "(no elements)\n";
  return kOk;
}

#include "cli/batch_commands.hpp"
#include "cli/quarantine_command.hpp"

// ---- main -----------------------------------------------------------------

int dispatch(Context& c) {
  const std::string& cmd = c.args.command;
  if (cmd == "ls") return cmd_ls(c);
  if (cmd == "info") return cmd_info(c);
  if (cmd == "rm") return cmd_rm(c);
  if (cmd == "gc") return cmd_gc(c);
  if (cmd == "quarantine") return cmd_quarantine(c);
  if (cmd == "leader") return cmd_leader(c);
  if (cmd == "stats") return cmd_stats(c);
  if (cmd == "serve") return cmd_serve(c);
  if (cmd == "create") return cmd_create(c);
  if (cmd == "cat") return cmd_cat(c);
  if (cmd == "get-many") return cmd_get_many(c);
  if (cmd == "create-many") return cmd_create_many(c);
  throw UsageError("unknown command '" + cmd + "' (see memcuda --help for the commands)");
}

// What was asked, for error messages: "cat w", "rm a b".
std::string asked(const ParsedArgs& a) {
  std::string s = a.command;
  for (const auto& o : a.operands) s += " " + o;
  return s;
}

int run(const std::vector<std::string>& argv) {
  Context c;
  // Known before parsing, so that even a usage error is reported as JSON.
  c.json = std::find(argv.begin(), argv.end(), "--json") != argv.end();
  try {
    c.args = parse_args(argv, command_options());
    c.json = c.args.has("--json");
    if (c.args.has("--version")) {
      std::cout << "memcuda " << kVersionString << "\n";
      return kOk;
    }
    if (c.args.command == "help" || (c.args.command.empty() && c.args.has("--help"))) {
      const std::string topic = c.args.command == "help" && !c.args.operands.empty() ? c.args.operands[0] : "";
      if (topic.empty() || topic == "help") {
        std::cout << global_help();
      } else if (const CommandDoc* d = doc_of(topic)) {
        std::cout << command_help(*d);
      } else {
        throw UsageError("no command '" + topic + "' (see memcuda --help for the commands)");
      }
      return kOk;
    }
    if (c.args.has("--help")) {
      std::cout << command_help(*doc_of(c.args.command));
      return kOk;
    }
    if (c.args.command.empty()) {
      std::cerr << "memcuda: no command given\n\n" << global_help();
      return kUsage;
    }
    // The address: --url, else MEMCUDA_REDIS_URL, else the default. With
    // --url the variable is dropped, so a malformed one cannot get in the
    // way (RegistryOptions::from_env reads it).
    if (auto url = c.args.get("--url")) {
      ::unsetenv(redis::kUrlEnv);
      c.redis = redis::with_password_from_env(redis::parse_url(*url));
      c.url_origin = "--url";
    } else {
      const char* env = std::getenv(redis::kUrlEnv);
      c.url_origin = env && *env ? std::string(redis::kUrlEnv) : "the default";
      c.redis = redis::options_from_env();
    }
    c.name_space = c.args.get("--namespace").value_or("");
    return dispatch(c);
  } catch (...) {
    Failure f = classify_current_exception();
    std::string what = asked(c.args);
    std::string msg = "memcuda: " + (what.empty() ? std::string() : what + ": ") + f.message;
    if (!f.hint.empty()) msg += "; " + f.hint;
    if (f.exit == kUnreachable && (f.code == "redis_connection" || f.code == "timeout"))
      msg += " (the address came from " + (c.url_origin.empty() ? "the default" : c.url_origin) + ")";
    std::cerr << msg << "\n";
    if (f.exit == kUsage) {
      const CommandDoc* d = doc_of(c.args.command);
      std::cerr << (d ? "usage: " + std::string(d->synopsis) + "\n" : std::string()) << "(memcuda "
                << (d ? c.args.command + " " : std::string()) << "--help for more)\n";
    }
    if (c.json) {
      json::object e{{"code", f.code}, {"message", f.message}, {"exit_code", static_cast<int>(f.exit)}};
      if (!f.hint.empty()) e["hint"] = f.hint;
      print_json(json::object{{"error", e}});
    }
    return f.exit;
  }
}

}  // namespace
}  // namespace memcuda::cli

int main(int argc, char** argv) {
  int rc = memcuda::cli::run(std::vector<std::string>(argv + 1, argv + argc));
  std::cout.flush();
  return rc;
}
