# Writes OUT with the `git describe` of SRC; rewrites it only when the text changes, so an
# unchanged commit does not trigger a rebuild. Run on every build by attn_bench_git_describe.
execute_process(COMMAND git -C "${SRC}" describe --always --dirty --tags
                OUTPUT_VARIABLE describe RESULT_VARIABLE rc
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT rc EQUAL 0 OR describe STREQUAL "")
  set(describe "unknown")
endif()
set(text "// Generated at build time by bench/git_describe.cmake.\n#pragma once\n#define ATTN_BENCH_GIT_DESCRIBE \"${describe}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
  if(old STREQUAL text)
    return()
  endif()
endif()
file(WRITE "${OUT}" "${text}")
