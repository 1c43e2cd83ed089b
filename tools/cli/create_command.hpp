// `memcuda create`, and the options it shares with create-many
// (batch_commands.hpp): --dtype, --persistent/--no-persistent, --backend,
// --device and --timeout. Included by memcuda_cli.cpp inside its namespace,
// after command_context.hpp.
#pragma once

// ---- what create and create-many share ------------------------------------

std::string dtype_names() {
  std::string s;
  for (DType d : kAllDTypes) s += (s.empty() ? "" : " ") + std::string(to_string(d));
  return s;
}

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

// ---- create ---------------------------------------------------------------

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
