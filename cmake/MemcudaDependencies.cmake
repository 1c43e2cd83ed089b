# Finds what memcuda's headers need. Used by the source tree and, installed,
# by memcudaConfig.cmake, so both resolve dependencies the same way.
#   in:  MEMCUDA_CUDA, MEMCUDA_UCX (AUTO|ON|OFF, default AUTO)
#   out: memcuda::hiredis, Boost::json, Threads::Threads, and when
#        MEMCUDA_WITH_CUDA is true, CUDA::cudart; when MEMCUDA_WITH_UCX
#        is true, memcuda::ucx (ucp, uct, ucs)
#
# Inside find_package(memcuda) a missing dependency makes the package "not
# found" (memcuda_FOUND false, with a message) rather than a fatal error, so
# that find_package(memcuda QUIET) stays optional; memcudaConfig.cmake stops
# after this file in that case. In the source tree a missing dependency is
# fatal at once, naming the Debian package.
include(CMakeFindDependencyMacro)

if(CMAKE_FIND_PACKAGE_NAME)
  set(_memcuda_in_config TRUE)
else()
  set(_memcuda_in_config FALSE)
endif()

# find_dependency() inside the package config, find_package(REQUIRED) in the
# source tree. A macro, so find_dependency's return() leaves this file.
macro(_memcuda_find_dependency)
  if(_memcuda_in_config)
    find_dependency(${ARGV})
  else()
    find_package(${ARGV} REQUIRED)
  endif()
endmacro()

# A dependency this file cannot find with find_package (hiredis).
macro(_memcuda_missing what)
  if(_memcuda_in_config)
    set(${CMAKE_FIND_PACKAGE_NAME}_NOT_FOUND_MESSAGE "${what}")
    set(${CMAKE_FIND_PACKAGE_NAME}_FOUND FALSE)
    return()
  else()
    message(FATAL_ERROR "memcuda: ${what}")
  endif()
endmacro()

_memcuda_find_dependency(Threads)
_memcuda_find_dependency(Boost 1.81 COMPONENTS json)

if(NOT TARGET memcuda::hiredis)
  find_package(PkgConfig QUIET)
  if(PkgConfig_FOUND)
    pkg_check_modules(MEMCUDA_HIREDIS QUIET IMPORTED_TARGET hiredis)
  endif()
  if(MEMCUDA_HIREDIS_FOUND)
    add_library(memcuda::hiredis INTERFACE IMPORTED)
    set_target_properties(memcuda::hiredis PROPERTIES INTERFACE_LINK_LIBRARIES PkgConfig::MEMCUDA_HIREDIS)
  else()
    find_path(MEMCUDA_HIREDIS_INCLUDE hiredis/hiredis.h)
    find_library(MEMCUDA_HIREDIS_LIB hiredis)
    if(NOT MEMCUDA_HIREDIS_INCLUDE OR NOT MEMCUDA_HIREDIS_LIB)
      _memcuda_missing("hiredis not found (Debian: apt-get install libhiredis-dev; or set CMAKE_PREFIX_PATH)")
    endif()
    add_library(memcuda::hiredis INTERFACE IMPORTED)
    set_target_properties(memcuda::hiredis PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${MEMCUDA_HIREDIS_INCLUDE}"
      INTERFACE_LINK_LIBRARIES "${MEMCUDA_HIREDIS_LIB}")
  endif()
endif()

if(NOT DEFINED MEMCUDA_CUDA)
  set(MEMCUDA_CUDA AUTO)
endif()
set(MEMCUDA_WITH_CUDA OFF)
if(NOT MEMCUDA_CUDA STREQUAL "OFF")
  if(NOT CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  if(MEMCUDA_CUDA STREQUAL "ON")
    _memcuda_find_dependency(CUDAToolkit)
  else()
    find_package(CUDAToolkit QUIET)
  endif()
  if(CUDAToolkit_FOUND)
    set(MEMCUDA_WITH_CUDA ON)
  endif()
endif()
# UCX moves bytes between nodes (detail/transfer/); pkg-config first, then
# the three libraries by name.
if(NOT DEFINED MEMCUDA_UCX)
  set(MEMCUDA_UCX AUTO)
endif()
set(MEMCUDA_WITH_UCX OFF)
if(NOT MEMCUDA_UCX STREQUAL "OFF")
  if(NOT TARGET memcuda::ucx)
    find_package(PkgConfig QUIET)
    if(PkgConfig_FOUND)
      pkg_check_modules(MEMCUDA_UCXPC QUIET IMPORTED_TARGET ucx)
    endif()
    if(MEMCUDA_UCXPC_FOUND)
      add_library(memcuda::ucx INTERFACE IMPORTED)
      set_target_properties(memcuda::ucx PROPERTIES INTERFACE_LINK_LIBRARIES PkgConfig::MEMCUDA_UCXPC)
    else()
      find_path(MEMCUDA_UCP_INCLUDE ucp/api/ucp.h)
      find_library(MEMCUDA_UCP_LIB ucp)
      find_library(MEMCUDA_UCT_LIB uct)
      find_library(MEMCUDA_UCS_LIB ucs)
      if(MEMCUDA_UCP_INCLUDE AND MEMCUDA_UCP_LIB AND MEMCUDA_UCT_LIB AND MEMCUDA_UCS_LIB)
        add_library(memcuda::ucx INTERFACE IMPORTED)
        set_target_properties(memcuda::ucx PROPERTIES
          INTERFACE_INCLUDE_DIRECTORIES "${MEMCUDA_UCP_INCLUDE}"
          INTERFACE_LINK_LIBRARIES "${MEMCUDA_UCP_LIB};${MEMCUDA_UCT_LIB};${MEMCUDA_UCS_LIB}")
      endif()
    endif()
  endif()
  if(TARGET memcuda::ucx)
    set(MEMCUDA_WITH_UCX ON)
  elseif(MEMCUDA_UCX STREQUAL "ON")
    _memcuda_missing("UCX not found (Debian: apt-get install libucx-dev; or set MEMCUDA_UCX=OFF)")
  endif()
endif()
if(NOT MEMCUDA_DEPENDENCIES_REPORTED)
  set(MEMCUDA_DEPENDENCIES_REPORTED ON)
  if(MEMCUDA_WITH_CUDA)
    message(STATUS "memcuda: CUDA backend on (CUDA ${CUDAToolkit_VERSION})")
  else()
    message(STATUS "memcuda: CUDA backend off (host backend only)")
  endif()
  if(MEMCUDA_WITH_UCX)
    message(STATUS "memcuda: UCX transfers on")
  else()
    message(STATUS "memcuda: UCX transfers off")
  endif()
endif()
# The top-level build records the outcome in its cache, where scripts
# (scripts/demo.sh) read it; MEMCUDA_CUDA=AUTO alone does not tell.
if(MEMCUDA_TOP_LEVEL AND NOT _memcuda_in_config)
  set(MEMCUDA_WITH_CUDA ${MEMCUDA_WITH_CUDA} CACHE INTERNAL "memcuda: the CUDA backend is built")
  set(MEMCUDA_WITH_UCX ${MEMCUDA_WITH_UCX} CACHE INTERNAL "memcuda: UCX transfers are built")
endif()
