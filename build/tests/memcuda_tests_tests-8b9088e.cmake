add_test( [==[connection runs commands against a private server]==] /work/main/build/tests/memcuda_tests [==[connection runs commands against a private server]==]  )
set_tests_properties( [==[connection runs commands against a private server]==] PROPERTIES WORKING_DIRECTORY /work/main/build/tests TIMEOUT 300)
set( memcuda_tests_TESTS [==[connection runs commands against a private server]==])
