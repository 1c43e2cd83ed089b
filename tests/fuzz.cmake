# CTest runs of the libFuzzer targets that fuzz/CMakeLists.txt built
# (docs/fuzzing.md). For each target, label "fuzz":
#   <target>_corpus  replays the committed corpus fuzz/corpus/<target> once
#                    (-runs=0), crash reproducers included;
#   <target>         fuzzes for MEMCUDA_FUZZ_SECONDS (12) seconds, starting
#                    from a fresh copy of that corpus;
#   <target>_known-<issue>  for each reproducer fuzz/corpus/<target>/known-<issue>
#                    of an issue not fixed yet: runs it with MEMCUDA_FUZZ_STRICT=1
#                    and passes while the issue is still there (its signature
#                    below is in the output). Once include/ is fixed it fails:
#                    delete the issue's predicate in fuzz/fuzz_support.hpp, its
#                    line below, and rename the file (docs/fuzzing.md).
# Both work under <build>/fuzz-runs/; the source tree is never written.
# Where fuzz/ built nothing (no clang or fuzzer runtime; it said why) no test
# is registered, and a STATUS line says so.
#
# The same file is the script the tests run (cmake -P, below), so that the
# copy, the run and the report need no shell.

if(NOT CMAKE_SCRIPT_MODE_FILE)
  get_property(_fuzz_targets GLOBAL PROPERTY MEMCUDA_FUZZ_TARGETS)
  if(NOT _fuzz_targets)
    if(MEMCUDA_BUILD_FUZZERS)
      message(STATUS "memcuda: no fuzz tests: the fuzzers are not built (see the fuzzers line above)")
    else()
      message(STATUS "memcuda: no fuzz tests: MEMCUDA_BUILD_FUZZERS is OFF")
    endif()
    return()
  endif()
  set(MEMCUDA_FUZZ_SECONDS 12 CACHE STRING "Seconds each fuzz test fuzzes for")
  # What each known issue prints when the checks are strict.
  set(_known_strides-overflow "runtime error: signed integer overflow")
  set(_known_url-scheme-echo "control byte in the message")
  set(_known_url-user-echo "control byte in the message")
  set(_known_record-alloc-bytes-absent "encode_record wrote a Hash that decode_record rejects")
  foreach(name IN LISTS _fuzz_targets)
    get_property(_bin GLOBAL PROPERTY MEMCUDA_FUZZ_${name}_BINARY)
    get_property(_corpus GLOBAL PROPERTY MEMCUDA_FUZZ_${name}_CORPUS)
    get_property(_dict GLOBAL PROPERTY MEMCUDA_FUZZ_${name}_DICT)
    set(_work ${PROJECT_BINARY_DIR}/fuzz-runs)
    add_test(NAME ${name}_corpus
             COMMAND ${CMAKE_COMMAND} -DMODE=replay -DFUZZER=${_bin} -DCORPUS=${_corpus}
                     -DWORK=${_work}/${name}_corpus -P ${CMAKE_CURRENT_LIST_FILE})
    add_test(NAME ${name}
             COMMAND ${CMAKE_COMMAND} -DMODE=fuzz -DFUZZER=${_bin} -DCORPUS=${_corpus}
                     -DWORK=${_work}/${name} -DDICT=${_dict} -DSECONDS=${MEMCUDA_FUZZ_SECONDS}
                     -P ${CMAKE_CURRENT_LIST_FILE})
    set_tests_properties(${name}_corpus PROPERTIES LABELS fuzz TIMEOUT 120)
    math(EXPR _timeout "${MEMCUDA_FUZZ_SECONDS} + 120")
    set_tests_properties(${name} PROPERTIES LABELS fuzz TIMEOUT ${_timeout} PROCESSORS 1)

    file(GLOB _known RELATIVE ${_corpus} CONFIGURE_DEPENDS ${_corpus}/known-*)
    foreach(file IN LISTS _known)
      string(REGEX REPLACE "^known-" "" _issue ${file})
      if(NOT DEFINED _known_${_issue})
        message(FATAL_ERROR "${_corpus}/${file}: no signature for known issue '${_issue}' in ${CMAKE_CURRENT_LIST_FILE}")
      endif()
      file(MAKE_DIRECTORY ${_work}/known)
      add_test(NAME ${name}_${file}
               COMMAND ${_bin} -artifact_prefix=${_work}/known/ ${_corpus}/${file}
               WORKING_DIRECTORY ${_work}/known)
      set_tests_properties(${name}_${file} PROPERTIES
        LABELS fuzz TIMEOUT 60
        ENVIRONMENT "MEMCUDA_FUZZ_STRICT=1;UBSAN_OPTIONS=print_stacktrace=1"
        PASS_REGULAR_EXPRESSION "${_known_${_issue}}")
    endforeach()
  endforeach()
  return()
endif()

# ---- script mode: one run ---------------------------------------------------
#   -DMODE=replay|fuzz -DFUZZER=<binary> -DCORPUS=<committed corpus dir>
#   -DWORK=<scratch dir, emptied first> [-DDICT=<file>] [-DSECONDS=<n>]
foreach(var MODE FUZZER CORPUS WORK)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "fuzz.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT EXISTS ${FUZZER})
  message(FATAL_ERROR "${FUZZER} is not built: cmake --build <build> --target memcuda_fuzzers")
endif()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/corpus ${WORK}/artifacts)
# -timeout: a decoder taking seconds on one input of a few KiB is a hang.
set(_args -timeout=10 -rss_limit_mb=2048 -artifact_prefix=${WORK}/artifacts/)
if(MODE STREQUAL "replay")
  # Every committed input once. New inputs would go to the first directory,
  # the empty scratch one, never to the committed corpus.
  list(APPEND _args -runs=0 ${WORK}/corpus ${CORPUS})
elseif(MODE STREQUAL "fuzz")
  file(COPY ${CORPUS}/ DESTINATION ${WORK}/corpus)
  if(NOT SECONDS)
    set(SECONDS 12)
  endif()
  list(APPEND _args -max_total_time=${SECONDS} -print_final_stats=1)
  if(DICT AND EXISTS ${DICT})
    list(APPEND _args -dict=${DICT})
  endif()
  list(APPEND _args ${WORK}/corpus)
else()
  message(FATAL_ERROR "fuzz.cmake: MODE must be replay or fuzz, not '${MODE}'")
endif()
set(ENV{UBSAN_OPTIONS} "print_stacktrace=1")
string(REPLACE ";" " " _shown "${_args}")
message(STATUS "${FUZZER} ${_shown}")
execute_process(COMMAND ${FUZZER} ${_args} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  file(GLOB _found ${WORK}/artifacts/*)
  string(REPLACE ";" "\n  " _found "${_found}")
  message(FATAL_ERROR "${FUZZER} failed (exit ${rc}). Inputs that failed:\n  ${_found}\n"
                      "Reproduce with: ${FUZZER} <input>; then add the input to ${CORPUS}/ "
                      "(docs/fuzzing.md, \"Reporting a finding\").")
endif()
