// The Python client's rows of memcuda_bench_scale: its workers are
// benchmarks/python/scale_worker.py run by --python (default python3), with
// the memcuda package of the script's tree (<tree>/python on PYTHONPATH) and
// libmemcuda_c.so from $MEMCUDA_LIBRARY, else beside this program or in its
// build tree, else wherever the package finds it. They are client registries
// like the C++ workers (control thread off, MEMCUDA_SHARE_REFERENCES=0: every
// get is a Redis acquire) and speak the same lines. A probe worker runs first:
// when python, the script, the package or the library is missing, every
// Python cell is "skipped" with the reason; nothing fails the run for it.
#pragma once

#include "bench_scale_workers.hpp"

#ifndef MEMCUDA_BENCH_SOURCE_DIR
#define MEMCUDA_BENCH_SOURCE_DIR ""
#endif

namespace memcuda::bench::scale {

namespace fs = std::filesystem;

struct PythonClient {
  std::string python, script, url, ns;
  std::vector<std::string> env;  // "K=V" added to each worker's environment
  std::string skip;              // why the Python cells are skipped; empty: they run
  json::object info;             // the interpreter, package and library the probe reported
};

inline std::string first_file(const std::vector<fs::path>& candidates) {
  for (const auto& p : candidates)
    if (::access(p.c_str(), R_OK) == 0 && fs::is_regular_file(p)) return fs::absolute(p).lexically_normal().string();
  return {};
}

inline std::unique_ptr<ChildProcess> python_worker(const PythonClient& py, std::vector<std::string> extra) {
  std::vector<std::string> argv{py.python, py.script, "--ns", py.ns};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto env = py.env;
  env.push_back(std::string(redis::kUrlEnv) + "=" + py.url);
  return std::make_unique<ChildProcess>(argv, env);
}

// Finds the interpreter, the script, the package and the library, then asks
// a probe worker to import memcuda (60 s at most).
inline PythonClient python_client(const std::string& python, bool off, const std::string& url,
                                  const std::string& ns) {
  PythonClient py;
  py.url = url, py.ns = ns;
  if (off) {
    py.skip = "--no-python";
    return py;
  }
  py.python = python.find('/') == std::string::npos ? find_on_path(python) : python;
  if (py.python.empty() || ::access(py.python.c_str(), X_OK) != 0) {
    py.skip = python.find('/') == std::string::npos ? "no " + python + " on PATH" : python + " is not executable";
    return py;
  }
  const fs::path exe_dir = self_exe().parent_path();
  py.script = first_file({exe_dir / "scale_worker.py", fs::path(MEMCUDA_BENCH_SOURCE_DIR) / "python/scale_worker.py",
                          "benchmarks/python/scale_worker.py"});
  if (py.script.empty()) {
    py.skip = "no benchmarks/python/scale_worker.py beside the program, in its source tree or under the current folder";
    return py;
  }
  py.env.push_back("MEMCUDA_SHARE_REFERENCES=0");
  const fs::path package = fs::path(py.script).parent_path().parent_path().parent_path() / "python";
  if (fs::exists(package / "memcuda" / "__init__.py")) {
    const char* old = std::getenv("PYTHONPATH");
    py.env.push_back("PYTHONPATH=" + package.string() + (old && *old ? ":" + std::string(old) : ""));
  }
  if (const char* lib = std::getenv("MEMCUDA_LIBRARY"); !lib || !*lib) {
    const auto so = first_file({exe_dir / "libmemcuda_c.so", exe_dir.parent_path() / "src/c_api/libmemcuda_c.so"});
    if (!so.empty()) py.env.push_back("MEMCUDA_LIBRARY=" + so);
  }
  auto w = python_worker(py, {"--role", "probe"});
  const auto l = w->read_line(std::chrono::seconds(60));
  if (!l) {
    py.skip = w->eof() ? py.python + " " + py.script + " exited without a word (its stderr above)"
                       : "the probe said nothing in 60 s";
    return py;
  }
  std::istringstream in(*l);
  std::string word, version, package_version, library;
  in >> word;
  if (word == "SKIP") {
    std::getline(in >> std::ws, py.skip);
    py.skip = "memcuda does not load in " + py.python + ": " + py.skip;
    return py;
  }
  in >> version >> package_version >> library;
  if (word != "READY" || library.empty()) {
    py.skip = "the probe said '" + *l + "'";
    return py;
  }
  py.info = {{"python", py.python}, {"version", version},       {"script", py.script},
             {"memcuda", package_version}, {"library", library}};
  return py;
}

// Python get p50/p99 over the loop of the C++ get step (random names among
// the first n, each release flushed to Redis before the next get) in one
// worker; `cpp`: the C++ get step at this size, for the ratio of the p50s.
inline json::object python_gets(const PythonClient& py, std::uint64_t n, int gets, Clock::time_point end,
                                const json::value& cpp) {
  if (!py.skip.empty()) return status("skipped", py.skip);
  auto w = python_worker(
      py, {"--role", "get", "--count", std::to_string(n), "--gets", std::to_string(gets), "--seed", "42"});
  if (!expect(*w, "READY", end)) return status("timeout", "the worker was not ready in time");
  const auto end_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(end.time_since_epoch()).count();
  w->write("GO " + std::to_string(end_ns) + "\n");
  // Its answer may come a little after `end` (the get under way).
  auto done = expect(*w, "DONE", std::max(end, Clock::now()) + std::chrono::seconds(10));
  if (!done) return status("timeout");
  Samples get, pair;
  std::istringstream in(*done);
  for (std::int64_t g = 0, p = 0; in >> g >> p;) get.push_back(g), pair.push_back(p);
  json::object r = status(get.size() == static_cast<std::size_t>(gets) ? "ok" : "timeout");
  r["n"] = get.size();
  if (get.empty()) return r;
  const auto g = summarize(get);
  r["p50_us"] = g.p50_us, r["p99_us"] = g.p99_us, r["pair_p50_us"] = summarize(pair).p50_us;
  const auto* c = cpp.is_object() ? cpp.as_object().if_contains("p50_us") : nullptr;
  if (c && cpp.as_object().at("status") == "ok" && c->to_number<double>() > 0)
    r["over_cpp"] = g.p50_us / c->to_number<double>();
  return r;
}

// Python get+release pairs/s from p workers (the C++ rate's window and
// lines); `cpp`: the C++ throughput at p, for the ratio.
inline json::object python_rate(const PythonClient& py, std::uint64_t n, std::uint64_t p, double window_s,
                                Clock::time_point end, const json::object& cpp) {
  auto spawn = [&](std::uint64_t i) {
    return python_worker(py, {"--role", "tput", "--count", std::to_string(n), "--seed", std::to_string(1000 + i)});
  };
  auto g = rate(spawn, p, window_s, end);
  json::object o = status(g ? "ok" : "timeout");
  if (g) o["get_release_per_s"] = *g;
  if (const auto* c = cpp.if_contains("get_release_per_s"); g && c && c->to_number<double>() > 0)
    o["over_cpp"] = *g / c->to_number<double>();
  return o;
}

}  // namespace memcuda::bench::scale
