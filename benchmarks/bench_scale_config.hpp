// memcuda_bench_scale's options (the program's file comment says what each
// measures) and where it finds the `memcuda` CLI it starts.
#pragma once

#include "bench_common.hpp"

namespace memcuda::bench::scale {

inline constexpr const char* kUsage =
    "usage: memcuda_bench_scale [--sizes 1000,10000,100000] [--procs 1,16,64] [--json FILE]\n"
    "       [--budget 1800] [--step-timeout 120] [--window 2] [--gc-counts 10000,100000]\n"
    "       [--rm-count 100000] [--cli PATH] [--label TEXT] [--url URL | --redis-server PATH]\n"
    "       [--python PY | --no-python]\n";

struct Config {
  std::vector<std::uint64_t> sizes{1000, 10000, 100000};
  std::vector<std::uint64_t> procs{1, 16, 64};
  std::vector<std::uint64_t> gc_counts{10000, 100000};
  std::uint64_t rm_count = 100000;
  std::string json_path, cli, label;
  std::string python = "python3";  // the Python client's interpreter
  bool no_python = false;
  int budget_s = 1800, step_timeout_s = 120;
  double window_s = 2;
};

inline std::vector<std::uint64_t> parse_counts(const std::string& s) {
  std::vector<std::uint64_t> v;
  for (int x : parse_int_list(s)) {
    if (x <= 0) throw std::invalid_argument("counts must be positive: '" + s + "'");
    v.push_back(static_cast<std::uint64_t>(x));
  }
  if (v.empty()) throw std::invalid_argument("an empty list: '" + s + "'");
  return v;
}

// --cli, else `memcuda` beside this program, in ../tools (a build tree), or on PATH.
inline std::string find_cli(const Args& a) {
  if (auto c = a.get("--cli")) return *c;
  const auto dir = self_exe().parent_path();
  for (const auto& p : {dir / "memcuda", dir.parent_path() / "tools" / "memcuda"})
    if (::access(p.c_str(), X_OK) == 0) return p.string();
  auto p = find_on_path("memcuda");
  if (p.empty()) throw std::runtime_error("no memcuda CLI beside the program or on PATH: pass --cli PATH");
  return p;
}

inline Config parse_config(const Args& args) {
  Config cfg;
  if (auto v = args.get("--sizes")) cfg.sizes = parse_counts(*v);
  if (auto v = args.get("--procs")) cfg.procs = parse_counts(*v);
  if (auto v = args.get("--gc-counts")) cfg.gc_counts = parse_counts(*v);
  cfg.rm_count = std::stoull(args.get_or("--rm-count", "100000"));
  cfg.budget_s = std::stoi(args.get_or("--budget", "1800"));
  cfg.step_timeout_s = std::stoi(args.get_or("--step-timeout", "120"));
  cfg.window_s = std::stod(args.get_or("--window", "2"));
  if (cfg.window_s <= 0) throw std::invalid_argument("--window must be positive");
  cfg.json_path = args.get_or("--json", "");
  cfg.label = args.get_or("--label", "");
  cfg.python = args.get_or("--python", "python3");
  cfg.no_python = args.has("--no-python");
  cfg.cli = find_cli(args);
  return cfg;
}

}  // namespace memcuda::bench::scale
