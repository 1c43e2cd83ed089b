// abi_mix_user.cpp in the host configuration: the control, which must link.
#define MEMCUDA_ENABLE_CUDA 0
#include "abi_mix_user.cpp"
