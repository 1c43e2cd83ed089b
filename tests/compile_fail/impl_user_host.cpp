// impl_user.cpp in the host configuration.
#define MEMCUDA_ENABLE_CUDA 0
#include "impl_user.cpp"
