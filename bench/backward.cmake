# Included from the top-level CMakeLists (kept apart from bench/CMakeLists.txt to merge cleanly). attn_backward_bench: the backward on S1/S3 vs torch autograd.
add_library(attn_bench_backward STATIC ${CMAKE_CURRENT_LIST_DIR}/backward_bench.cpp ${CMAKE_CURRENT_LIST_DIR}/fma_peak_avx2.cpp)
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/fma_peak_avx2.cpp PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma")
target_link_libraries(attn_bench_backward PUBLIC attn::attn PRIVATE attn_warnings)
target_include_directories(attn_bench_backward PUBLIC ${CMAKE_CURRENT_LIST_DIR})
add_executable(attn_backward_bench ${CMAKE_CURRENT_LIST_DIR}/backward_bench_main.cpp)
target_compile_definitions(attn_backward_bench PRIVATE ATTN_TORCH_SCRIPT="${CMAKE_CURRENT_LIST_DIR}/torch_backward.py")
target_link_libraries(attn_backward_bench PRIVATE attn_bench_backward attn_warnings)
