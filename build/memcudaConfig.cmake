
####### Expanded from @PACKAGE_INIT@ by configure_package_config_file() #######
####### Any changes to this file will be overwritten by the next CMake run ####
####### The input file was memcudaConfig.cmake.in                            ########

get_filename_component(PACKAGE_PREFIX_DIR "${CMAKE_CURRENT_LIST_DIR}/../../../" ABSOLUTE)

macro(set_and_check _var _file)
  set(${_var} "${_file}")
  if(NOT EXISTS "${_file}")
    message(FATAL_ERROR "File or directory ${_file} referenced by variable ${_var} does not exist !")
  endif()
endmacro()

macro(check_required_components _NAME)
  foreach(comp ${${_NAME}_FIND_COMPONENTS})
    if(NOT ${_NAME}_${comp}_FOUND)
      if(${_NAME}_FIND_REQUIRED_${comp})
        set(${_NAME}_FOUND FALSE)
      endif()
    endif()
  endforeach()
endmacro()

####################################################################################

# The installed tree's choice of CUDA; a consumer may override with -DMEMCUDA_CUDA=OFF.
if(NOT DEFINED MEMCUDA_CUDA)
  set(MEMCUDA_CUDA AUTO)
endif()
include("${CMAKE_CURRENT_LIST_DIR}/MemcudaDependencies.cmake")
include("${CMAKE_CURRENT_LIST_DIR}/memcudaTargets.cmake")
if(MEMCUDA_WITH_CUDA)
  set_property(TARGET memcuda::memcuda APPEND PROPERTY INTERFACE_LINK_LIBRARIES CUDA::cudart)
  set_property(TARGET memcuda::memcuda APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS MEMCUDA_ENABLE_CUDA=1)
else()
  set_property(TARGET memcuda::memcuda APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS MEMCUDA_ENABLE_CUDA=0)
endif()
check_required_components(memcuda)
