// The results of the batch operations of TensorRegistry (get_many,
// get_prefix, get_matching, create_many, remove_many, remove_prefix):
// what each name got, and each name's own typed failure.
#pragma once

#include "memcuda/config.hpp"

#include <exception>
#include <map>
#include <string>
#include <vector>

#include "memcuda/dtype.hpp"
#include "memcuda/error.hpp"
#include "memcuda/options.hpp"
#include "memcuda/shape.hpp"
#include "memcuda/shared_tensor.hpp"

MEMCUDA_NAMESPACE_BEGIN

// Why one name of a batch failed: the memcuda::Error it would have thrown
// alone (NotFound, TypeMismatch, Lost, Unavailable, ...), as its wire code
// and message and as the exception itself.
struct NameError {
  std::string code;     // Error::code(): "not_found", "type_mismatch", "lost", ...
  std::string message;  // its what()
  std::exception_ptr exception;

  // Throws the exception, with its class (catch (const NotFound&) works).
  [[noreturn]] void rethrow() const { std::rethrow_exception(exception); }
};

// What a batch get took. Every name in `tensors` holds one reference of
// this process (released like any SharedTensor); a name in `errors` took
// none. A name appears in exactly one of the two.
struct BatchGetResult {
  std::map<std::string, SharedTensor<void>> tensors;
  std::map<std::string, NameError> errors;

  bool ok() const noexcept { return errors.empty(); }

  // The strict form: every tensor when no name failed; otherwise gives
  // back every reference taken (the handles are dropped, their releases
  // queued, so the next call of any registry of this process sees them)
  // and throws the error of the first failed name (in name order).
  std::map<std::string, SharedTensor<void>> take_all() && {
    if (errors.empty()) return std::move(tensors);
    tensors.clear();
    errors.begin()->second.rethrow();
  }
};

// One tensor of a create_many: what create_any takes.
struct TensorSpec {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  CreateOptions options;
};

// What a batch remove did: the names it unlinked, and the names it could
// not (NotFound), each with its error.
struct BatchRemoveResult {
  std::vector<std::string> removed;
  std::map<std::string, NameError> errors;

  bool ok() const noexcept { return errors.empty(); }
};

MEMCUDA_NAMESPACE_END  // namespace memcuda
