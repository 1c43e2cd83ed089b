/* The types every part of the C ABI shares: the export macro, status codes,
 * dtypes, backends, the opaque handles and the options of a create. Every
 * other header under memcuda/c/ includes this one and nothing else of
 * mem-cuda; <memcuda/c/memcuda.h> includes them all. */
#ifndef MEMCUDA_C_COMMON_H
#define MEMCUDA_C_COMMON_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define MEMCUDA_C_EXPORT
#else
#define MEMCUDA_C_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Incremented when a function's meaning or a struct's layout changes
 * incompatibly; new functions do not change it. */
#define MEMCUDA_C_ABI_VERSION 2 /* 2: memcuda_tensor_fields.strides */

/* ---- status codes: one per class of include/memcuda/error.hpp ---------- */
#define MEMCUDA_OK 0
#define MEMCUDA_ERR_ERROR 1            /* memcuda::Error (no more specific class) */
#define MEMCUDA_ERR_INVALID_ARGUMENT 2 /* InvalidArgument */
#define MEMCUDA_ERR_NOT_FOUND 3        /* NotFound */
#define MEMCUDA_ERR_ALREADY_EXISTS 4   /* AlreadyExists */
#define MEMCUDA_ERR_TYPE_MISMATCH 5    /* TypeMismatch */
#define MEMCUDA_ERR_STALE_HANDLE 6     /* StaleHandle */
#define MEMCUDA_ERR_BUDGET_EXCEEDED 7  /* BudgetExceeded */
#define MEMCUDA_ERR_LOST 8             /* Lost */
#define MEMCUDA_ERR_NOT_LEADER 9       /* NotLeader */
#define MEMCUDA_ERR_UNAVAILABLE 10     /* Unavailable */
#define MEMCUDA_ERR_INTERNAL 11        /* InternalError */
#define MEMCUDA_ERR_PROTOCOL 12        /* ProtocolError (an InvalidArgument) */
#define MEMCUDA_ERR_CUDA 13            /* CudaError */
#define MEMCUDA_ERR_REDIS 14           /* RedisError */
#define MEMCUDA_ERR_REDIS_CONNECTION 15 /* ConnectionError (a RedisError) */
#define MEMCUDA_ERR_REDIS_AUTH 16      /* AuthError (a ConnectionError) */
#define MEMCUDA_ERR_TIMEOUT 17         /* TimeoutError (a RedisError) */
#define MEMCUDA_ERR_REDIS_REPLY 18     /* ReplyError (a RedisError) */
#define MEMCUDA_ERR_OUT_OF_MEMORY 19   /* host memory exhausted (std::bad_alloc) */
#define MEMCUDA_ERR_UNKNOWN 20         /* any other failure (a bug: please report) */
#define MEMCUDA_ERR_NOT_ZERO_COPY 21   /* NotZeroCopy (an Unavailable): zero copy cannot be had */
#define MEMCUDA_ERR_LAST 21

/* ---- dtypes (the values of memcuda::DType; stable) ---------------------- */
#define MEMCUDA_DTYPE_ANY (-1) /* memcuda_get: accept whatever is stored */
#define MEMCUDA_DTYPE_BOOL 0
#define MEMCUDA_DTYPE_U8 1
#define MEMCUDA_DTYPE_I8 2
#define MEMCUDA_DTYPE_I16 3
#define MEMCUDA_DTYPE_I32 4
#define MEMCUDA_DTYPE_I64 5
#define MEMCUDA_DTYPE_U16 6
#define MEMCUDA_DTYPE_U32 7
#define MEMCUDA_DTYPE_U64 8
#define MEMCUDA_DTYPE_F16 9
#define MEMCUDA_DTYPE_BF16 10
#define MEMCUDA_DTYPE_F32 11
#define MEMCUDA_DTYPE_F64 12

/* ---- backends, states, limits ------------------------------------------- */
#define MEMCUDA_BACKEND_DEFAULT (-1)
#define MEMCUDA_BACKEND_CUDA 0
#define MEMCUDA_BACKEND_HOST 1

#define MEMCUDA_STATE_PENDING 0
#define MEMCUDA_STATE_READY 1
#define MEMCUDA_STATE_LOST 2

#define MEMCUDA_MAX_RANK 8
#define MEMCUDA_MAX_NAME_BYTES 255

/* ---- handles ---------------------------------------------------------------- */
typedef struct memcuda_registry memcuda_registry; /* opaque */
typedef struct memcuda_tensor memcuda_tensor;     /* opaque: one share of a reference */

typedef struct memcuda_create_options {
  uint32_t struct_size; /* sizeof(memcuda_create_options) */
  int backend;          /* MEMCUDA_BACKEND_DEFAULT: the registry's */
  int device;           /* -1: the registry's default device */
  int persistent;       /* 1: also held by its name until memcuda_remove */
} memcuda_create_options;

MEMCUDA_C_EXPORT void memcuda_create_options_init(memcuda_create_options* opts);


/* One tensor of memcuda_create_many: what memcuda_create takes. Fill with
 * memcuda_tensor_spec_init (it also inits `options`). */
typedef struct memcuda_tensor_spec {
  uint32_t struct_size;           /* sizeof(memcuda_tensor_spec) */
  const char* name;
  int dtype;                      /* a MEMCUDA_DTYPE_* value (not ANY) */
  int ndim;                       /* 0..MEMCUDA_MAX_RANK */
  const int64_t* shape;           /* ndim dimensions; may be NULL when ndim is 0 */
  memcuda_create_options options; /* backend, device, persistence of this tensor */
} memcuda_tensor_spec;

MEMCUDA_C_EXPORT void memcuda_tensor_spec_init(memcuda_tensor_spec* spec);

/* <dlpack/dlpack.h>'s managed tensor, which several calls take or make. */
struct DLManagedTensor;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MEMCUDA_C_COMMON_H */
