// A user translation unit that only includes the API (memcuda/memcuda.hpp)
// and uses it. Linked (never run) by the implementation-unit checks of
// CMakeLists.txt: with exactly one implementation unit of its own
// configuration it must link (the control); without one, with two, or with
// one built in the other configuration the link must fail naming the
// mem-cuda symbol (README.md, "Troubleshooting").
#include "memcuda/memcuda.hpp"

int main() {
  memcuda::TensorRegistry reg;
  auto t = reg.create<float>("impl_check", {4});
  auto u = reg.get<float>("impl_check");
  return t.size() == u.size() ? 0 : 1;
}
