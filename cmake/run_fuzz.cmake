# SPDX-License-Identifier: Apache-2.0
# One short libFuzzer run, for CTest (cmake/fuzz_tests.cmake):
#   cmake -DFUZZER=<binary> -DSEEDS=<seed dir> -DWORK=<scratch dir> -DRUNS=<n> -P run_fuzz.cmake
# New corpus entries and any reproducer (crash-*, leak-*, oom-*, timeout-*) go
# to WORK, which is emptied first; the seed corpus is only read. A fixed
# -seed makes the run repeatable. Fails on any finding.
foreach(v FUZZER SEEDS WORK RUNS)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_fuzz.cmake: -D${v}= is required")
  endif()
endforeach()
if(NOT EXISTS ${FUZZER} OR NOT IS_DIRECTORY ${SEEDS})
  message(FATAL_ERROR "run_fuzz.cmake: ${FUZZER} or ${SEEDS} missing (is the fuzz-clang build done?)")
endif()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
execute_process(COMMAND ${FUZZER} -runs=${RUNS} -seed=1 -rss_limit_mb=1024 -timeout=30
                        -artifact_prefix=${WORK}/ ${WORK} ${SEEDS}
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${FUZZER} failed (exit ${rc}); reproducer in ${WORK}/")
endif()
