// The shape ids of bench/shapes.md and what measures each (runners: harness.hpp).
// A shape whose feature is not built gets a BenchCase with `unavailable` set, which the
// report prints as "not available in this build" instead of a number.
#include "harness.hpp"

namespace attn::bench {
std::vector<BenchCase> all_cases() {
    std::vector<BenchCase> cases;
    const SdpaShape s1{"S1", "prefill", 1, 16, 16, 1024, 1024, 64, 64, Causal::none, false};
    const SdpaShape s3{"S3", "causal prefill", 1, 16, 16, 4096, 4096, 128, 128, Causal::top_left, false};
    cases.push_back(sdpa_forward_case(s1));
    cases.push_back(sdpa_forward_backward_case(s1));
    cases.push_back(sdpa_forward_case({"S2", "long prefill", 1, 16, 16, 4096, 4096, 64, 64, Causal::none, false}));
    cases.push_back(sdpa_forward_case(s3));
    cases.push_back(sdpa_forward_backward_case(s3));
    cases.push_back(sdpa_forward_case({"S4", "cross-attention", 2, 8, 8, 512, 4096, 64, 64, Causal::none, false}));
    // Decode (bench/decode_cases.cpp) and the MHA layer (bench/mha_cases.cpp).
    cases.push_back(decode_case("S5"));
    cases.push_back(mha_s6_case());
    cases.push_back(decode_case("S7"));
    for (BenchCase& c : serving_cases()) cases.push_back(std::move(c));  // V1, P5, P7, P2 (bench/serving_cases.cpp)
    cases.push_back(sdpa_forward_case({"S8", "long causal memory", 1, 8, 8, 32768, 32768, 64, 64, Causal::top_left, true}));
    cases.back().slow = true;
    return cases;
}

}  // namespace attn::bench
