// Force-included (clang++ -include) into the fuzz targets, and only there.
//
// error.hpp uses std::source_location. libstdc++ 12 declares it only when the
// compiler has __builtin_source_location, which clang gained in version 15;
// with clang 14 (Debian 12's clang, and the only one with a packaged libFuzzer
// runtime there) <source_location> is empty and the headers do not compile.
// libc++ 14 has no <source_location> at all, so -stdlib=libc++ is no way out.
//
// This supplies the C++20 interface from the builtins clang 14 does have
// (__builtin_FILE and friends, evaluated at the call site as default
// arguments), so CudaError keeps a correct location. It does nothing when the
// builtin exists or the library already provides the type, so a newer clang
// uses the real header. Declaring a name in std is formally undefined; this
// file is confined to test binaries and never seen by library users.
#pragma once

#if defined(__clang__) && !__has_builtin(__builtin_source_location)
#include <version>  // __GLIBCXX__, __cpp_lib_source_location
#if defined(__GLIBCXX__) && !defined(__cpp_lib_source_location)
namespace std {
struct source_location {
  static constexpr source_location current(const char* file = __builtin_FILE(),
                                           const char* function = __builtin_FUNCTION(),
                                           unsigned line = __builtin_LINE(),
                                           unsigned column = __builtin_COLUMN()) noexcept {
    source_location l;
    l.file_ = file;
    l.function_ = function;
    l.line_ = line;
    l.column_ = column;
    return l;
  }
  constexpr source_location() noexcept = default;
  constexpr unsigned line() const noexcept { return line_; }
  constexpr unsigned column() const noexcept { return column_; }
  constexpr const char* file_name() const noexcept { return file_; }
  constexpr const char* function_name() const noexcept { return function_; }

 private:
  const char* file_ = "";
  const char* function_ = "";
  unsigned line_ = 0;
  unsigned column_ = 0;
};
}  // namespace std
#endif
#endif
