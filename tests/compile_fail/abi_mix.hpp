// Shared by abi_mix_host.cpp and abi_mix_user.cpp (tests/compile_fail): a
// function over a mem-cuda type, defined in one translation unit and called
// from another.
#pragma once

#include <string>

#include "memcuda/tensor_info.hpp"

std::string describe(const memcuda::TensorInfo& t);
