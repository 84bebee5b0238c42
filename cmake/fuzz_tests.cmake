# SPDX-License-Identifier: Apache-2.0
# Short runs of every libFuzzer target (fuzz/targets.cmake) in CTest: fuzz.<name>,
# LABELS fuzz. libFuzzer needs clang, so the targets come from a second build of
# this tree with clang and -DCDP_FUZZ=ON in ${CMAKE_BINARY_DIR}/fuzz-clang (an
# ExternalProject whose `all` is only the fuzz targets, the libraries they link
# and their seed corpora). Each test runs its target CDP_FUZZ_TEST_RUNS times
# from the seed corpus (cmake/run_fuzz.cmake). Without clang and libFuzzer no
# fuzz test is registered, and configure says so with a warning.
option(CDP_FUZZ_TESTS "Build the fuzz targets with clang and run each briefly in CTest" ON)
set(CDP_FUZZ_TEST_RUNS 20000 CACHE STRING "libFuzzer -runs of each fuzz.<name> test")
if(NOT CDP_FUZZ_TESTS)
  return()
endif()

find_program(CDP_FUZZ_CLANG NAMES clang clang-14)
find_program(CDP_FUZZ_CLANGXX NAMES clang++ clang++-14)
if(NOT CDP_FUZZ_CLANG OR NOT CDP_FUZZ_CLANGXX)
  message(WARNING "clang++ not found: fuzz targets not built, no fuzz.* tests registered "
                  "(scripts/install-deps.sh installs clang)")
  return()
endif()

# clang without the libFuzzer runtime (Debian: libclang-rt-14-dev) cannot link them.
if(NOT DEFINED CACHE{CDP_FUZZ_LIBFUZZER_OK})
  set(probe_dir ${CMAKE_BINARY_DIR}/CMakeFiles/libfuzzer-probe)
  file(WRITE ${probe_dir}/probe.cc
       "#include <cstddef>\n#include <cstdint>\n"
       "extern \"C\" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n")
  execute_process(COMMAND ${CDP_FUZZ_CLANGXX} -fsanitize=fuzzer,address,undefined probe.cc -o probe
                  WORKING_DIRECTORY ${probe_dir} RESULT_VARIABLE probe_rc OUTPUT_QUIET ERROR_QUIET)
  if(probe_rc EQUAL 0)
    set(CDP_FUZZ_LIBFUZZER_OK ON CACHE INTERNAL "clang links -fsanitize=fuzzer")
  else()
    set(CDP_FUZZ_LIBFUZZER_OK OFF CACHE INTERNAL "clang links -fsanitize=fuzzer")
  endif()
endif()
if(NOT CDP_FUZZ_LIBFUZZER_OK)
  message(WARNING "${CDP_FUZZ_CLANGXX} cannot link -fsanitize=fuzzer,address,undefined: fuzz targets "
                  "not built, no fuzz.* tests registered (scripts/install-deps.sh installs libclang-rt)")
  return()
endif()

include(ExternalProject)
set(CDP_FUZZ_BUILD_DIR ${CMAKE_BINARY_DIR}/fuzz-clang)
ExternalProject_Add(cdp_fuzz_clang
  SOURCE_DIR ${CMAKE_SOURCE_DIR}
  BINARY_DIR ${CDP_FUZZ_BUILD_DIR}
  CMAKE_ARGS -DCMAKE_C_COMPILER=${CDP_FUZZ_CLANG} -DCMAKE_CXX_COMPILER=${CDP_FUZZ_CLANGXX}
             -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCDP_FUZZ=ON -DCDP_WERROR=${CDP_WERROR} -DBUILD_TESTING=OFF
             # Short runs need coverage, not speed: a quicker compile, and assertions on.
             "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only"
             "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only"
  INSTALL_COMMAND ""
  BUILD_ALWAYS ON)  # its own make decides what is out of date

include(${CMAKE_SOURCE_DIR}/fuzz/targets.cmake)
foreach(t IN LISTS CDP_FUZZ_TARGETS)
  add_test(NAME fuzz.${t}
           COMMAND ${CMAKE_COMMAND} -DFUZZER=${CDP_FUZZ_BUILD_DIR}/fuzz/${t}_fuzz
                   -DSEEDS=${CDP_FUZZ_BUILD_DIR}/fuzz/seeds/${t} -DWORK=${CMAKE_BINARY_DIR}/fuzz-work/${t}
                   -DRUNS=${CDP_FUZZ_TEST_RUNS} -P ${CMAKE_SOURCE_DIR}/cmake/run_fuzz.cmake)
  set_tests_properties(fuzz.${t} PROPERTIES LABELS fuzz TIMEOUT 300)
endforeach()
