// The C ABI of "zero copy or an error" (docs/design.md): whether a device
// can use a tensor's pointer in place, and the count of the copies a
// binding made instead where its caller opted in.
#include "c_api_internal.hpp"
#include "memcuda/detail/base/copy_count.hpp"
#include "memcuda/detail/process/process.hpp"

using memcuda_c::guarded;

extern "C" {

int memcuda_tensor_check_device(const memcuda_tensor* t, int device) {
  return guarded([&] { memcuda_c::tensor(t).check_device(device); });
}

int memcuda_note_copy(const memcuda_tensor* t, const char* site, uint64_t bytes, const char* why) {
  return guarded([&] {
    const auto& s = memcuda_c::tensor(t);
    memcuda::detail::Process::get().copies().note(site ? site : "a binding", s.name(), bytes,
                                                 why ? why : "zero copy could not be had");
  });
}

}  // extern "C"
