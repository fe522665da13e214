// S6 of bench/shapes.md in `attn bench`: the MHA layer, BERT-base (B=4, L=512, E=768,
// h=12, self-attention, batch_first, no mask, need_weights=false), timed through the
// parts of bench/mha/mha_s6.hpp. Two entries: the forward beside torch's
// nn.MultiheadAttention (bench/torch_attention.py --mode mha: eval, inference_mode, its
// fused fast path), and the forward's parts — the QKV and output projection GEMMs, the
// attention, and a square GEMM of the QKV GEMM's FLOPs on the same GEMM (src/gemm): the rate
// the projections are judged against (a skinny GEMM below it is the GEMM's shape penalty);
// and OpenBLAS on the QKV and square GEMMs in the same process, the former path's yardstick.
// FLOP (written formula, multiply-add = 2): projections 2·(B·L)·E·4E, attention 4·B·h·L²·d_h.
#include <string>

#include "harness.hpp"
#include "mha_s6.hpp"
#include "openblas.hpp"

namespace attn::bench {
namespace {

Row time_part(const Context& ctx, const std::string& name, double flop, const std::function<void()>& fn) {
    Row r;
    r.impl = name;
    r.flop = flop;
    time_calls_into(ctx.cfg, r, fn);
    return r;
}

// An OpenBLAS row, skipped with the loader's reason where OpenBLAS cannot be loaded.
Row time_openblas_part(const Context& ctx, const std::string& name, double flop, const std::function<void()>& fn) {
    const std::string why = openblas_unavailable();
    if (why.empty()) return time_part(ctx, name, flop, fn);
    Row r;
    r.impl = name;
    r.flop = flop;
    r.status = "skipped";
    r.note = "OpenBLAS cannot be loaded: " + why;
    return r;
}

void run_s6(const Context& ctx, std::vector<CaseResult>& out) {
    const MhaS6Shape shape;  // B=4 L=512 E=768 h=12
    MhaS6 s6(shape);
    const std::string sizes = "B=4 h=12 L=512 E=768";
    nlohmann::json params = {{"B", shape.B}, {"L", shape.L}, {"E", shape.E}, {"heads", shape.h}};

    CaseResult fwd;
    fwd.id = "S6";
    fwd.what = "MHA module, BERT-base";
    fwd.shape = sizes + " (with projections)";
    fwd.params = params;
    fwd.flop = s6.flop_forward();
    const std::string fwd_formula = "2·(B·L)·E·3E (QKV) + 4·B·h·L²·d_h (attention) + 2·(B·L)·E·E (out)";
    fwd.flop_formula = fwd_formula;
    fwd.io_bytes = 2 * shape.B * shape.L * shape.E * 4;
    Row attn = time_part(ctx, "attn", fwd.flop, [&] { s6.forward(); });
    attn.kernel = s6.attention_kernel().empty() ? "" : "sdpa: " + s6.attention_kernel();
    fwd.rows.push_back(std::move(attn));
    Row torch = run_torch(ctx, {{"mode", "mha"}, {"B", std::to_string(shape.B)}, {"L", std::to_string(shape.L)},
                                {"E", std::to_string(shape.E)}, {"heads", std::to_string(shape.h)}});
    torch.flop = fwd.flop;
    fwd.rows.push_back(std::move(torch));
    const double f32_median = fwd.rows.front().status == "ok" ? fwd.rows.front().timing.median_s : 0.0;
    out.push_back(std::move(fwd));

    // The same layer with bfloat16 weights, input and output (issue 14): its QKV GEMM has both
    // operands in bf16 and runs on bf16 pairs where the CPU has AVX-512 BF16 (src/gemm/gemm.hpp);
    // the attention and the out projection stay float32 (the layer's contract, docs/conventions.md)
    // — unless the intermediates are bfloat16 too (MhaForwardOptions::intermediate_dtype, PyTorch's
    // 16-bit layer), when all three products run on bf16 pairs.
    for (const bool bf16_intermediates : {false, true}) {
        MhaS6Shape bs = shape;
        bs.dtype = DType::bf16;
        if (bf16_intermediates) bs.intermediate_dtype = DType::bf16;
        MhaS6 bf(bs);
        CaseResult c;
        c.id = "S6";
        c.variant = bf16_intermediates ? "weights/input/output/intermediates bfloat16" : "weights/input/output bfloat16";
        c.what = "MHA module, BERT-base, bfloat16 layer";
        c.shape = sizes + " (with projections)";
        c.params = params;
        c.params["dtype"] = "bfloat16";
        if (bf16_intermediates) c.params["intermediate_dtype"] = "bfloat16";
        c.flop = bf.flop_forward();
        c.flop_formula = fwd_formula;
        c.io_bytes = 2 * shape.B * shape.L * shape.E * 2;
        Row r = time_part(ctx, "attn", c.flop, [&] { bf.forward(); });
        r.kernel = bf.attention_kernel().empty() ? "" : "sdpa: " + bf.attention_kernel();
        if (r.status == "ok" && r.timing.median_s > 0 && f32_median > 0)
            c.note = format_double("%.2fx", f32_median / r.timing.median_s) + " the float32 layer's speed in this run";
        c.rows.push_back(std::move(r));
        out.push_back(std::move(c));
    }

    CaseResult parts;
    parts.id = "S6";
    parts.variant = "parts";
    parts.what = "MHA forward's parts, and a square GEMM";
    parts.shape = sizes + "; square n=" + std::to_string(s6.square_n());
    parts.params = params;
    parts.params["square_n"] = s6.square_n();
    parts.flop_formula = "per row: its own count (QKV 2·(B·L)·E·3E, out 2·(B·L)·E·E, attention 4·B·h·L²·d_h, square 2n³)";
    parts.rows.push_back(time_part(ctx, "qkv_gemm", s6.flop_qkv(), [&] { s6.qkv_projection(); }));
    parts.rows.push_back(time_part(ctx, "out_gemm", s6.flop_out(), [&] { s6.out_projection(); }));
    parts.rows.push_back(time_part(ctx, "square_gemm", s6.flop_square(), [&] { s6.square_gemm(); }));
    parts.rows.push_back(time_openblas_part(ctx, "qkv_blas", s6.flop_qkv(), [&] { s6.qkv_gemm_openblas(); }));
    parts.rows.push_back(time_openblas_part(ctx, "square_blas", s6.flop_square(), [&] { s6.square_gemm_openblas(); }));
    Row att = time_part(ctx, "attention", s6.flop_attention(), [&] { s6.attention(); });
    att.kernel = s6.attention_kernel();
    parts.rows.push_back(std::move(att));
    const Row &q = parts.rows[0], &o = parts.rows[1], &sq = parts.rows[2];
    if (q.status == "ok" && o.status == "ok" && sq.status == "ok" && q.timing.median_s > 0 && o.timing.median_s > 0) {
        const double proj_rate = (s6.flop_qkv() + s6.flop_out()) / (q.timing.median_s + o.timing.median_s);
        const double sq_rate = s6.flop_square() / sq.timing.median_s;
        parts.note = "projection GEMMs (QKV + out) at " + format_double("%.1f GFLOP/s", proj_rate * 1e-9) + " = " +
                     format_double("%.2f", proj_rate / sq_rate) + "x the square GEMM's " + format_double("%.1f GFLOP/s", sq_rate * 1e-9);
        const Row& qb = parts.rows[3];
        if (qb.status == "ok" && qb.timing.median_s > 0)
            parts.note += "; QKV GEMM " + format_double("%.2f", qb.timing.median_s / q.timing.median_s) + "x OpenBLAS's speed";
    }
    out.push_back(std::move(parts));
}

}  // namespace

BenchCase mha_s6_case() {
    BenchCase bc;
    bc.id = "S6";
    bc.what = "MHA module, BERT-base";
    bc.shape = "B=4 h=12 L=512 E=768 (with projections)";
    bc.run = [](const Context& ctx, std::vector<CaseResult>& out) { run_s6(ctx, out); };
    return bc;
}

}  // namespace attn::bench
