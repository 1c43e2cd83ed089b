// Calls describe(). Linked with abi_mix_host.cpp built in the same
// configuration it must link (the control); built with the CUDA backend
// while abi_mix_host.cpp is not, the link must fail: the two TUs see
// TensorInfo in different inline namespaces (memcuda::v<M>_<m>_cuda and
// _host), so they cannot silently share a type whose layout may differ.
#include "abi_mix.hpp"

int main() {
  memcuda::TensorInfo t;
  t.name = "abi";
  return describe(t) == "abi" ? 0 : 1;
}
