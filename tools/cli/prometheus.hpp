// The Prometheus text exposition format (version 0.0.4), just what
// `memcuda stats --prometheus` needs: metric families with # HELP and
// # TYPE lines, samples with labels, label values escaped.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace memcuda::cli::prometheus {

// Label values (quote = true) escape backslash, double quote and line
// feed; HELP text escapes backslash and line feed only. Every other byte
// (UTF-8 included) is taken as is.
inline std::string escape(std::string_view v, bool quote) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"' && quote)
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

using Labels = std::vector<std::pair<std::string, std::string>>;

struct Sample {
  Labels labels;
  std::uint64_t value = 0;
};

// Writes families one after the other: all samples of a family follow its
// HELP and TYPE lines, as the format requires. A family without samples
// still gets its HELP and TYPE lines, so the metric names are discoverable.
class Writer {
 public:
  void family(std::string_view name, std::string_view type, std::string_view help, const std::vector<Sample>& samples) {
    // Appended piece by piece: `"literal" + std::string` inserts at the
    // front of a temporary, which GCC 12 reports as a false -Wrestrict.
    out_.append("# HELP ").append(name).append(" ").append(escape(help, false)).append("\n");
    out_.append("# TYPE ").append(name).append(" ").append(type).append("\n");
    for (const auto& s : samples) {
      out_ += name;
      if (!s.labels.empty()) {
        out_ += '{';
        for (std::size_t i = 0; i < s.labels.size(); ++i) {
          if (i) out_ += ',';
          out_.append(s.labels[i].first).append("=\"").append(escape(s.labels[i].second, true)).append("\"");
        }
        out_ += '}';
      }
      out_.append(" ").append(std::to_string(s.value)).append("\n");
    }
  }
  void gauge(std::string_view name, std::string_view help, std::uint64_t value) {
    family(name, "gauge", help, {Sample{{}, value}});
  }

  const std::string& text() const noexcept { return out_; }

 private:
  std::string out_;
};

}  // namespace memcuda::cli::prometheus
