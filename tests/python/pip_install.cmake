# cmake -DSOURCE_DIR=… -DATTN_BUILD_DIR=… -DWORK=… -DPYTHON=… [-DPYTHON_LAUNCHER=…] -P pip_install.cmake
# `pip install --no-build-isolation <source>` into a fresh venv (--system-site-packages: numpy
# and torch come from Debian) reusing the configured build tree, then imports attn and
# attn.torch from that venv, outside the source and build trees; the Python that imports it run
# through PYTHON_LAUNCHER when given (tests/CMakeLists.txt) — not pip, which imports no attn: the
# sanitizer runtime preloaded there reached setup.py's cmake and ninja too.
file(REMOVE_RECURSE ${WORK})
execute_process(COMMAND ${PYTHON} -m venv --system-site-packages ${WORK}/venv RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "python -m venv failed (${rc}); Debian: apt-get install python3-venv")
endif()
# pip builds in tree; setuptools' build/ and egg-info go under WORK (ATTN_SETUP_WORK, setup.py).
execute_process(COMMAND ${CMAKE_COMMAND} -E env ATTN_CMAKE_BUILD_DIR=${ATTN_BUILD_DIR} ATTN_SETUP_WORK=${WORK}/setup
                        PIP_NO_INDEX=1 ${WORK}/venv/bin/python -m pip install --no-build-isolation --no-deps -q
                        ${SOURCE_DIR}
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pip install --no-build-isolation failed (${rc})")
endif()
set(code "import sys, attn, attn.torch, torch
assert attn.__file__.startswith(sys.prefix), (attn.__file__, sys.prefix)
t = attn.torch.scaled_dot_product_attention(torch.eye(3, 4), torch.eye(5, 4), torch.ones(5, 2))
assert isinstance(t, torch.Tensor) and torch.allclose(t, torch.ones(3, 2)), t
print('pip-installed attn', attn.__version__, attn.__file__)")
if(PYTHON_LAUNCHER)  # the sanitizer's preload (tests/CMakeLists.txt): the instrumented module needs it
  string(APPEND code "\nassert 'libasan' in open('/proc/self/maps').read(), 'the sanitizer runtime is not loaded'")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=PYTHONPATH PYTHONDONTWRITEBYTECODE=1
                        ${PYTHON_LAUNCHER} ${WORK}/venv/bin/python -c "${code}"
                WORKING_DIRECTORY ${WORK} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "import of the pip-installed attn failed (${rc})")
endif()
