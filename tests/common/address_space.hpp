// For death-test children that must run out of memory on purpose (sanitized builds skip them).
#pragma once

// Defined where a sanitizer owns the memory (ASan, or TSan: -DATTN_SANITIZE=ON or thread): its
// shadow memory cannot live under an address space limit, and its allocator ends the process
// instead of failing an allocation. GCC says so with __SANITIZE_*__, clang with __has_feature.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ATTN_TEST_SANITIZED_MEMORY 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define ATTN_TEST_SANITIZED_MEMORY 1
#endif
#endif

#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>

namespace attn::test {

// Lowers the soft RLIMIT_AS to the address space the process uses now plus `headroom` bytes
// (the soft limit only: it can be raised again without privileges) and returns the previous
// limit, to restore. Exits with status 5 when the limit cannot be set: the caller's death test
// then fails as "no limit", never passes by accident.
inline rlimit limit_address_space(unsigned long headroom) {
    long pages = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
        if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
        std::fclose(f);
    }
    rlimit was{};
    if (pages == 0 || getrlimit(RLIMIT_AS, &was) != 0) std::exit(5);
    rlimit r = was;
    r.rlim_cur = static_cast<rlim_t>(pages) * 4096 + headroom;
    if (was.rlim_max != RLIM_INFINITY && r.rlim_cur > was.rlim_max) std::exit(5);
    if (setrlimit(RLIMIT_AS, &r) != 0) std::exit(5);
    return was;
}

}  // namespace attn::test
