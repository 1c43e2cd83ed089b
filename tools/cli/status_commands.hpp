// The commands of the `memcuda` tool that report the registry's state rather
// than a tensor's: leader (who holds the allocator-of-record lease) and stats
// (tensors and bytes per device, pools, sessions, queue; as text, JSON or
// Prometheus exposition). Included by memcuda_cli.cpp inside its namespace,
// after command_context.hpp.
#pragma once

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
