# Enables the CUDA language for the project's own kernels (tests, examples,
# benchmarks) when the CUDA backend is on and nvcc can build for our host
# compiler. Sets MEMCUDA_CUDA_LANGUAGE. The library itself needs no nvcc.
set(MEMCUDA_CUDA_LANGUAGE OFF)
if(MEMCUDA_WITH_CUDA)
  include(CheckLanguage)
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND CUDAToolkit_NVCC_EXECUTABLE)
    set(ENV{CUDACXX} ${CUDAToolkit_NVCC_EXECUTABLE})
  endif()
  if(NOT DEFINED CMAKE_CUDA_HOST_COMPILER AND NOT DEFINED ENV{CUDAHOSTCXX})
    set(ENV{CUDAHOSTCXX} ${CMAKE_CXX_COMPILER})
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)  # Hopper (H100/H200), our GPU hosts
    endif()
    enable_language(CUDA)
    set(MEMCUDA_CUDA_LANGUAGE ON)
  else()
    message(STATUS "memcuda: no usable CUDA compiler: kernels in tests/examples/benchmarks are skipped")
  endif()
endif()

# CMake 3.25 cannot set CUDA_STANDARD 20; C++20 .cu files get the flag directly.
function(memcuda_cuda_cxx20 target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
endfunction()
