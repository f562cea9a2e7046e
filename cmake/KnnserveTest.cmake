include(GoogleTest)

# knnserve_add_test(NAME name SOURCES a_test.cc ... LIBS lib ...)
# One gtest binary per folder keeps link time down on 2-core machines; every TEST becomes its
# own ctest case through gtest_discover_tests.
# Test binaries link knnserve_test_main (tests/testing/test_main.cc) instead of gtest_main.
function(knnserve_add_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_LIBS} knnserve_test_main)
  set_target_properties(${ARG_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY
                                               ${CMAKE_BINARY_DIR}/tests)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  gtest_discover_tests(${ARG_NAME}
    DISCOVERY_TIMEOUT 60
    PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${ARG_LABELS}"
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
endfunction()
