# cmake -DATTN_BUILD_DIR=… -DPREFIX=… -DPY_DIR=… -DPYTHON=… [-DPYTHON_LAUNCHER=…] -P install_import.cmake
# Installs the build into PREFIX (fresh) and imports the installed package (attn and attn.torch)
# from elsewhere, PYTHON run through PYTHON_LAUNCHER when given (tests/CMakeLists.txt).
file(REMOVE_RECURSE ${PREFIX})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${ATTN_BUILD_DIR} --prefix ${PREFIX}
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${rc})")
endif()
set(code "import attn, numpy as np, sys
assert attn.__file__.startswith(sys.argv[1]), attn.__file__
o = attn.sdpa(np.eye(3, 4, dtype=np.float32), np.eye(5, 4, dtype=np.float32), np.ones((5, 2), np.float32))
assert o.shape == (3, 2) and np.allclose(o, 1.0), o
import attn.torch, torch
t = attn.torch.scaled_dot_product_attention(torch.eye(3, 4), torch.eye(5, 4), torch.ones(5, 2))
assert isinstance(t, torch.Tensor) and torch.allclose(t, torch.ones(3, 2)), t
print('installed attn', attn.__version__, attn.__file__)")
execute_process(COMMAND ${CMAKE_COMMAND} -E env PYTHONPATH=${PREFIX}/${PY_DIR} PYTHONDONTWRITEBYTECODE=1
                        ${PYTHON_LAUNCHER} ${PYTHON} -c "${code}" ${PREFIX}/${PY_DIR}
                WORKING_DIRECTORY ${PREFIX} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "import of the installed attn module failed (${rc})")
endif()
