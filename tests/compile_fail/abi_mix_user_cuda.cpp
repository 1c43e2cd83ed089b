// abi_mix_user.cpp with the CUDA backend: must fail to link against
// abi_mix_host.cpp.
#define MEMCUDA_ENABLE_CUDA 1
#include "abi_mix_user.cpp"
