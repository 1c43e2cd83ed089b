// The batch commands of the `memcuda` tool: create-many, get-many, and rm
// with several names or a prefix (docs/cli.md). Each is one batch call of
// TensorRegistry, so one Redis round trip (create-many: one command on the
// lifecycle list and its reply). Included by memcuda_cli.cpp inside its
// namespace, after command_context.hpp and create_command.hpp.
#pragma once

// ---- create-many ------------------------------------------------------------

// One operand of create-many: NAME (the --dtype/--shape defaults) or
// NAME=DTYPE:DIMS (its own), e.g. w=f32:2,3 or step=i64: (a scalar).
TensorSpec create_many_operand(const std::string& op, const std::optional<DType>& dtype,
                               const std::optional<Shape>& shape) {
  TensorSpec s;
  const auto eq = op.find('=');
  s.name = op.substr(0, eq);
  validate_name(s.name);
  if (eq == std::string::npos) {
    if (!dtype || !shape)
      throw UsageError("'" + op + "' gives no dtype and shape: pass --dtype and --shape, or write NAME=DTYPE:DIMS");
    s.dtype = *dtype;
    s.shape = *shape;
  } else {
    const std::string spec = op.substr(eq + 1);
    const auto colon = spec.find(':');
    if (colon == std::string::npos)
      throw UsageError("'" + op + "': write NAME=DTYPE:DIMS, e.g. w=f32:2,3 (DIMS empty for a scalar)");
    auto d = dtype_from_string(spec.substr(0, colon));
    if (!d) throw UsageError("'" + op + "': '" + spec.substr(0, colon) + "' is not a dtype (use one of: " + dtype_names() + ")");
    auto sh = parse_shape(spec.substr(colon + 1));
    if (!sh) throw UsageError("'" + op + "': '" + spec.substr(colon + 1) + "' is not a list of dimensions");
    s.dtype = *d;
    s.shape = *sh;
  }
  (void)byte_size(s.dtype, s.shape);
  return s;
}

int cmd_create_many(Context& c) {
  const auto& ops = c.args.operands;
  if (ops.empty()) throw UsageError("needs at least one NAME (or NAME=DTYPE:DIMS)");
  const std::optional<DType> dtype = dtype_option(c);
  std::optional<Shape> shape;
  if (auto sh = c.args.get("--shape")) {
    shape = parse_shape(*sh);
    if (!shape) throw UsageError("option '--shape': '" + *sh + "' is not a list of dimensions (write them as 2,3)");
  }
  const CreateOptions co = create_options(c);  // create_command.hpp, shared with create
  std::vector<TensorSpec> specs;
  for (const auto& op : ops) {
    specs.push_back(create_many_operand(op, dtype, shape));
    specs.back().options = co;
  }
  TensorRegistry reg(create_registry_options(c));
  if (!reg.leader().present)
    throw NotLeader("no allocator of record in " + c.where() + ": nobody holds the lease, so nobody would allocate");
  auto made = reg.create_many(specs);
  json::array out;
  for (const auto& s : specs) {
    const TensorInfo info = made.at(s.name).info();
    if (c.json) {
      json::object t = tensor_summary_json(info, now_ms());
      t["refcount"] = info.refcount - 1;
      out.push_back(std::move(t));
    } else {
      std::cout << "created " << s.name << ": " << to_string(info.dtype) << " " << shape_to_string(info.shape) << ", "
                << human_bytes(info.bytes) << ", " << to_string(info.backend) << ", generation " << info.generation
                << "\n";
    }
  }
  made.clear();  // this command's references; persistent tensors keep their names'
  if (c.json) print_json(json::object{{"created", out}, {"persistent", co.persistent}});
  return kOk;
}

// ---- get-many ---------------------------------------------------------------

// The selection of get-many and rm: names, or --prefix P, or --glob G.
struct BatchSelection {
  std::vector<std::string> names;
  std::optional<std::string> prefix, glob;
};

BatchSelection batch_selection(const Context& c, bool glob_allowed) {
  BatchSelection s;
  s.prefix = c.args.get("--prefix");
  if (glob_allowed) s.glob = c.args.get("--glob");
  const int given = !c.args.operands.empty() + s.prefix.has_value() + s.glob.has_value();
  if (given == 0)
    throw UsageError(glob_allowed ? "needs NAME..., --prefix P or --glob G" : "needs NAME..., --prefix P or --all");
  if (given > 1) throw UsageError("give names, --prefix or --glob, not several");
  for (const auto& n : c.args.operands) validate_name(n);  // nothing happens when one name is malformed
  s.names = c.args.operands;
  return s;
}

int cmd_get_many(Context& c) {
  BatchSelection sel = batch_selection(c, true);
  TensorRegistry reg(c.registry_options(false));
  BatchGetResult r = sel.prefix ? reg.get_prefix(*sel.prefix)
                     : sel.glob ? reg.get_matching(*sel.glob)
                                : reg.get_many(sel.names);
  json::array ok;
  json::object errors;
  for (const auto& [n, t] : r.tensors) {
    if (c.json) {
      ok.push_back(tensor_summary_json(t.info(), now_ms()));
    } else {
      std::cout << n << ": " << to_string(t.dtype()) << " " << shape_to_string(t.shape()) << ", "
                << human_bytes(t.bytes()) << ", " << to_string(t.backend()) << ", generation " << t.generation()
                << "\n";
    }
  }
  for (const auto& [n, e] : r.errors) {
    if (c.json) errors[n] = json::object{{"code", e.code}, {"message", e.message}};
    else std::cout << n << ": " << e.code << ": " << e.message << "\n";
  }
  if (c.json) print_json(json::object{{"tensors", ok}, {"errors", errors}});
  else if (r.tensors.empty() && r.errors.empty()) std::cout << "no tensor matched\n";
  if (r.errors.empty()) return kOk;
  for (const auto& [n, e] : r.errors)
    if (e.code != "not_found") return kOther;
  return kNotFound;
}

// ---- rm ---------------------------------------------------------------------

int cmd_rm(Context& c) {
  const bool all = c.args.has("--all");
  if (all && (c.args.has("--prefix") || !c.args.operands.empty()))
    throw UsageError("--all removes every tensor: give it alone, without names or --prefix");
  BatchSelection sel;
  if (!all) sel = batch_selection(c, false);
  // "--prefix $P" with P unset would otherwise remove everything.
  if (sel.prefix && sel.prefix->empty())
    throw UsageError("--prefix is empty, which would remove every tensor (an unset shell variable?); "
                     "to remove every tensor, say --all");
  TensorRegistry reg(c.registry_options(false));
  BatchRemoveResult r = all ? reg.remove_all() : sel.prefix ? reg.remove_prefix(*sel.prefix) : reg.remove_many(sel.names);
  json::array removed, missing;
  for (const auto& n : r.removed) {
    removed.emplace_back(n);
    if (!c.json) std::cout << "removed " << n << "\n";
  }
  for (const auto& [n, e] : r.errors) {
    missing.emplace_back(n);
    std::cerr << "memcuda: rm " << n << ": " << e.message << " in " << c.where() << "\n";
  }
  if (c.json) print_json(json::object{{"removed", removed}, {"missing", missing}});
  return missing.empty() ? kOk : kNotFound;
}
