# cmake -P script: install the attn build tree into a temporary prefix, then configure, build
# and run tests/cmake/consumer against it with find_package(attn). Removes everything it made.
#   -DATTN_BUILD_DIR=<attn build tree>  -DCONSUMER_SOURCE_DIR=<consumer project>
#   -DWORK_DIR=<scratch dir, wiped>     -DGENERATOR=<cmake generator>  -DCXX_COMPILER=<c++>
foreach(var ATTN_BUILD_DIR CONSUMER_SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "install_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()

set(prefix "${WORK_DIR}/prefix")
set(build "${WORK_DIR}/build")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

# Runs a command; on failure prints its output, removes WORK_DIR and fails the test.
function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    file(REMOVE_RECURSE "${WORK_DIR}")
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

step("cmake --install" ${CMAKE_COMMAND} --install "${ATTN_BUILD_DIR}" --prefix "${prefix}")

# The installed tree has what a consumer needs (lib may be lib/ or lib64/).
file(GLOB config "${prefix}/lib*/cmake/attn/attnConfig.cmake")
foreach(f "${prefix}/include/attn/sdpa.hpp" "${prefix}/include/attn/tensor.hpp" "${prefix}/include/attn/version.hpp"
          "${prefix}/bin/attn")
  if(NOT EXISTS "${f}")
    file(REMOVE_RECURSE "${WORK_DIR}")
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()
if(NOT config)
  file(REMOVE_RECURSE "${WORK_DIR}")
  message(FATAL_ERROR "not installed: lib*/cmake/attn/attnConfig.cmake")
endif()

step("configure the consumer" ${CMAKE_COMMAND} -S "${CONSUMER_SOURCE_DIR}" -B "${build}" -G "${GENERATOR}"
     -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_PREFIX_PATH=${prefix}
     -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
step("build the consumer" ${CMAKE_COMMAND} --build "${build}")
step("run the consumer" "${build}/attn_consumer")
message(STATUS "consumer says: ${step_output}")
if(NOT step_output MATCHES "consumer: attn [0-9]+\\.[0-9]+\\.[0-9]+ ok")
  file(REMOVE_RECURSE "${WORK_DIR}")
  message(FATAL_ERROR "unexpected consumer output: ${step_output}")
endif()
# The installed CLI runs too.
step("run the installed attn" "${prefix}/bin/attn" --version)

file(REMOVE_RECURSE "${WORK_DIR}")
