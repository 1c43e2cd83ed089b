// memcuda_bench_scale's tables, made from its JSON results (one object per
// registry size, one per throughput process count; the Python client's cells
// from their "py_get" and "python" objects), so that what is printed and
// what is written are the same figures.
#pragma once

#include "bench_scale_support.hpp"

namespace memcuda::bench::scale {

inline std::string count_label(std::uint64_t k) {
  if (k >= 1000000 && k % 1000000 == 0) return std::to_string(k / 1000000) + "M";
  if (k >= 1000 && k % 1000 == 0) return std::to_string(k / 1000) + "k";
  return std::to_string(k);
}

inline std::string num(const json::object& o, std::string_view key, int prec) {
  const auto* v = o.if_contains(key);
  if (!v || v->is_null()) return "-";
  return fmt(v->to_number<double>(), prec);
}

// The value(s) of a step, or its status when it did not give them.
inline std::string cell(const json::value* step, std::vector<std::pair<std::string_view, int>> keys) {
  if (!step || !step->is_object()) return "n/a";
  const auto& o = step->as_object();
  const std::string st(o.at("status").as_string());
  if (st != "ok") return st;
  std::string out;
  for (const auto& [k, prec] : keys) out += (out.empty() ? "" : " / ") + num(o, k, prec);
  return out;
}

inline const json::value* gc_step(const json::object& row, std::uint64_t k) {
  if (const auto* gc = row.if_contains("gc"))
    for (const auto& g : gc->as_array())
      if (g.as_object().at("k").to_number<std::uint64_t>() == k) return &g;
  return nullptr;
}

inline std::string size_table(const json::array& rows, const std::vector<std::uint64_t>& gc_counts,
                              std::uint64_t rm_count) {
  std::vector<std::string> head{"N",          "fill s",     "create p50 / p99 ms", "get p50 / p99 µs",
                                "PING p50 µs", "get / PING", "Python get p50 / p99 µs", "Python / C++ get p50",
                                "ls wall s",  "ls max RSS MiB", "list() s", "Redis B / tensor"};
  for (auto k : gc_counts) head.push_back("GC " + count_label(k) + " s");
  head.push_back("rm " + count_label(rm_count) + " s");
  Table t(head, "l");
  for (const auto& rv : rows) {
    const auto& r = rv.as_object();
    std::vector<std::string> row{std::to_string(r.at("n").to_number<std::uint64_t>()),
                                 cell(r.if_contains("fill"), {{"s", 2}}),
                                 cell(r.if_contains("create"), {{"p50_ms", 2}, {"p99_ms", 2}}),
                                 cell(r.if_contains("get"), {{"p50_us", 0}, {"p99_us", 0}}),
                                 cell(r.if_contains("get"), {{"ping_p50_us", 0}}),
                                 cell(r.if_contains("get"), {{"get_over_ping", 1}}),
                                 cell(r.if_contains("py_get"), {{"p50_us", 0}, {"p99_us", 0}}),
                                 cell(r.if_contains("py_get"), {{"over_cpp", 2}}),
                                 cell(r.if_contains("ls"), {{"wall_s", 3}}),
                                 cell(r.if_contains("ls"), {{"max_rss_mib", 1}}),
                                 cell(r.if_contains("list"), {{"wall_s", 3}}),
                                 cell(r.if_contains("memory"), {{"bytes_per_tensor", 0}})};
    for (auto k : gc_counts) row.push_back(cell(gc_step(r, k), {{"s", 2}}));
    row.push_back(cell(r.if_contains("rm"), {{"s", 2}}));
    t.add(std::move(row));
  }
  return t.str();
}

inline std::string throughput_table(const json::array& rows) {
  Table t({"processes", "get+release pairs/s", "PING/s", "pairs / PING", "Python pairs/s", "Python / C++ pairs"},
          "l");
  for (const auto& rv : rows) {
    const auto& r = rv.as_object();
    const auto* v = &rv;
    const auto* py = r.if_contains("python");
    t.add({std::to_string(r.at("procs").to_number<int>()), cell(v, {{"get_release_per_s", 0}}),
           cell(v, {{"ping_per_s", 0}}), cell(v, {{"ratio", 3}}), cell(py, {{"get_release_per_s", 0}}),
           cell(py, {{"over_cpp", 2}})});
  }
  return t.str();
}

// Which Python client the Python cells measured, or why they are skipped.
inline std::string python_line(const json::object& info) {
  if (const auto* st = info.if_contains("status"))
    return "Python client: " + std::string(st->as_string()) + " (" +
           std::string(info.contains("why") ? info.at("why").as_string() : "") + ")\n";
  auto str = [&](const char* k) { return std::string(info.at(k).as_string()); };
  return "Python client: " + str("python") + " (Python " + str("version") + "), memcuda " + str("memcuda") + ", " +
         str("library") + "\n";
}

}  // namespace memcuda::bench::scale
