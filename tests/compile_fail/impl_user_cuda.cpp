// impl_user.cpp with the CUDA backend: must fail to link against a host
// implementation unit (impl_unit_host.cpp).
#define MEMCUDA_ENABLE_CUDA 1
#include "impl_user.cpp"
