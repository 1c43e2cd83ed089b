// The C ABI's Arrow C Device Data Interface export (memcuda/arrow.hpp).
#include "c_api_internal.hpp"
#include "memcuda/arrow.hpp"

using memcuda_c::guarded;

extern "C" {

int memcuda_tensor_to_arrow(const memcuda_tensor* t, unsigned flags, struct ArrowSchema* out_schema,
                            struct ArrowDeviceArray* out_array) {
  // Released first, so that a caller's struct never reads as live after a failure.
  if (out_schema) out_schema->release = nullptr;
  if (out_array) out_array->array.release = nullptr;
  return guarded([&] {
    constexpr unsigned known = MEMCUDA_ARROW_FIXED_SIZE_LIST | MEMCUDA_ARROW_STRICT_TYPES | MEMCUDA_ARROW_OPENED_EVENT;
    if (flags & ~known) throw memcuda::InvalidArgument("unknown memcuda_tensor_to_arrow flags " + std::to_string(flags & ~known));
    if (!out_schema) throw memcuda::InvalidArgument("out_schema is NULL");
    memcuda::ArrowExportOptions o;
    o.fixed_size_list = (flags & MEMCUDA_ARROW_FIXED_SIZE_LIST) != 0;
    o.strict_types = (flags & MEMCUDA_ARROW_STRICT_TYPES) != 0;
    o.newest_event = (flags & MEMCUDA_ARROW_OPENED_EVENT) == 0;
    memcuda::export_arrow(memcuda_c::tensor(t), out_schema, out_array, o);
  });
}

}  // extern "C"
