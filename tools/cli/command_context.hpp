// What every command of the `memcuda` tool gets (Context: the parsed line,
// the Redis address, the namespace) and the small helpers they share: operand
// and --backend checks, and the pieces of their text and JSON output.
// Included by memcuda_cli.cpp inside its namespace, after help.hpp.
#pragma once

// ---- context --------------------------------------------------------------

struct Context {
  ParsedArgs args;
  bool json = false;
  redis::Options redis;
  std::string url_origin;  // "--url", "MEMCUDA_REDIS_URL" or "the default"
  std::string name_space;
  // --runtime-dir, --allowed-uids, --allowed-gids: override the MEMCUDA_*
  // variables of the same options (docs/operations.md).
  std::optional<std::string> runtime_dir, allowed_uids, allowed_gids;

  // The registry as seen by this command; see memcuda_cli.cpp for why
  // only `serve` hosts the control thread.
  RegistryOptions registry_options(bool control_thread) const {
    RegistryOptions o = RegistryOptions::from_env();  // the MEMCUDA_* variables, then the flags
    o.redis = redis;
    o.name_space = name_space;
    o.control_thread = control_thread;
    if (runtime_dir) o.runtime_dir = *runtime_dir;
    if (allowed_uids) o.allowed_uids = memcuda::detail::parse_id_list(*allowed_uids, "option '--allowed-uids'");
    if (allowed_gids) o.allowed_gids = memcuda::detail::parse_id_list(*allowed_gids, "option '--allowed-gids'");
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
