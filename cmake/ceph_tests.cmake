# SPDX-License-Identifier: Apache-2.0
# The [ceph] tests of a Catch2 test binary: they run against the one Ceph test
# cluster of a CTest run (scripts/ceph-micro.sh), which the fixture tests
# storage:ceph-cluster-start / -stop (storage/tests/CMakeLists.txt) start before
# the first of them and stop after the last; each finds it through CDP_CEPH_DIR
# (storage/tests/ceph_cluster.h). Labels: e2e and ceph (ctest -L ceph).
#
#   cdp_discover_ceph_tests(TARGET PREFIX SPEC [TIMEOUT seconds] [RUN_SERIAL])
set(CDP_CEPH_TEST_DIR ${CMAKE_BINARY_DIR}/storage/tests/ceph-cluster)

function(cdp_discover_ceph_tests target prefix spec)
  cmake_parse_arguments(arg "RUN_SERIAL" "TIMEOUT" "" ${ARGN})
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 600)
  endif()
  set(serial "")
  if(arg_RUN_SERIAL)
    set(serial RUN_SERIAL TRUE)
  endif()
  catch_discover_tests(${target} EXTRA_ARGS --warn NoTests TEST_PREFIX "${prefix}" TEST_SPEC "${spec}"
                       TEST_LIST ${target}_ceph_tests
                       PROPERTIES TIMEOUT ${arg_TIMEOUT} ${serial} FIXTURES_REQUIRED ceph_cluster
                       ENVIRONMENT "CDP_CEPH_DIR=${CDP_CEPH_TEST_DIR}")
  # Two labels: a list value cannot pass through catch_discover_tests' PROPERTIES, so
  # they are set by a CTest script read after the discovered list (which names the tests).
  set(script ${CMAKE_CURRENT_BINARY_DIR}/${target}_ceph_labels.cmake)
  file(WRITE ${script}
       "if(${target}_ceph_tests)\n  set_tests_properties(\${${target}_ceph_tests} PROPERTIES LABELS \"e2e;ceph\")\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${script})
endfunction()
