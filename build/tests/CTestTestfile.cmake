# CMake generated Testfile for 
# Source directory: /work/main/tests
# Build directory: /work/main/build/tests
# 
# This file includes the relevant testing commands required for 
# testing this directory and lists subdirectories to be tested as well.
include("/work/main/build/tests/memcuda_tests_include-8b9088e.cmake")
add_test([=[gpu_tests]=] "/work/main/build/tests/memcuda_tests" "--require-gpu" "[gpu]")
set_tests_properties([=[gpu_tests]=] PROPERTIES  SKIP_RETURN_CODE "77" TIMEOUT "600" _BACKTRACE_TRIPLES "/work/main/tests/CMakeLists.txt;17;add_test;/work/main/tests/CMakeLists.txt;0;")
