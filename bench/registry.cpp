// The shape ids of ../shared/bench-shapes.md and what measures each. A feature that adds a
// measurement replaces its "not available" entry here with a runner (see harness.hpp).
#include "harness.hpp"

namespace attn::bench {
namespace {

BenchCase not_built(std::string id, std::string variant, std::string what, std::string shape, std::string needs) {
    BenchCase c;
    c.id = std::move(id);
    c.variant = std::move(variant);
    c.what = std::move(what);
    c.shape = std::move(shape);
    c.unavailable = "not available in this build: " + std::move(needs);
    return c;
}

}  // namespace

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
    cases.push_back(not_built("S5", "", "decode step (KV cache)", "B=1 Hq=32 Hkv=32 Lq=1 Lk=16384 D=128",
                              "needs the KV cache and decode kernel (issue 6)"));
    cases.push_back(not_built("S6", "", "MHA module, BERT-base", "B=4 h=12 L=512 E=768 (with projections)",
                              "needs attn::MultiHeadAttention (issue 4)"));
    cases.push_back(not_built("S7", "", "GQA decode", "B=1 Hq=32 Hkv=8 Lq=1 Lk=16384 D=128",
                              "needs the KV cache and decode kernel (issue 6)"));
    cases.push_back(sdpa_forward_case({"S8", "long causal memory", 1, 8, 8, 32768, 32768, 64, 64, Causal::top_left, true}));
    return cases;
}

}  // namespace attn::bench
