// The garbage collection of the registry from the `memcuda` tool: gc (run it
// now: drop the references of dead processes, report what was reclaimed) and
// quarantine (the malformed records it moved aside, detail/store/quarantine.hpp,
// and clearing them). Included by memcuda_cli.cpp inside its namespace, after
// command_context.hpp.
#pragma once

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

// ---- quarantine -------------------------------------------------------------

int cmd_quarantine(Context& c) {
  const auto& ops = c.args.operands;
  TensorRegistry reg(c.registry_options(false));
  if (ops.empty()) {
    auto q = reg.quarantined();
    if (c.json) {
      json::array a;
      for (const auto& r : q)
        a.push_back(json::object{{"id", r.id}, {"key", r.key}, {"reason", r.reason}, {"since_ms", r.since_ms}});
      print_json(json::object{{"quarantined", a}});
      return kOk;
    }
    if (q.empty()) std::cout << "no quarantined records\n";
    for (const auto& r : q) std::cout << r.id << "\t" << r.reason << "\t(data in " << r.key << ")\n";
    return kOk;
  }
  if (ops[0] != "clear") throw UsageError("quarantine takes no operand, or `clear ID...` / `clear --all`");
  std::vector<std::string> ids(ops.begin() + 1, ops.end());
  if (c.args.has("--all")) {
    if (!ids.empty()) throw UsageError("quarantine clear: give IDs or --all, not both");
    for (const auto& r : reg.quarantined()) ids.push_back(r.id);
  } else if (ids.empty()) {
    throw UsageError("quarantine clear: give the IDs to clear (see `memcuda quarantine`) or --all");
  }
  std::size_t missing = 0;
  for (const auto& id : ids) {
    const bool ok = reg.clear_quarantined(id);
    missing += !ok;
    if (!c.json) std::cout << (ok ? "cleared " : "not quarantined: ") << id << "\n";
  }
  if (c.json) print_json(json::object{{"cleared", ids.size() - missing}, {"not_found", missing}});
  return missing ? kNotFound : kOk;
}
