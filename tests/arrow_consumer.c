/* An Arrow consumer written from the specification alone (tests/arrow_spec.h,
 * no Arrow library), in a process of its own: it opens a host tensor that
 * another process made through the registry, takes it as an ArrowDeviceArray
 * through the C ABI (memcuda_tensor_to_arrow), reads it as the specification
 * says, moves it, releases it, and reports the tensor's refcount along the way.
 *
 *   memcuda_arrow_consumer URL NAMESPACE NAME FLAGS
 *
 * Prints one line: "OK format=... length=... sum=... dtype=... refcounts=a,b,c"
 * (a: after the export, b: after the handle was released, c: after the
 * array's release), or "FAIL ..." lines; exits 0 only when every check held.
 * Built only where the C ABI is (src/c_api/tests.cmake). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arrow_spec.h"
#include "memcuda/c/memcuda.h"

static int g_failures = 0;

#define CHECK(cond)                                                                                       \
  do {                                                                                                    \
    if (!(cond)) {                                                                                        \
      ++g_failures;                                                                                       \
      printf("FAIL %s:%d: %s (last error: %s)\n", __FILE__, __LINE__, #cond, memcuda_last_error_message()); \
    }                                                                                                     \
  } while (0)

static int64_t refcount_of(memcuda_registry* r, const char* name) {
  memcuda_tensor_info info;
  memcuda_tensor_info_init(&info);
  if (memcuda_info(r, name, &info) != MEMCUDA_OK) return -1;
  return info.refcount;
}

/* The value of `key` in Arrow's metadata encoding (int32 count, then int32
 * length and bytes of each key and value), copied into out; "" if absent. */
static void metadata_value(const char* md, const char* key, char* out, size_t cap) {
  int32_t n, i, len;
  out[0] = '\0';
  if (!md) return;
  memcpy(&n, md, 4);
  md += 4;
  for (i = 0; i < n; ++i) {
    int match;
    memcpy(&len, md, 4);
    md += 4;
    match = (size_t)len == strlen(key) && memcmp(md, key, (size_t)len) == 0;
    md += len;
    memcpy(&len, md, 4);
    md += 4;
    if (match && (size_t)len < cap) {
      memcpy(out, md, (size_t)len);
      out[len] = '\0';
    }
    md += len;
  }
}

int main(int argc, char** argv) {
  memcuda_registry_options o;
  memcuda_registry* reg = NULL;
  memcuda_tensor* t = NULL;
  struct ArrowSchema schema, schema_only;
  struct ArrowDeviceArray array, moved;
  const struct ArrowArray* leaf;
  const int32_t* values;
  int64_t elements = 1, sum = 0, i, r_export, r_handle, r_released;
  unsigned flags;
  int d, list;
  char dtype[32], inner_format[32];

  if (argc != 5) {
    fprintf(stderr, "usage: %s URL NAMESPACE NAME FLAGS\n", argv[0]);
    return 2;
  }
  flags = (unsigned)strtoul(argv[4], NULL, 10);
  list = (flags & MEMCUDA_ARROW_FIXED_SIZE_LIST) != 0;
  memcuda_registry_options_init(&o);
  o.url = argv[1];
  o.name_space = argv[2];
  o.control_thread = 0;
  o.release_linger_ms = -1;
  if (memcuda_registry_open(&o, &reg) != MEMCUDA_OK || memcuda_get(reg, argv[3], MEMCUDA_DTYPE_I32, &t) != MEMCUDA_OK) {
    printf("FAIL open: %s\n", memcuda_last_error_message());
    return 1;
  }
  for (d = 0; d < memcuda_tensor_ndim(t); ++d) elements *= memcuda_tensor_shape(t)[d];

  /* Bad flags: a typed error, and the structs read released. */
  memset(&schema, 0xff, sizeof schema);
  CHECK(memcuda_tensor_to_arrow(t, 1u << 30, &schema, &array) == MEMCUDA_ERR_INVALID_ARGUMENT);
  CHECK(schema.release == NULL && array.array.release == NULL);
  /* The schema alone: no array, no reference. */
  CHECK(memcuda_tensor_to_arrow(t, flags, &schema_only, NULL) == MEMCUDA_OK);
  CHECK(schema_only.release != NULL);
  if (schema_only.release) schema_only.release(&schema_only);
  CHECK(schema_only.release == NULL);

  if (memcuda_tensor_to_arrow(t, flags, &schema, &array) != MEMCUDA_OK) {
    printf("FAIL memcuda_tensor_to_arrow: %s\n", memcuda_last_error_message());
    return 1;
  }
  r_export = refcount_of(reg, argv[3]);
  CHECK(array.device_type == ARROW_DEVICE_CPU);
  CHECK(array.device_id == 0);
  CHECK(array.sync_event == NULL);
  CHECK(array.reserved[0] == 0 && array.reserved[1] == 0 && array.reserved[2] == 0);
  CHECK(schema.dictionary == NULL && array.array.dictionary == NULL);
  CHECK(array.array.null_count == 0 && array.array.offset == 0);
  metadata_value(schema.metadata, "memcuda.dtype", dtype, sizeof dtype);
  CHECK(strcmp(dtype, "i32") == 0);
  CHECK(strcmp(schema.name, argv[3]) == 0);
  if (list) {
    int64_t inner = memcuda_tensor_shape(t)[memcuda_tensor_ndim(t) - 1];
    char want[32];
    snprintf(want, sizeof want, "+w:%lld", (long long)inner);
    CHECK(strcmp(schema.format, want) == 0);
    CHECK(schema.n_children == 1 && array.array.n_children == 1);
    CHECK(array.array.length == elements / inner);
    CHECK(array.array.n_buffers == 1 && array.array.buffers[0] == NULL);
    snprintf(inner_format, sizeof inner_format, "%s", schema.children[0]->format);
    leaf = array.array.children[0];
  } else {
    CHECK(schema.n_children == 0 && array.array.n_children == 0);
    snprintf(inner_format, sizeof inner_format, "%s", schema.format);
    leaf = &array.array;
  }
  CHECK(strcmp(inner_format, "i") == 0);
  CHECK(leaf->length == elements);
  CHECK(leaf->null_count == 0 && leaf->offset == 0);
  CHECK(leaf->n_buffers == 2);
  CHECK(leaf->buffers[0] == NULL);                           /* no validity bitmap: no nulls */
  CHECK(leaf->buffers[1] == memcuda_tensor_data(t));        /* zero copy: the tensor's memory */
  values = (const int32_t*)leaf->buffers[1];

  /* The handle goes; the array's own share keeps the tensor held and mapped. */
  memcuda_tensor_release(t);
  CHECK(memcuda_flush(reg, -1) == MEMCUDA_OK);
  r_handle = refcount_of(reg, argv[3]);
  for (i = 0; i < elements; ++i) sum += values[i];

  /* The specification's move: bitwise copy, then mark the source released. */
  moved = array;
  array.array.release = NULL;
  moved.array.release(&moved.array);
  CHECK(moved.array.release == NULL);
  schema.release(&schema);
  CHECK(schema.release == NULL);
  CHECK(memcuda_flush(reg, -1) == MEMCUDA_OK);
  r_released = refcount_of(reg, argv[3]);

  if (g_failures == 0)
    printf("OK format=%s length=%lld sum=%lld dtype=%s refcounts=%lld,%lld,%lld\n", inner_format,
           (long long)elements, (long long)sum, dtype, (long long)r_export, (long long)r_handle, (long long)r_released);
  fflush(stdout);
  memcuda_registry_close(reg);
  return g_failures == 0 ? 0 : 1;
}
