// tiny_decoder — a decoder-only transformer that learns to reverse a token sequence,
// trained from scratch on the CPU with attn's causal MultiHeadAttention (forward_train /
// backward). Everything else (embeddings, LayerNorm, MLP, cross-entropy, Adam) is plain
// loops here, written for clarity rather than speed.
//
// Task: x_1 .. x_n SEP y_1 .. y_n with y = reverse(x), tokens drawn uniformly from
// {0 .. V-1}. The model reads x_1 .. x_n SEP y_1 .. y_{n-1} (T = 2n tokens) and is trained
// to predict y_1 .. y_n at positions n .. 2n-1. Producing y_i means finding x_{n+1-i}: the
// answer is only reachable through attention (an MLP sees one position at a time).
//
// Model (pre-LayerNorm, as GPT-2):
//   h = tok_emb[token] + pos_emb[t]                                   (B, T, d)
//   per block:  h += MHA(LN1(h), causal);  h += W2·relu(W1·LN2(h) + b1) + b2
//   logits = LN_f(h)·W_outᵀ + b_out                                   (B, T, V)
//   loss = mean cross-entropy over the n answer positions
//
// Usage: tiny_decoder [--steps N (600)] [--print-every N (50)] [--seed S (1)] [--threads N (1)]
//                     [--loss-below X (0.002)] [--min-accuracy X (0.99)]
// Exit status 0 when the final loss (mean of the last 20 steps) is below --loss-below and the
// held-out accuracy (greedy decoding of whole sequences never seen in training) reaches
// --min-accuracy; 1 otherwise; 2 on bad arguments.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <set>

#include <omp.h>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/mha.hpp"

namespace {

// ---------------------------------------------------------------- hyper-parameters
constexpr int kVocab = 16;       // answer tokens 0..15
constexpr int kSep = kVocab;     // separator token
constexpr int kTokens = kVocab + 1;
constexpr int kN = 10;           // sequence length to reverse
constexpr int kT = 2 * kN;       // model input length
constexpr int kD = 48;           // model width
constexpr int kHeads = 4;
constexpr int kHidden = 4 * kD;  // MLP width
constexpr int kLayers = 2;
constexpr int kBatch = 32;

// ---------------------------------------------------------------- parameters + Adam
struct Param {
    float* w = nullptr;  // the values (owned here, or an attn layer's parameter)
    std::int64_t n = 0;
    std::vector<float> own, g, m, v;
    void init_owned(std::int64_t size) {
        own.assign(static_cast<std::size_t>(size), 0.0f);
        bind(own.data(), size);
    }
    void bind(float* data, std::int64_t size) {
        w = data;
        n = size;
        g.assign(static_cast<std::size_t>(size), 0.0f);
        m.assign(static_cast<std::size_t>(size), 0.0f);
        v.assign(static_cast<std::size_t>(size), 0.0f);
    }
};

struct Adam {
    float lr = 3e-3f, b1 = 0.9f, b2 = 0.98f, eps = 1e-8f;
    int t = 0;
    void step(std::vector<Param*>& ps) {
        ++t;
        const float c1 = 1.0f - std::pow(b1, static_cast<float>(t)), c2 = 1.0f - std::pow(b2, static_cast<float>(t));
        for (Param* p : ps) {
            for (std::int64_t i = 0; i < p->n; ++i) {
                const float g = p->g[i];
                p->m[i] = b1 * p->m[i] + (1 - b1) * g;
                p->v[i] = b2 * p->v[i] + (1 - b2) * g * g;
                p->w[i] -= lr * (p->m[i] / c1) / (std::sqrt(p->v[i] / c2) + eps);
                p->g[i] = 0.0f;
            }
        }
    }
};

void randn(Param& p, std::mt19937& rng, float stddev) {
    std::normal_distribution<float> d(0.0f, stddev);
    for (std::int64_t i = 0; i < p.n; ++i) p.w[i] = d(rng);
}

// ---------------------------------------------------------------- dense layers (loops)
// y (N, M) = x (N, K) · wᵀ (w: (M, K)) + b
void linear_fwd(const float* x, int N, int K, const Param& w, const Param* b, int M, float* y) {
    for (int n = 0; n < N; ++n) {
        const float* xr = x + static_cast<std::size_t>(n) * K;
        for (int m = 0; m < M; ++m) {
            const float* wr = w.w + static_cast<std::size_t>(m) * K;
            float s = b ? b->w[m] : 0.0f;
            for (int k = 0; k < K; ++k) s += xr[k] * wr[k];
            y[static_cast<std::size_t>(n) * M + m] = s;
        }
    }
}

// dW += dyᵀ·x, db += Σ dy, dx = dy·W   (dx may be null)
void linear_bwd(const float* x, const float* dy, int N, int K, Param& w, Param* b, int M, float* dx) {
    for (int n = 0; n < N; ++n) {
        const float* xr = x + static_cast<std::size_t>(n) * K;
        const float* dr = dy + static_cast<std::size_t>(n) * M;
        for (int m = 0; m < M; ++m) {
            float* gw = w.g.data() + static_cast<std::size_t>(m) * K;
            const float d = dr[m];
            for (int k = 0; k < K; ++k) gw[k] += d * xr[k];
            if (b) b->g[m] += d;
        }
        if (dx) {
            float* xo = dx + static_cast<std::size_t>(n) * K;
            std::fill(xo, xo + K, 0.0f);
            for (int m = 0; m < M; ++m) {
                const float* wr = w.w + static_cast<std::size_t>(m) * K;
                const float d = dr[m];
                for (int k = 0; k < K; ++k) xo[k] += d * wr[k];
            }
        }
    }
}

struct LayerNorm {
    Param gamma, beta;
    std::vector<float> xhat, rstd;  // saved for backward
    void init() {
        gamma.init_owned(kD);
        beta.init_owned(kD);
        std::fill(gamma.own.begin(), gamma.own.end(), 1.0f);
    }
    // x, y: (N, d)
    void fwd(const float* x, int N, float* y) {
        xhat.resize(static_cast<std::size_t>(N) * kD);
        rstd.resize(static_cast<std::size_t>(N));
        for (int n = 0; n < N; ++n) {
            const float* xr = x + static_cast<std::size_t>(n) * kD;
            float mu = 0, var = 0;
            for (int i = 0; i < kD; ++i) mu += xr[i];
            mu /= kD;
            for (int i = 0; i < kD; ++i) var += (xr[i] - mu) * (xr[i] - mu);
            const float r = 1.0f / std::sqrt(var / kD + 1e-5f);
            rstd[n] = r;
            for (int i = 0; i < kD; ++i) {
                const float xh = (xr[i] - mu) * r;
                xhat[static_cast<std::size_t>(n) * kD + i] = xh;
                y[static_cast<std::size_t>(n) * kD + i] = xh * gamma.w[i] + beta.w[i];
            }
        }
    }
    // dx += LN'(dy)   (accumulates: dx is the residual stream's gradient)
    void bwd(const float* dy, int N, float* dx) {
        for (int n = 0; n < N; ++n) {
            const float* d = dy + static_cast<std::size_t>(n) * kD;
            const float* xh = xhat.data() + static_cast<std::size_t>(n) * kD;
            float dxh[kD], mean_d = 0, mean_dx = 0;
            for (int i = 0; i < kD; ++i) {
                gamma.g[i] += d[i] * xh[i];
                beta.g[i] += d[i];
                dxh[i] = d[i] * gamma.w[i];
                mean_d += dxh[i];
                mean_dx += dxh[i] * xh[i];
            }
            mean_d /= kD;
            mean_dx /= kD;
            for (int i = 0; i < kD; ++i) dx[static_cast<std::size_t>(n) * kD + i] += rstd[n] * (dxh[i] - mean_d - xh[i] * mean_dx);
        }
    }
};

struct Block {
    LayerNorm ln1, ln2;
    std::unique_ptr<attn::MultiHeadAttention> mha;
    attn::MhaForwardState state;
    Param mha_params[4];  // in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias
    Param w1, b1, w2, b2;
    std::vector<float> a, hid, act;  // LN1 out, LN2 out, relu(W1·LN2 + b1)

    void init(std::mt19937& rng) {
        ln1.init();
        ln2.init();
        attn::MhaConfig c;
        c.embed_dim = kD;
        c.num_heads = kHeads;
        c.batch_first = true;
        mha = std::make_unique<attn::MultiHeadAttention>(c);
        const char* names[4] = {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"};
        for (int i = 0; i < 4; ++i) {
            const attn::TensorView t = mha->parameter(names[i]);
            mha_params[i].bind(t.data_as<float>(), t.numel());
        }
        randn(mha_params[0], rng, 1.0f / std::sqrt(static_cast<float>(kD)));
        randn(mha_params[2], rng, 0.5f / std::sqrt(static_cast<float>(kD)));
        w1.init_owned(static_cast<std::int64_t>(kHidden) * kD);
        b1.init_owned(kHidden);
        w2.init_owned(static_cast<std::int64_t>(kD) * kHidden);
        b2.init_owned(kD);
        randn(w1, rng, 1.0f / std::sqrt(static_cast<float>(kD)));
        randn(w2, rng, 0.5f / std::sqrt(static_cast<float>(kHidden)));
    }
    void params(std::vector<Param*>& ps) {
        for (Param* p : {&ln1.gamma, &ln1.beta, &ln2.gamma, &ln2.beta, &mha_params[0], &mha_params[1], &mha_params[2],
                         &mha_params[3], &w1, &b1, &w2, &b2})
            ps.push_back(p);
    }

    // h (B, T, d) updated in place
    void fwd(std::vector<float>& h, int B, bool train) {
        const int N = B * kT;
        a.resize(static_cast<std::size_t>(N) * kD);
        ln1.fwd(h.data(), N, a.data());
        attn::MhaForwardOptions opt;
        opt.causal = attn::Causal::top_left;
        opt.need_weights = false;
        const attn::TensorView av(a.data(), attn::DType::f32, attn::Shape{B, kT, kD});
        if (train) {
            const attn::Tensor y = mha->forward_train(av, av, av, opt, attn::MhaTrainOptions{}, state);
            const float* yp = y.data_as<const float>();
            for (std::size_t i = 0; i < h.size(); ++i) h[i] += yp[i];
        } else {
            const attn::MhaOutput y = mha->forward(av, av, av, opt);
            const float* yp = y.output.data_as<const float>();
            for (std::size_t i = 0; i < h.size(); ++i) h[i] += yp[i];
        }
        hid.resize(static_cast<std::size_t>(N) * kD);
        act.resize(static_cast<std::size_t>(N) * kHidden);
        ln2.fwd(h.data(), N, hid.data());
        linear_fwd(hid.data(), N, kD, w1, &b1, kHidden, act.data());
        for (float& x : act) x = std::max(x, 0.0f);
        std::vector<float> m(static_cast<std::size_t>(N) * kD);
        linear_fwd(act.data(), N, kHidden, w2, &b2, kD, m.data());
        for (std::size_t i = 0; i < h.size(); ++i) h[i] += m[i];
    }

    // dh: gradient of the block's output; becomes that of its input.
    void bwd(std::vector<float>& dh, int B) {
        const int N = B * kT;
        // MLP branch: h2 = h1 + W2·relu(W1·LN2(h1) + b1) + b2
        std::vector<float> dact(static_cast<std::size_t>(N) * kHidden), dhid(static_cast<std::size_t>(N) * kD);
        linear_bwd(act.data(), dh.data(), N, kHidden, w2, &b2, kD, dact.data());
        for (std::size_t i = 0; i < dact.size(); ++i)
            if (act[i] <= 0.0f) dact[i] = 0.0f;
        linear_bwd(hid.data(), dact.data(), N, kD, w1, &b1, kHidden, dhid.data());
        ln2.bwd(dhid.data(), N, dh.data());
        // attention branch: h1 = h0 + MHA(LN1(h0))
        const attn::TensorView dy(dh.data(), attn::DType::f32, attn::Shape{B, kT, kD});
        attn::MhaGradients g = mha->backward(state, dy);
        for (int i = 0; i < 4; ++i) {
            const float* src = g.params[static_cast<std::size_t>(i)].second.data_as<const float>();
            for (std::int64_t j = 0; j < mha_params[i].n; ++j) mha_params[i].g[j] += src[j];
        }
        std::vector<float> da(static_cast<std::size_t>(N) * kD);
        const float *gq = g.query.data_as<const float>(), *gk = g.key.data_as<const float>(), *gv = g.value.data_as<const float>();
        for (std::size_t i = 0; i < da.size(); ++i) da[i] = gq[i] + gk[i] + gv[i];  // self-attention: 3 uses
        ln1.bwd(da.data(), N, dh.data());
    }
};

struct Model {
    Param tok, pos, w_out, b_out;
    Block blocks[kLayers];
    LayerNorm lnf;
    std::vector<float> h, hf, logits;
    std::vector<int> tokens;

    void init(std::mt19937& rng) {
        tok.init_owned(static_cast<std::int64_t>(kTokens) * kD);
        pos.init_owned(static_cast<std::int64_t>(kT) * kD);
        w_out.init_owned(static_cast<std::int64_t>(kVocab) * kD);
        b_out.init_owned(kVocab);
        randn(tok, rng, 1.0f);
        randn(pos, rng, 1.0f);
        randn(w_out, rng, 1.0f / std::sqrt(static_cast<float>(kD)));
        for (Block& b : blocks) b.init(rng);
        lnf.init();
    }
    std::vector<Param*> params() {
        std::vector<Param*> ps{&tok, &pos, &w_out, &b_out, &lnf.gamma, &lnf.beta};
        for (Block& b : blocks) b.params(ps);
        return ps;
    }
    // tokens (B, T) → logits (B, T, V)
    void fwd(const std::vector<int>& in, int B, bool train) {
        tokens = in;
        const int N = B * kT;
        h.assign(static_cast<std::size_t>(N) * kD, 0.0f);
        for (int n = 0; n < N; ++n)
            for (int i = 0; i < kD; ++i)
                h[static_cast<std::size_t>(n) * kD + i] = tok.w[in[n] * kD + i] + pos.w[(n % kT) * kD + i];
        for (Block& b : blocks) b.fwd(h, B, train);
        hf.resize(h.size());
        lnf.fwd(h.data(), N, hf.data());
        logits.resize(static_cast<std::size_t>(N) * kVocab);
        linear_fwd(hf.data(), N, kD, w_out, &b_out, kVocab, logits.data());
    }
    // Mean cross-entropy over the answer positions t = n .. 2n-1 (SEP, y_1 .. y_{n-1}
    // predict y_1 .. y_n);
    // with `backward`, accumulates every parameter's gradient.
    float loss(const std::vector<int>& targets, int B, bool backward) {
        const int N = B * kT;
        std::vector<float> dlog(static_cast<std::size_t>(N) * kVocab, 0.0f);
        double total = 0;
        const float inv = 1.0f / static_cast<float>(B * kN);
        for (int n = 0; n < N; ++n) {
            const int t = n % kT;
            if (t < kN) continue;  // positions before SEP predict nothing
            const float* l = logits.data() + static_cast<std::size_t>(n) * kVocab;
            const float mx = *std::max_element(l, l + kVocab);
            float z = 0;
            for (int v = 0; v < kVocab; ++v) z += std::exp(l[v] - mx);
            const int y = targets[n];
            total += -(l[y] - mx - std::log(z));
            for (int v = 0; v < kVocab; ++v) dlog[static_cast<std::size_t>(n) * kVocab + v] = (std::exp(l[v] - mx) / z - (v == y)) * inv;
        }
        if (backward) {
            std::vector<float> dhf(h.size()), dh(h.size(), 0.0f);
            linear_bwd(hf.data(), dlog.data(), N, kD, w_out, &b_out, kVocab, dhf.data());
            lnf.bwd(dhf.data(), N, dh.data());
            for (int i = kLayers - 1; i >= 0; --i) blocks[i].bwd(dh, B);
            for (int n = 0; n < N; ++n)
                for (int i = 0; i < kD; ++i) {
                    tok.g[tokens[n] * kD + i] += dh[static_cast<std::size_t>(n) * kD + i];
                    pos.g[(n % kT) * kD + i] += dh[static_cast<std::size_t>(n) * kD + i];
                }
        }
        return static_cast<float>(total / (B * kN));
    }
};

// ---------------------------------------------------------------- data
using Seq = std::vector<int>;  // x_1 .. x_n

std::uint64_t key_of(const Seq& s) {
    std::uint64_t k = 0;
    for (int x : s) k = k * kVocab + static_cast<std::uint64_t>(x);
    return k;
}

Seq random_seq(std::mt19937& rng) {
    std::uniform_int_distribution<int> d(0, kVocab - 1);
    Seq s(kN);
    for (int& x : s) x = d(rng);
    return s;
}

// Input x_1..x_n SEP y_1..y_{n-1} (positions 0..2n-1); position t >= n predicts
// y_{t-n+1} = x_{2n-t} (0-based s[2n-1-t]); targets before n are unused.
void encode(const Seq& s, int* in, int* target) {
    for (int i = 0; i < kN; ++i) in[i] = s[i];
    in[kN] = kSep;
    for (int i = 1; i < kN; ++i) in[kN + i] = s[kN - i];
    for (int t = 0; t < kT; ++t) target[t] = t >= kN ? s[2 * kN - 1 - t] : 0;
}

// Greedy decoding of whole held-out sequences: the model sees only x and SEP and its own
// previous answers. Returns (sequence accuracy, token accuracy).
std::pair<double, double> evaluate(Model& model, const std::vector<Seq>& eval) {
    int exact = 0;
    long tok_ok = 0;
    for (std::size_t start = 0; start < eval.size(); start += kBatch) {
        const int B = static_cast<int>(std::min<std::size_t>(kBatch, eval.size() - start));
        std::vector<int> in(static_cast<std::size_t>(B) * kT, 0), dummy(kT);
        for (int b = 0; b < B; ++b) {
            for (int i = 0; i < kN; ++i) in[b * kT + i] = eval[start + b][i];
            in[b * kT + kN] = kSep;
        }
        std::vector<int> out(static_cast<std::size_t>(B) * kN);
        for (int i = 0; i < kN; ++i) {  // y_{i+1} is read at position n+i and fed back at n+i+1
            model.fwd(in, B, false);
            for (int b = 0; b < B; ++b) {
                const float* l = model.logits.data() + (static_cast<std::size_t>(b) * kT + kN + i) * kVocab;
                const int y = static_cast<int>(std::max_element(l, l + kVocab) - l);
                out[b * kN + i] = y;
                if (kN + i + 1 < kT) in[b * kT + kN + i + 1] = y;
            }
        }
        for (int b = 0; b < B; ++b) {
            bool all = true;
            for (int i = 0; i < kN; ++i) {
                const bool ok = out[b * kN + i] == eval[start + b][kN - 1 - i];
                tok_ok += ok;
                all = all && ok;
            }
            exact += all;
        }
    }
    return {static_cast<double>(exact) / eval.size(), static_cast<double>(tok_ok) / (eval.size() * kN)};
}

}  // namespace

int main(int argc, char** argv) {
    int steps = 600, print_every = 50;
    unsigned seed = 1;
    int threads = 1;  // the matrices are tiny: more threads only add synchronisation
    double loss_below = 0.002, min_acc = 0.99;
    const char* usage =
        "usage: tiny_decoder [--steps N (600)] [--print-every N (50)] [--seed S (1)] [--threads N (1)]\n"
        "                    [--loss-below X (0.002)] [--min-accuracy X (0.99)]\n";
    // Every value is a whole number (N: 1 <= x <= 2^31 - 1, S: from 0) or a finite number (X), all of it.
    auto number = [](const char* v, bool whole, double least, double& out) {
        char* end = nullptr;
        out = std::strtod(v, &end);
        return end != v && *end == '\0' && std::isfinite(out) &&
               (!whole || (out == std::floor(out) && out >= least));
    };
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--help" || a == "-h") {
            std::fputs(usage, stdout);
            return 0;
        }
        const bool whole = a == "--steps" || a == "--print-every" || a == "--seed" || a == "--threads";
        if (!whole && a != "--loss-below" && a != "--min-accuracy") {
            std::fprintf(stderr, "tiny_decoder: unknown option %s\n%s", a.c_str(), usage);
            return 2;
        }
        const double least = a == "--seed" ? 0 : 1;
        // Threads as attn's own range (libgomp exits 1, the "did not learn" status, when it cannot
        // make 2^31 of them); the others up to INT_MAX.
        const double most = a == "--threads" ? 4096.0 : 2147483647.0;
        double x = 0;
        if (i + 1 >= argc || !number(argv[i + 1], whole, least, x) || (whole && x > most)) {
            std::fprintf(stderr, "tiny_decoder: %s: expected %s%s but got %s%s%s\n", a.c_str(),
                         !whole ? "a number" : least == 0 ? "a whole number from 0" : "a whole number from 1",
                         !whole ? "" : most == 4096.0 ? " to 4096" : " to 2147483647",
                         i + 1 < argc ? "'" : "nothing", i + 1 < argc ? argv[i + 1] : "", i + 1 < argc ? "'" : "");
            return 2;
        }
        ++i;
        if (a == "--steps") steps = static_cast<int>(x);
        else if (a == "--print-every") print_every = static_cast<int>(x);
        else if (a == "--seed") seed = static_cast<unsigned>(x);
        else if (a == "--loss-below") loss_below = x;
        else if (a == "--min-accuracy") min_acc = x;
        else threads = static_cast<int>(x);
    }
    omp_set_num_threads(threads);
    std::mt19937 rng(seed);
    Model model;
    model.init(rng);
    std::vector<Param*> ps = model.params();
    long n_params = 0;
    for (Param* p : ps) n_params += p->n;

    // Held-out sequences, never drawn for training.
    std::mt19937 eval_rng(seed + 1000003);
    std::vector<Seq> eval;
    std::set<std::uint64_t> held;
    while (eval.size() < 512) {
        Seq s = random_seq(eval_rng);
        if (held.insert(key_of(s)).second) eval.push_back(s);
    }
    std::printf("tiny_decoder: reverse %d tokens (vocab %d), %d blocks, d=%d, %d heads, %ld parameters, batch %d\n", kN,
                kVocab, kLayers, kD, kHeads, n_params, kBatch);

    Adam adam;
    constexpr std::size_t kWindow = 20;  // the loss is judged on the mean of the last kWindow steps
    std::deque<float> recent;
    const auto t0 = std::chrono::steady_clock::now();
    double reached = -1;
    float avg = 0;
    std::vector<int> in(static_cast<std::size_t>(kBatch) * kT), target(in.size());
    for (int step = 1; step <= steps; ++step) {
        for (int b = 0; b < kBatch; ++b) {
            Seq s;
            do s = random_seq(rng);
            while (held.count(key_of(s)) != 0);
            encode(s, &in[b * kT], &target[b * kT]);
        }
        // cosine decay to 10% keeps the end of training stable
        adam.lr = 3e-3f * (0.1f + 0.9f * 0.5f * (1.0f + std::cos(3.14159265f * step / steps)));
        model.fwd(in, kBatch, true);
        const float l = model.loss(target, kBatch, true);
        adam.step(ps);
        recent.push_back(l);
        if (recent.size() > kWindow) recent.pop_front();
        avg = 0;
        for (float x : recent) avg += x;
        avg /= static_cast<float>(recent.size());
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        // The window is full (or is every step, for a run shorter than it): the verdict's mean.
        if (reached < 0 && recent.size() == std::min<std::size_t>(kWindow, steps) && avg < loss_below) reached = secs;
        if (step % print_every == 0 || step == 1 || step == steps) {
            std::printf("step %5d  loss %.4f  (mean of last %zu: %.4f)  %.1f s\n", step, l, recent.size(), avg, secs);
            std::fflush(stdout);
        }
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto [seq_acc, tok_acc] = evaluate(model, eval);
    std::printf("trained %d steps in %.1f s; loss (mean of last %zu) %.4f; threshold %.4f %s",
                steps, secs, recent.size(), avg, loss_below, reached >= 0 ? "reached after " : "not reached\n");
    if (reached >= 0) std::printf("%.1f s\n", reached);
    std::printf("held-out (%zu sequences, greedy decoding): sequence accuracy %.3f, token accuracy %.3f (need %.3f)\n",
                eval.size(), seq_acc, tok_acc, min_acc);
    const bool ok = avg < loss_below && seq_acc >= min_acc;
    std::printf("%s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}
