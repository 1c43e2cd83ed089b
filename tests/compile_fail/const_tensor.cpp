// Compile-fail checks for SharedTensor<const T> (tests/compile_fail/CMakeLists.txt).
// Built with no MEMCUDA_CF_* macro it is the positive control and must
// compile: reading through a const view, and writing through a mutable one,
// are allowed. Each MEMCUDA_CF_* macro adds one write through a const view,
// and that build must fail to compile, with the expected diagnostic.
#include <span>
#include <vector>

#include "memcuda/shared_tensor.hpp"

namespace memcuda {

void reads_through_a_const_view(SharedTensor<const float>& ro, SharedTensor<float>& rw) {
  std::vector<float> buf(4);
  ro.copy_to_host(buf);               // reading is what a const view is for
  const float* p = ro.data();         // data() of a const view is const float*
  (void)p;
  rw.copy_from_host(buf);             // a mutable handle still writes
  float* q = rw.data();
  (void)q;
  SharedTensor<const void> rov;
  const void* pv = rov.data();
  (void)pv;

#if defined(MEMCUDA_CF_COPY_FROM_HOST)
  ro.copy_from_host(buf);             // must not compile: copy_from_host requires !is_const_v<T>
#endif
#if defined(MEMCUDA_CF_DATA_WRITE)
  ro.data()[0] = 1.f;                 // must not compile: data() is const float*
#endif
#if defined(MEMCUDA_CF_DATA_MUTABLE_POINTER)
  float* w = ro.data();               // must not compile: no const-dropping conversion
  (void)w;
#endif
}

}  // namespace memcuda
