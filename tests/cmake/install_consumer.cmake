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
          "${prefix}/include/attn/heatmap.hpp" "${prefix}/include/attn/threads.hpp"
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
# attn::viz links and draws (its header, attn/heatmap.hpp, is installed).
step("run the heatmap consumer" "${build}/attn_consumer_viz")
if(NOT step_output MATCHES "consumer_viz: png [0-9]+x[0-9]+ ok")
  file(REMOVE_RECURSE "${WORK_DIR}")
  message(FATAL_ERROR "unexpected consumer_viz output: ${step_output}")
endif()
# attn/ring.hpp is installed exactly when attn::dist is, and then it links and runs (one rank,
# no mpirun; OpenMPI wants the two variables when the test runs as root).
set(ring_header "${prefix}/include/attn/ring.hpp")
if(EXISTS "${build}/attn_consumer_ring")
  step("run the ring consumer" ${CMAKE_COMMAND} -E env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
       "${build}/attn_consumer_ring")
  if(NOT step_output MATCHES "consumer_ring: ok")
    file(REMOVE_RECURSE "${WORK_DIR}")
    message(FATAL_ERROR "unexpected consumer_ring output: ${step_output}")
  endif()
elseif(EXISTS "${ring_header}")
  file(REMOVE_RECURSE "${WORK_DIR}")
  message(FATAL_ERROR "attn/ring.hpp is installed but find_package(attn) has no attn::dist to link it")
endif()
# Without cairo/pango (pkg-config finds nothing), a project of attn::attn alone configures,
# builds and runs; asking for the viz component fails in find_package.
set(core_build "${WORK_DIR}/build-core")
step("configure attn::attn alone without pkg-config's packages" ${CMAKE_COMMAND} -E env PKG_CONFIG_LIBDIR=/nonexistent
     ${CMAKE_COMMAND} -S "${CONSUMER_SOURCE_DIR}" -B "${core_build}" -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Release
     -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
     -DATTN_CONSUMER_CORE_ONLY=ON)
step("build attn::attn alone" ${CMAKE_COMMAND} --build "${core_build}")
step("run attn::attn alone" "${core_build}/attn_consumer")
execute_process(COMMAND ${CMAKE_COMMAND} -E env PKG_CONFIG_LIBDIR=/nonexistent
                ${CMAKE_COMMAND} -S "${CONSUMER_SOURCE_DIR}" -B "${WORK_DIR}/build-viz" -G "${GENERATOR}"
                -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
                -DATTN_CONSUMER_CORE_ONLY=ON -DATTN_CONSUMER_REQUIRE_VIZ=ON
                RESULT_VARIABLE viz_rc OUTPUT_VARIABLE viz_out ERROR_VARIABLE viz_err)
if(viz_rc EQUAL 0)
  file(REMOVE_RECURSE "${WORK_DIR}")
  message(FATAL_ERROR "find_package(attn COMPONENTS viz) succeeded without cairo/pango:\n${viz_out}")
endif()
# ... and its error names the component and what it needs.
if(NOT viz_err MATCHES "missing components: viz needs pkg-config to find pangocairo")
  file(REMOVE_RECURSE "${WORK_DIR}")
  message(FATAL_ERROR "find_package(attn COMPONENTS viz) failed without naming what viz needs:\n${viz_err}")
endif()
# The installed CLI runs too.
step("run the installed attn" "${prefix}/bin/attn" --version)
# ... and `attn bench` takes its PyTorch baseline from the prefix, not from the source tree it was
# built from (gone where attn is installed as a package).
set(script "${prefix}/share/attn/torch_attention.py")
if(NOT EXISTS "${script}")
  file(REMOVE_RECURSE "${WORK_DIR}")
  message(FATAL_ERROR "not installed: ${script}")
endif()
step("the installed attn bench --help" "${prefix}/bin/attn" bench --help)
string(FIND "${step_output}" "--torch-script TEXT=${script}" at)
if(at EQUAL -1)
  file(REMOVE_RECURSE "${WORK_DIR}")
  message(FATAL_ERROR "the installed attn bench does not default to the installed ${script}:\n${step_output}")
endif()

file(REMOVE_RECURSE "${WORK_DIR}")
