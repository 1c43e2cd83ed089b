# Tests of the C ABI and of the Python package over it.

# tests/c_api_test.c, compiled as C (C99): proves the header is plain C and
# drives the library against a private redis-server that
# tests/c_api_with_redis.sh starts on a unix socket.
enable_language(C)
add_executable(memcuda_c_api_test ${PROJECT_SOURCE_DIR}/tests/c_api_test.c)
set_target_properties(memcuda_c_api_test PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
target_compile_options(memcuda_c_api_test PRIVATE -Wall -Wextra -pedantic)
target_link_libraries(memcuda_c_api_test PRIVATE memcuda_c)
add_test(NAME c_api COMMAND sh ${PROJECT_SOURCE_DIR}/tests/c_api_with_redis.sh $<TARGET_FILE:memcuda_c_api_test>)
set_tests_properties(c_api PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)

# tests/c_api_options_test.c: the registry options of the C ABI (every
# field, the pool's included, a budget enforced, a struct_size not the
# library's) and memcuda_get_many's contract.
add_executable(memcuda_c_api_options_test ${PROJECT_SOURCE_DIR}/tests/c_api_options_test.c)
set_target_properties(memcuda_c_api_options_test PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
target_compile_options(memcuda_c_api_options_test PRIVATE -Wall -Wextra -pedantic)
target_link_libraries(memcuda_c_api_options_test PRIVATE memcuda_c)
add_test(NAME c_api_options COMMAND env -u MEMCUDA_SHARE_REFERENCES -u MEMCUDA_RELEASE_LINGER_MS -u MEMCUDA_CUDA_ALLOCATION -u MEMCUDA_RUNTIME_DIR -u MEMCUDA_ALLOWED_UIDS -u MEMCUDA_ALLOWED_GIDS -u MEMCUDA_DEBUG_POISON
         sh ${PROJECT_SOURCE_DIR}/tests/c_api_with_redis.sh $<TARGET_FILE:memcuda_c_api_options_test>)
set_tests_properties(c_api_options PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)

# The pytest suite (python/tests), with Debian's interpreter: it has
# python3-numpy, python3-pytest and python3-torch, which a pyenv python3 on
# PATH may not see. The runner exits 77 (skipped, with the reason) when
# pytest or numpy is missing; the GPU entry also when no CUDA device is usable.
if(EXISTS /usr/bin/python3)
  set(_py /usr/bin/python3)
else()
  find_program(_py NAMES python3)
endif()
set(MEMCUDA_PYTHON ${_py} CACHE FILEPATH "Python interpreter of the pytest suite (needs numpy and pytest)")
set(_pyenv
  "MEMCUDA_LIBRARY=$<TARGET_FILE:memcuda_c>"
  "MEMCUDA_TEST_WORKER=$<TARGET_FILE:memcuda_test_worker>"
  "PYTHONPATH=${PROJECT_SOURCE_DIR}/python"
  "PYTHONDONTWRITEBYTECODE=1")
if(TARGET memcuda_cli)
  list(APPEND _pyenv "MEMCUDA_CLI=$<TARGET_FILE:memcuda_cli>")
endif()
foreach(kind cpu gpu)
  add_test(NAME python_${kind} COMMAND ${MEMCUDA_PYTHON} ${PROJECT_SOURCE_DIR}/python/tests/ctest_runner.py ${kind})
  set_tests_properties(python_${kind} PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77 ENVIRONMENT "${_pyenv}")
endforeach()
# The suite drives memcuda_test_worker and the memcuda CLI, which `all`
# builds; a test whose program is missing reports itself skipped.

# The Python benchmarks (benchmarks/python/run.sh) on CPU tensors and the host
# backend with small sizes: a functional check of the scripts and of their
# baselines, not a measurement (the GPU host runs them with --device cuda).
# Skipped (77) when this interpreter has no torch.
add_test(NAME python_bench_smoke
  COMMAND bash ${PROJECT_SOURCE_DIR}/benchmarks/python/run.sh --device cpu --scale 0.0003 --repeat 1 --warmup 0
          --get-repeat 5 --bytes 4096 --python ${MEMCUDA_PYTHON} --budget 280)
set_tests_properties(python_bench_smoke PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77 ENVIRONMENT "${_pyenv}")

# The typed session of examples/python (a PyTorch producer and a consumer in
# two "shells"), on CPU tensors and the host backend; the GPU host runs
# examples/python/session.sh itself (cuda when it has a GPU). Skipped (77)
# when this interpreter has no torch.
add_test(NAME python_session
  COMMAND bash ${PROJECT_SOURCE_DIR}/examples/python/session.sh --device cpu --python ${MEMCUDA_PYTHON})
set_tests_properties(python_session PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77 ENVIRONMENT "${_pyenv}")

# pip install ./python in a fresh venv, from a copy of the sources (nothing
# built before is reused; setup.py builds libmemcuda_c itself, through ccache
# when present), then a round trip between two processes of that venv.
# Skipped (77) without python3-venv, pip, setuptools, wheel or redis-server.
add_test(NAME python_pip_install COMMAND ${MEMCUDA_PYTHON} ${PROJECT_SOURCE_DIR}/python/tests/pip_install_check.py)
set_tests_properties(python_pip_install PROPERTIES TIMEOUT 900 SKIP_RETURN_CODE 77 LABELS packaging
                     ENVIRONMENT "PYTHONDONTWRITEBYTECODE=1")

# tests/arrow_consumer.c: an Arrow consumer written from the specification
# (tests/arrow_spec.h, no Arrow library), driven by tests/test_arrow.cpp as
# a process of its own; it sits next to memcuda_tests, where helper programs
# are looked for.
add_executable(memcuda_arrow_consumer ${PROJECT_SOURCE_DIR}/tests/arrow_consumer.c)
set_target_properties(memcuda_arrow_consumer PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF
                      RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
target_compile_options(memcuda_arrow_consumer PRIVATE -Wall -Wextra -pedantic)
target_link_libraries(memcuda_arrow_consumer PRIVATE memcuda_c)
if(TARGET memcuda_tests)
  add_dependencies(memcuda_tests memcuda_arrow_consumer)
endif()
# tests/c_api_model_ab_test.c: the A/B model versions of the C ABI.
add_executable(memcuda_c_api_model_ab_test ${PROJECT_SOURCE_DIR}/tests/c_api_model_ab_test.c)
set_target_properties(memcuda_c_api_model_ab_test PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
target_compile_options(memcuda_c_api_model_ab_test PRIVATE -Wall -Wextra -pedantic)
target_link_libraries(memcuda_c_api_model_ab_test PRIVATE memcuda_c)
add_test(NAME c_api_model_ab COMMAND sh ${PROJECT_SOURCE_DIR}/tests/c_api_with_redis.sh $<TARGET_FILE:memcuda_c_api_model_ab_test>)
set_tests_properties(c_api_model_ab PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)

# Every header of the C ABI compiles on its own as C99, twice in one unit
# (memcuda.h includes the others; each of them includes only common.h).
file(GLOB _c_headers CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/include/memcuda/c/*.h)
set(_c_hc_sources)
foreach(header IN LISTS _c_headers)
  string(MAKE_C_IDENTIFIER "${header}" id)
  file(CONFIGURE OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/c_header_check/${id}.c
       CONTENT "/* Generated by src/c_api/tests.cmake: ${header} must compile on its own. */\n#include <${header}>\n#include <${header}>\n" @ONLY)
  list(APPEND _c_hc_sources ${CMAKE_CURRENT_BINARY_DIR}/c_header_check/${id}.c)
endforeach()
add_library(memcuda_c_header_check OBJECT ${_c_hc_sources})
target_include_directories(memcuda_c_header_check PRIVATE ${PROJECT_SOURCE_DIR}/include)
set_target_properties(memcuda_c_header_check PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
target_compile_options(memcuda_c_header_check PRIVATE -Wall -Wextra -Werror -pedantic)
