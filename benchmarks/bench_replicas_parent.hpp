// bench_replicas' parent: the allocator of record. It publishes the dict on
// the source GPU, times the copies and replicate(), starts the fresh
// children and the NCCL baseline, and prints the table (bench_replicas.cu).
#pragma once

namespace {

struct Setup {
  int source = 0;
  std::vector<int> targets;
  int reps = 5, warmup = 1;
  std::uint64_t bytes = 0;
  std::string ns;
};

// The dict on the source GPU, every float word distinct and non-zero.
std::vector<SharedTensor<void>> publish(TensorRegistry& reg, const mb::Args& a, const Setup& s) {
  std::vector<TensorSpec> batch;
  CreateOptions o;
  o.persistent = true;
  o.device = s.source;
  for (const auto& x : specs_of(a)) batch.push_back({kPrefix + x.name, DType::bf16, x.shape, o});
  auto made = reg.create_many(batch);
  std::vector<SharedTensor<void>> out;
  std::uint32_t seed = 1;
  BENCH_CUDA(cudaSetDevice(s.source));
  for (const auto& b : batch) {
    auto t = std::move(made.at(b.name));
    mb::fill_kernel<<<mb::blocks_for(s.source), 256>>>(static_cast<float*>(t.data()), t.bytes() / 4, seed++);
    BENCH_CUDA(cudaGetLastError());
    out.push_back(std::move(t));
  }
  BENCH_CUDA(cudaDeviceSynchronize());
  return out;
}

// cudaMemcpyPeerAsync of every tensor to each of `to`, all at once, each
// target pulling on a stream of its own; ms until all are synchronised.
Ms peer_copies(const std::vector<SharedTensor<void>>& src, const Setup& s, const std::vector<int>& to) {
  std::vector<void*> dst(to.size());
  std::vector<cudaStream_t> st(to.size());
  for (std::size_t i = 0; i < to.size(); ++i) {
    BENCH_CUDA(cudaSetDevice(to[i]));
    BENCH_CUDA(cudaMalloc(&dst[i], s.bytes));
    BENCH_CUDA(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
  }
  Ms ms;
  for (int r = 0; r < s.warmup + s.reps; ++r) {
    const auto t0 = mb::now_ns();
    for (std::size_t i = 0; i < to.size(); ++i) {
      auto* p = static_cast<char*>(dst[i]);
      for (const auto& t : src) {
        BENCH_CUDA(cudaMemcpyPeerAsync(p, to[i], t.data(), s.source, t.bytes(), st[i]));
        p += t.bytes();
      }
    }
    for (auto x : st) BENCH_CUDA(cudaStreamSynchronize(x));
    if (r >= s.warmup) ms.push_back(ms_since(t0));
  }
  for (std::size_t i = 0; i < to.size(); ++i) {
    BENCH_CUDA(cudaSetDevice(to[i]));
    BENCH_CUDA(cudaFree(dst[i]));
    BENCH_CUDA(cudaStreamDestroy(st[i]));
  }
  return ms;
}

// replicate() until a reader's stream on every target has waited for its copy.
Ms replicate_rows(TensorRegistry& reg, const Setup& s, json::object& extra) {
  std::vector<cudaStream_t> st;
  for (int d : s.targets) {
    BENCH_CUDA(cudaSetDevice(d));
    st.emplace_back();
    BENCH_CUDA(cudaStreamCreateWithFlags(&st.back(), cudaStreamNonBlocking));
  }
  const std::string last = std::string(kPrefix) + "lm_head.weight";
  Ms ms, call_ms;
  std::size_t made = 0;
  for (int r = 0; r < s.warmup + s.reps; ++r) {
    if (r > 0 && drop_replicas(reg, kPrefix, {.prefix = true}) != made)
      throw std::runtime_error("drop_replicas did not drop every replica");
    const auto t0 = mb::now_ns();
    ReplicateOptions o;
    o.devices = s.targets;
    o.prefix = true;
    made = replicate(reg, kPrefix, o).size();
    const double called = ms_since(t0);
    for (std::size_t i = 0; i < s.targets.size(); ++i) {
      GetOptions g;
      g.replica = LocalReplica::use;
      g.reader_device = s.targets[i];
      g.stream = st[i];
      auto t = reg.get<void>(last, g);
      if (t.info().replica_of.empty()) throw std::runtime_error("the get after replicate gave no replica");
    }
    for (auto x : st) BENCH_CUDA(cudaStreamSynchronize(x));
    if (r >= s.warmup) {
      ms.push_back(ms_since(t0));
      call_ms.push_back(called);
    }
  }
  for (auto x : st) BENCH_CUDA(cudaStreamDestroy(x));
  extra["replicate_call_ms"] = to_json(call_ms);
  extra["replicas"] = made;
  return ms;
}

// Every tensor published in place on the source's stream, until a reader on
// every target takes the last one's replica again: the allocator of
// record's refresh of each replica, as each publish asks it (one command
// per tensor, taken in order). Runs after replicate_rows: the replicas exist.
Ms follow_rows(TensorRegistry& reg, const std::vector<SharedTensor<void>>& held, const Setup& s) {
  std::vector<cudaStream_t> st;
  for (int d : s.targets) {
    BENCH_CUDA(cudaSetDevice(d));
    st.emplace_back();
    BENCH_CUDA(cudaStreamCreateWithFlags(&st.back(), cudaStreamNonBlocking));
  }
  BENCH_CUDA(cudaSetDevice(s.source));
  cudaStream_t producer{};
  BENCH_CUDA(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
  const std::string last = held.back().name();
  Ms ms;
  for (int r = 0; r < s.warmup + s.reps; ++r) {
    const auto t0 = mb::now_ns();
    for (const auto& t : held) (void)t.publish(producer);
    for (std::size_t i = 0; i < s.targets.size(); ++i) {
      GetOptions g;
      g.replica = LocalReplica::use;
      g.reader_device = s.targets[i];
      g.stream = st[i];
      while (reg.get<void>(last, g).info().replica_of.empty())
        if (ms_since(t0) > 60'000) throw std::runtime_error("the replicas did not follow a publish within 60 s");
    }
    for (auto x : st) BENCH_CUDA(cudaStreamSynchronize(x));
    if (r >= s.warmup) ms.push_back(ms_since(t0));
  }
  for (auto x : st) BENCH_CUDA(cudaStreamDestroy(x));
  BENCH_CUDA(cudaStreamDestroy(producer));
  return ms;
}

// `reps` fresh children of one mode; their "ms", or a throw on a wrong value.
Ms children(const mb::Args& a, const Setup& s, const std::string& mode, int device, json::object* last = nullptr) {
  Ms ms;
  const int n = mode == "read" ? 1 : s.warmup + s.reps;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> argv{mb::self_exe().string(), "--child", mode, "--ns", s.ns, "--device",
                                  std::to_string(device), "--reps", std::to_string(s.reps)};
    if (a.has("--small")) argv.push_back("--small");
    argv.insert(argv.end(), {"--scale", std::to_string(scale_of(a))});
    int rc = 0;
    auto out = mb::capture(argv, std::chrono::minutes(5), &rc);
    if (!out) throw std::runtime_error("child " + mode + " failed (exit " + std::to_string(rc) + ")");
    auto doc = json::parse(*out).as_object();
    if (doc.at("wrong").to_number<std::uint64_t>() != 0)
      throw std::runtime_error("child " + mode + ": " + std::to_string(doc.at("wrong").to_number<std::uint64_t>()) +
                               " wrong values");
    if (mode != "read" && r >= s.warmup) ms.push_back(doc.at("ms").to_number<double>());
    if (last) *last = doc;
  }
  return ms;
}

std::string nccl_script(const mb::Args& a) {
  if (auto p = a.get("--nccl-script")) return *p;
  for (std::filesystem::path p : {mb::self_exe().parent_path() / "torch_nccl_broadcast.py",
                                  std::filesystem::path(MEMCUDA_BENCH_SOURCE_DIR) / "baselines/torch_nccl_broadcast.py",
                                  std::filesystem::path("benchmarks/baselines/torch_nccl_broadcast.py")})
    if (std::filesystem::exists(p)) return p.string();
  return {};
}

// The NCCL rows, or a reason they are missing.
std::optional<json::object> nccl(const mb::Args& a, const Setup& s, std::string* why) {
  const std::string script = nccl_script(a);
  if (a.has("--no-nccl") || script.empty()) {
    *why = script.empty() ? "baselines/torch_nccl_broadcast.py not found" : "--no-nccl";
    return std::nullopt;
  }
  std::string devs = std::to_string(s.source);
  for (int d : s.targets) devs += "," + std::to_string(d);
  int rc = 0;
  auto out = mb::capture({mb::find_on_path(a.get_or("--python", "python3")), script, "--devices", devs, "--scale",
                          std::to_string(scale_of(a)), "--reps", std::to_string(s.reps), "--warmup",
                          std::to_string(s.warmup)},
                         std::chrono::minutes(5), &rc);
  if (!out || out->rfind("skip", 0) == 0) {
    *why = out ? *out : "torch_nccl_broadcast.py failed (exit " + std::to_string(rc) + ")";
    return std::nullopt;
  }
  return json::parse(*out).as_object();
}

std::string gbps(std::uint64_t bytes, double ms) { return mb::fmt(static_cast<double>(bytes) / (ms * 1e6), 1); }

void print(const Setup& s, const json::object& doc) {
  const auto& rows = doc.at("rows").as_object();
  auto med = [&](const char* k) { return median(json::value_to<Ms>(rows.at(k))); };
  const double floor = med("floor");
  std::string to;
  for (int d : s.targets) to += (to.empty() ? "" : ",") + std::to_string(d);
  mb::Table t({"row", "median ms", "min ms", "GB/s per target", "/ floor"}, "lrrrr");
  auto add = [&](const std::string& label, const char* k) {
    if (!rows.contains(k)) return;
    const Ms v = json::value_to<Ms>(rows.at(k));
    t.add({label, mb::fmt(median(v), 2), mb::fmt(minimum(v), 2), gbps(s.bytes, median(v)),
           mb::fmt(median(v) / floor, 2) + "x"});
  };
  add("floor: cudaMemcpyPeer " + std::to_string(s.source) + "->" + std::to_string(s.targets[0]) + " (one link)",
      "floor");
  add("cudaMemcpyPeer " + std::to_string(s.source) + "->each at once", "naive");
  add("memcuda replicate -> " + to + ", until readers may read", "replicate");
  add("memcuda publish of all 291 in place -> replicas current again", "follow");
  add("NCCL broadcast, 291 calls", "nccl_per_tensor");
  add("NCCL broadcast, one flat buffer", "nccl_flat");
  std::cout << "### Replicating the 7B-shaped dict (" << s.bytes << " bytes), GPU " << s.source << " -> " << to
            << " (" << doc.at("gpu").as_string().c_str() << ")\n\n"
            << t.str() << "\nMedian of " << s.reps << " after " << s.warmup << " warm-up.";
  if (doc.contains("nccl_skipped")) std::cout << " NCCL rows skipped: " << doc.at("nccl_skipped").as_string().c_str();
  std::cout << "\n\n";
  mb::Table u({"row", "median ms", "min ms", "ratio"}, "lrrr");
  auto pair = [&](const std::string& l1, const char* k1, const std::string& l2, const char* k2, bool rate) {
    const Ms a = json::value_to<Ms>(rows.at(k1)), b = json::value_to<Ms>(rows.at(k2));
    const std::uint64_t n = doc.at("read_bytes").to_number<std::uint64_t>();
    u.add({l1 + (rate ? " (" + gbps(n, median(a)) + " GB/s)" : ""), mb::fmt(median(a), 3), mb::fmt(minimum(a), 3),
           "1.00"});
    u.add({l2 + (rate ? " (" + gbps(n, median(b)) + " GB/s)" : ""), mb::fmt(median(b), 3), mb::fmt(minimum(b), 3),
           mb::fmt(median(b) / median(a), 2) + "x"});
  };
  pair("kernel on GPU " + std::to_string(s.targets[0]) + " reads lm_head through the peer mapping", "read_peer",
       "the same kernel reads its local replica", "read_local", true);
  const auto& ex = doc.at("extra").as_object();
  pair("fresh process gets the 291 on the source's GPU (" + json::serialize(ex.at("get_same_imports")) + " imports)",
       "get_same",
       "fresh process gets its GPU's 291 replicas (" + json::serialize(ex.at("get_replica_imports")) + " imports)",
       "get_replica", false);
  pair("fresh process opens every tensor whole, copies TP shard 1/4", "whole_copy",
       "fresh process opens TP shard 1/4 of every tensor (views)", "shard_open", false);
  std::cout << u.str() << "\n";
}

int parent(const mb::Args& a) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
    std::cerr << "bench_replicas: skipped: needs 2 GPUs (" << n << " visible)\n";
    return 0;
  }
  Setup s;
  s.source = std::stoi(a.get_or("--source", "0"));
  s.reps = std::stoi(a.get_or("--reps", "5"));
  s.warmup = std::stoi(a.get_or("--warmup", "1"));
  if (auto d = a.get("--devices")) s.targets = mb::parse_int_list(*d);
  else
    for (int d = 0; d < n; ++d)
      if (d != s.source) s.targets.push_back(d);
  s.bytes = mb::check_specs(specs_of(a), scale_of(a));
  s.ns = "mcrep-" + std::to_string(::getpid());
  signal(SIGPIPE, SIG_IGN);
  mb::RedisTarget redis(a);
  ::setenv(redis::kUrlEnv, redis.url().c_str(), 1);  // this process's registry and its children's
  for (int d : s.targets) enable_peer(d, s.source), enable_peer(s.source, d);
  auto reg = open_registry(s.ns, s.source, true);
  json::object doc, rows, extra;
  cudaDeviceProp p{};
  BENCH_CUDA(cudaGetDeviceProperties(&p, s.source));
  doc["tool"] = "bench_replicas";
  doc["gpu"] = p.name;
  doc["date"] = mb::utc_now_iso();
  doc["bytes"] = s.bytes;
  std::cerr << "bench_replicas: publishing " << s.bytes << " bytes on GPU " << s.source << "\n";
  auto held = publish(reg, a, s);
  rows["floor"] = to_json(peer_copies(held, s, {s.targets[0]}));
  rows["naive"] = to_json(peer_copies(held, s, s.targets));
  std::cerr << "bench_replicas: replicate\n";
  rows["replicate"] = to_json(replicate_rows(reg, s, extra));
  std::cerr << "bench_replicas: publish in place, replicas follow\n";
  rows["follow"] = to_json(follow_rows(reg, held, s));
  std::cerr << "bench_replicas: fresh processes\n";
  json::object same, rep;
  rows["get_same"] = to_json(children(a, s, "get_same", s.source, &same));
  rows["get_replica"] = to_json(children(a, s, "get_replica", s.targets[0], &rep));
  extra["get_same_imports"] = same.at("import_opens");
  extra["get_replica_imports"] = rep.at("import_opens");
  rows["whole_copy"] = to_json(children(a, s, "whole_copy", s.source));
  rows["shard_open"] = to_json(children(a, s, "shard_open", s.source));
  json::object read;
  children(a, s, "read", s.targets[0], &read);
  rows["read_peer"] = read.at("peer_ms");
  rows["read_local"] = read.at("local_ms");
  doc["read_bytes"] = read.at("bytes");
  std::string why;
  std::cerr << "bench_replicas: NCCL baseline\n";
  if (auto x = nccl(a, s, &why)) {
    rows["nccl_per_tensor"] = x->at("per_tensor_ms");
    rows["nccl_flat"] = x->at("flat_ms");
    doc["nccl"] = *x;
  } else {
    doc["nccl_skipped"] = why;
  }
  doc["rows"] = rows;
  doc["extra"] = extra;
  drop_replicas(reg, kPrefix, {.prefix = true});
  std::vector<std::string> names;
  for (const auto& t : held) names.push_back(t.name());
  reg.remove_many(names);
  print(s, doc);
  if (auto j = a.get("--json")) mb::write_file(*j, json::serialize(doc) + "\n");
  return 0;
}

}  // namespace
