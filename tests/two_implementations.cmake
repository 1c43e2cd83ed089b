# Two copies of mem-cuda's implementation in one process are refused at run
# time (include/memcuda/detail/base/implementation_guard.hpp). Two shared
# libraries built from one source, each with its own implementation unit and
# hidden symbols (as a pybind11 extension module or libmemcuda_c has), are
# loaded RTLD_LOCAL into a program that links no mem-cuda; the test drives
# them against a private redis-server.
# They also keep the header-only opt-in (memcuda::headers and
# memcuda_add_implementation) in use in this tree, beside memcuda_tsan_tests.
# One set of objects serves both: each library still holds its own copy.
add_library(memcuda_probe_objects OBJECT two_implementations/probe.cpp)
target_link_libraries(memcuda_probe_objects PRIVATE memcuda::headers)
memcuda_add_implementation(memcuda_probe_objects)
set_target_properties(memcuda_probe_objects PROPERTIES
  POSITION_INDEPENDENT_CODE ON CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
foreach(_probe memcuda_probe_a memcuda_probe_b)
  add_library(${_probe} MODULE $<TARGET_OBJECTS:memcuda_probe_objects>)
  target_link_libraries(${_probe} PRIVATE memcuda::headers)
endforeach()
add_executable(memcuda_two_implementations two_implementations/host.cpp)
target_link_libraries(memcuda_two_implementations PRIVATE ${CMAKE_DL_LIBS})
target_compile_options(memcuda_two_implementations PRIVATE -Wall -Wextra)
add_dependencies(memcuda_tests memcuda_two_implementations memcuda_probe_a memcuda_probe_b)
add_test(NAME two_implementations
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/c_api_with_redis.sh $<TARGET_FILE:memcuda_two_implementations>
                 $<TARGET_FILE:memcuda_probe_a> $<TARGET_FILE:memcuda_probe_b>)
set_tests_properties(two_implementations PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
