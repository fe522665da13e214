# Writes OUT with the `git describe` of SRC; rewrites it only when the text changes, so an
# unchanged commit does not trigger a rebuild. Run on every build by attn_bench_git_describe.
# "-dirty" means tracked files other than BENCHMARKS.md differ from the commit: `make bench`
# rewrites BENCHMARKS.md itself, which says nothing about the code that was measured.
execute_process(COMMAND git -C "${SRC}" describe --always --tags
                OUTPUT_VARIABLE describe RESULT_VARIABLE rc
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT rc EQUAL 0 OR describe STREQUAL "")
  set(describe "unknown")
else()
  execute_process(COMMAND git -C "${SRC}" status --porcelain --untracked-files=no -- . ":(exclude)BENCHMARKS.md"
                  OUTPUT_VARIABLE changes RESULT_VARIABLE rc2 OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(rc2 EQUAL 0 AND NOT changes STREQUAL "")
    string(APPEND describe "-dirty")
  endif()
endif()
set(text "// Generated at build time by bench/git_describe.cmake.\n#pragma once\n#define ATTN_BENCH_GIT_DESCRIBE \"${describe}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
  if(old STREQUAL text)
    return()
  endif()
endif()
file(WRITE "${OUT}" "${text}")
