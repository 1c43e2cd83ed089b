// Exit codes of the memcuda tool and the one place that maps an exception
// to an exit code, a wire-style code for --json and a hint for people.
#pragma once

#include <exception>
#include <string>

#include "cli/args.hpp"
#include "memcuda/error.hpp"

namespace memcuda::cli {

enum ExitCode : int {
  kOk = 0,
  kUsage = 1,        // the command line is wrong (or a name/shape/dtype is malformed)
  kNotFound = 2,     // no tensor of that name
  kNoLeader = 3,     // `leader`: nobody holds the allocator-of-record lease
  kUnreachable = 4,  // no allocator of record answered, or Redis unreachable / timed out
  kAuth = 5,         // Redis rejected the credentials
  kOther = 6,        // anything else
};

struct Failure {
  ExitCode exit = kOther;
  std::string code;     // memcuda::Error::code(), or "usage" / "internal"
  std::string message;  // what happened
  std::string hint;     // what to do; may be empty
};

// Classifies the exception being handled. Call only inside a catch block.
inline Failure classify_current_exception() {
  try {
    throw;
  } catch (const UsageError& e) {
    return {kUsage, "usage", e.what(), ""};
  } catch (const AuthError& e) {  // before IoError, its base
    // Not in --url: a command line is visible to every user in ps.
    return {kAuth, e.code(), e.what(),
            "set the password in the environment: MEMCUDA_REDIS_PASSWORD (and MEMCUDA_REDIS_USER for an ACL "
            "user), which a URL without a password picks up"};
  } catch (const IoError& e) {  // ConnectionError, TimeoutError
    return {kUnreachable, e.code(), e.what(), ""};
  } catch (const NotLeader& e) {
    // The message says whether nobody holds the lease or its holder is silent.
    return {kUnreachable, e.code(), e.what(),
            "`memcuda leader` shows who holds the lease; when nobody does, start an allocator of record with "
            "`memcuda serve` (or any program whose TensorRegistry hosts the control thread)"};
  } catch (const NotFound& e) {
    return {kNotFound, e.code(), e.what(), "`memcuda ls` lists the tensors"};
  } catch (const ProtocolError& e) {
    // A corrupt record in Redis is not the user's typo.
    if (e.errc() == ProtocolErrc::bad_record) return {kOther, e.code(), e.what(), ""};
    return {kUsage, e.code(), e.what(), ""};
  } catch (const InvalidArgument& e) {
    return {kUsage, e.code(), e.what(), ""};
  } catch (const Error& e) {
    return {kOther, e.code(), e.what(), ""};
  } catch (const std::exception& e) {
    return {kOther, "internal", e.what(), ""};
  } catch (...) {
    return {kOther, "internal", "unknown exception", ""};
  }
}

}  // namespace memcuda::cli
