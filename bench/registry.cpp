// The shape ids of bench/shapes.md and what measures each (runners: harness.hpp).
// A shape whose feature is not built gets a BenchCase with `unavailable` set, which the
// report prints as "not available in this build" instead of a number.
#include <utility>

#include "harness.hpp"

namespace attn::bench {
std::vector<BenchCase> all_cases() {
    std::vector<BenchCase> cases;
    SdpaShape s1{"S1", "prefill", 1, 16, 16, 1024, 1024, 64, 64, Causal::none, false};
    const SdpaShape s3{"S3", "causal prefill", 1, 16, 16, 4096, 4096, 128, 128, Causal::top_left, false};
    cases.push_back(sdpa_forward_case(s1));
    // Score modifiers (issue 13) beside the plain rows, as ratios with the targets.
    s1.modifier_rows = {{"softcap", 1.2}};
    cases.push_back(sdpa_forward_backward_case(s1));
    SdpaShape s2{"S2", "long prefill", 1, 16, 16, 4096, 4096, 64, 64, Causal::none, false};
    s2.modifier_rows = {{"softcap", 1.15}, {"alibi", 1.10}, {"sinks", 1.02}};
    cases.push_back(sdpa_forward_case(s2));
    cases.push_back(sdpa_forward_case(s3));
    cases.push_back(sdpa_forward_backward_case(s3));
    // 16-bit storage on S2/S3 (issue 14): f16 / bf16 K/V with f32 Q (a 16-bit cache), and all-bf16;
    // read with the f32 rows above (target: f16/bf16 K/V <= 1.10x the f32 time on AVX2).
    for (const SdpaShape& base : {s2, s3})
        for (auto [qd, kvd] : {std::pair{DType::f32, DType::f16}, std::pair{DType::f32, DType::bf16},
                               std::pair{DType::bf16, DType::bf16}}) {
            SdpaShape x = base;
            x.q_dtype = qd;
            x.kv_dtype = kvd;
            x.modifier_rows = {};  // the modifier ratios are read on the f32 rows
            cases.push_back(sdpa_forward_case(x));
        }
    cases.push_back(sdpa_forward_case({"S4", "cross-attention", 2, 8, 8, 512, 4096, 64, 64, Causal::none, false}));
    // Decode (bench/decode_cases.cpp) and the MHA layer (bench/mha_cases.cpp).
    cases.push_back(decode_case("S5"));
    cases.push_back(mha_s6_case());
    cases.push_back(decode_case("S7"));
    for (BenchCase& c : serving_cases()) cases.push_back(std::move(c));  // V1, P5, P7, P2 (bench/serving_cases.cpp)
    SdpaShape s8{"S8", "long causal memory", 1, 8, 8, 32768, 32768, 64, 64, Causal::top_left, true};
    cases.push_back(sdpa_forward_case(s8));
    cases.back().slow = true;
    // All-bf16 S8 (issue 14): its peak RSS is read against the f32 row's (target <= 0.6x,
    // scripts/bench-to-markdown.py's TARGETS).
    s8.q_dtype = s8.kv_dtype = DType::bf16;
    cases.push_back(sdpa_forward_case(s8));
    cases.back().slow = true;
    return cases;
}

}  // namespace attn::bench
