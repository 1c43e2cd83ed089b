// The commands of the `memcuda` tool that look at tensors and change nothing:
// ls (the registry, a page at a time), info (one record, every field, and its
// holders) and cat (the first elements; it holds a reference while it reads).
// Included by memcuda_cli.cpp inside its namespace, after command_context.hpp.
#pragma once

// ---- ls -------------------------------------------------------------------

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

// The record's alloc_kind; a record without the field reads as its
// backend's first kind (docs/protocol.md).
std::string alloc_kind_text(const TensorInfo& t) {
  if (!t.alloc_kind.empty()) return t.alloc_kind;
  return t.backend == BackendKind::cuda ? "cuda_ipc" : "host_memfd";
}

// `info --json`: the record, every field, and each holder's process.
json::object info_json(const TensorInfo& t, const std::vector<HolderView>& holders, std::int64_t now,
                       bool same_node) {
  const auto owner_pid = static_cast<pid_t>(t.owner_pid);
  json::object o = tensor_summary_json(t, now);
  o["elements"] = t.elements();
  o["strides"] = shape_json(t.strides());
  o["this_node"] = same_node;
  o["ipc_handle"] = hex(t.ipc_handle);
  o["ipc_handle_bytes"] = t.ipc_handle.size();
  if (!t.fd_source.empty()) o["fd_source"] = t.fd_source;
  o["offset"] = t.offset;
  o["alloc_bytes"] = t.alloc_bytes;
  o["alloc_id"] = t.alloc_id;
  o["alloc_kind"] = alloc_kind_text(t);
  o["borrowed"] = t.borrowed;  // the owner's own buffer (share): it dies with the owner
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
  if (!t.replica_of.empty()) {
    o["replica_of"] = t.replica_of;
    o["source_generation"] = t.source_generation;
    if (t.copied_version) o["copied_version"] = *t.copied_version;
    o["replica_path"] = t.replica_path;
    o["idle_ms"] = t.idle_ms;
  }
  return o;
}

// The replicas of a source (replicas.hpp): a range read of the reserved
// names, each checked to be a copy of this very tensor.
std::vector<TensorInfo> replicas_of(TensorRegistry& reg, const TensorInfo& t) {
  std::vector<TensorInfo> out;
  if (!t.replica_of.empty()) return out;
  for (auto& r : reg.list_page(".memcuda-rep/*/" + t.name, "", 1024).tensors)
    if (r.replica_of == t.name) out.push_back(std::move(r));
  return out;
}

bool replica_current(const TensorInfo& r, const TensorInfo& src) {
  return r.source_generation == src.generation && r.copied_version == src.event_version;
}

json::array replicas_json(const std::vector<TensorInfo>& reps, const TensorInfo& src) {
  json::array a;
  for (const auto& r : reps)
    a.push_back(json::object{{"name", r.name},
                             {"device_uuid", r.device_uuid},
                             {"node", r.node},
                             {"generation", r.generation},
                             {"bytes", r.bytes},
                             {"current", replica_current(r, src)},
                             {"readers", std::max<std::int64_t>(r.refcount - 1, 0)}});
  return a;
}

void print_replicas(const std::vector<TensorInfo>& reps, const TensorInfo& src) {
  if (reps.empty()) return;
  std::cout << "replicas: " << reps.size() << "\n";
  // A device's replica, or (a fleet) another node's, pulled by its gets.
  Table tab({{"  WHERE"}, {"GENERATION", true}, {"BYTES", true}, {"CURRENT"}, {"READERS", true}});
  for (const auto& r : reps)
    tab.add({"  " + (r.replica_path == "node" ? "node " + r.node : r.device_uuid), std::to_string(r.generation),
             human_bytes(r.bytes),
             replica_current(r, src) ? "yes"
             : r.replica_path == "node" ? "no (stale: that node's next get pulls again)"
                                        : "no (stale: replicate again)",
             std::to_string(std::max<std::int64_t>(r.refcount - 1, 0))});
  std::cout << tab.render();
}

// `info`: the record as key: value lines, then its holders.
void print_info(const TensorInfo& t, const std::vector<HolderView>& holders, std::int64_t now, bool same_node) {
  const auto owner_pid = static_cast<pid_t>(t.owner_pid);
  auto opt = [](const std::string& s) { return s.empty() ? std::string("-") : s; };
  std::string handle = t.ipc_handle.empty() ? "-" : hex(t.ipc_handle);
  handle += " (" + std::to_string(t.ipc_handle.size()) + " bytes";
  if (alloc_kind_text(t) == "host_memfd") handle += ", memfd " + t.ipc_handle;
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
      {"owner", opt(t.owner) + (t.borrowed ? " (borrowed: the owner's own buffer, gone when the owner exits)" : "")},
      {"owner_pid", std::to_string(t.owner_pid) + (t.owner_pid > 0 ? " (" + alive_text(owner_pid) + ")" : "")},
      {"node", opt(t.node) + (same_node ? " (this node)" : " (another node: pids below are checked here)")},
      {"ctime", std::to_string(t.ctime_ms) + " (" + human_age(now - t.ctime_ms) + " ago)"},
      {"ipc_handle", handle},
      {"offset", std::to_string(t.offset)},
      {"alloc_bytes", std::to_string(t.alloc_bytes)},
      {"alloc_id", std::to_string(t.alloc_id)},
      {"alloc_kind", alloc_kind_text(t) + (t.alloc_kind.empty() ? " (not in the record: written before the field)" : "")},
      {"fd_source", opt(t.fd_source)},
      {"create_id", opt(t.create_id)},
      {"event_handle", t.event_handle.empty() ? "-" : hex(t.event_handle)},
      {"event_version", std::to_string(t.event_version)},
      {"holders", std::to_string(holders.size())},
  });
  if (!t.replica_of.empty())
    std::cout << key_values({
        {"replica_of", t.replica_of + " (generation " + std::to_string(t.source_generation) + ")"},
        {"copied_version", t.copied_version ? std::to_string(*t.copied_version) : "- (not copied yet)"},
        {"replica_path", opt(t.replica_path)},
        {"idle_ms", t.idle_ms ? std::to_string(t.idle_ms) : "0 (kept while the source lives)"},
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
}

int cmd_info(Context& c) {
  const std::string name = one_operand(c, "NAME");
  TensorRegistry reg(c.registry_options(false));
  const TensorInfo t = reg.info(name);
  const auto now = now_ms();
  const auto holders = holders_of(t);
  const bool same_node = ::memcuda::detail::same_node(t.node, reg.node_id());
  const auto reps = replicas_of(reg, t);
  if (c.json) {
    auto o = info_json(t, holders, now, same_node);
    o["replicas"] = replicas_json(reps, t);
    print_json(o);
  } else {
    print_info(t, holders, now, same_node);
    print_replicas(reps, t);
  }
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
