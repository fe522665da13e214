// paged_server — a toy inference server: a small decoder-only transformer generating for many
// concurrent requests of random lengths with continuous batching over attn::PagedKVCache.
//
//   * requests arrive with prompts of 8..96 tokens and ask for 8..64 new tokens; some ask for
//     2 parallel samples, which share the prompt's pages through fork() (copy-on-write);
//   * every step admits waiting requests while the page pool can hold their prompts and their
//     first new tokens (a request larger than the whole pool is refused), prefills them (paged_attention with Lq = prompt length: chunked prefill
//     over the pages), then runs one decode step for every running sequence at once — each
//     at its own length (bottom-right causal per sequence) — and frees finished ones;
//   * prints tokens/s and the pool's use.
// The weights are random (seeded): the point is the serving loop, not the text. The model:
//   h = emb[token] + pos[t];  per layer: h += Wo·attn(LN(h));  h += W2·relu(W1·LN(h));
//   logits = LN(h)·embᵀ;  next token sampled at temperature 1.
// Usage: paged_server [--requests N (48)] [--max-running N (16)] [--pages N (512)] [--page-size N (16)] [--seed S (1)]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <new>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/paged_kv_cache.hpp"

namespace {

constexpr int kVocab = 64, kD = 64, kHq = 4, kHkv = 2, kHd = 16, kLayers = 2, kHidden = 4 * kD, kMaxPos = 256;

using SeqId = attn::PagedKVCache::SeqId;

std::vector<float> random_matrix(std::mt19937& rng, int rows, int cols) {
    std::normal_distribution<float> d(0.0f, 1.0f / std::sqrt(static_cast<float>(cols)));
    std::vector<float> w(static_cast<std::size_t>(rows) * cols);
    for (float& x : w) x = d(rng);
    return w;
}

// y (n × rows) = x (n × cols) · Wᵀ, W (rows × cols).
void linear(const float* x, int n, int cols, const std::vector<float>& w, int rows, float* y) {
    for (int i = 0; i < n; ++i)
        for (int r = 0; r < rows; ++r) {
            float s = 0.0f;
            for (int c = 0; c < cols; ++c) s += x[i * cols + c] * w[static_cast<std::size_t>(r) * cols + c];
            y[i * rows + r] = s;
        }
}

void layer_norm(const float* x, int n, float* y) {
    for (int i = 0; i < n; ++i) {
        float m = 0.0f, v = 0.0f;
        for (int c = 0; c < kD; ++c) m += x[i * kD + c];
        m /= kD;
        for (int c = 0; c < kD; ++c) v += (x[i * kD + c] - m) * (x[i * kD + c] - m);
        const float inv = 1.0f / std::sqrt(v / kD + 1e-5f);
        for (int c = 0; c < kD; ++c) y[i * kD + c] = (x[i * kD + c] - m) * inv;
    }
}

struct Layer {
    std::vector<float> wq, wk, wv, wo, w1, w2;
    attn::PagedKVCache cache;
    Layer(std::mt19937& rng, const attn::PagedKVCacheConfig& c)
        : wq(random_matrix(rng, kHq * kHd, kD)), wk(random_matrix(rng, kHkv * kHd, kD)),
          wv(random_matrix(rng, kHkv * kHd, kD)), wo(random_matrix(rng, kD, kHq * kHd)),
          w1(random_matrix(rng, kHidden, kD)), w2(random_matrix(rng, kD, kHidden)), cache(c) {}
};

struct Model {
    std::vector<float> emb, pos;
    std::vector<Layer> layers;
    Model(std::mt19937& rng, const attn::PagedKVCacheConfig& c) : emb(random_matrix(rng, kVocab, kD)), pos(random_matrix(rng, kMaxPos, kD)) {
        for (int l = 0; l < kLayers; ++l) layers.emplace_back(rng, c);
    }
};

// One forward over a batch: sequence b (ids[l][b] in layer l's cache) gets `len[b]` new tokens
// at positions start[b]..; every batch row has the same number L of new tokens (a decode step:
// L = 1; a prefill: one sequence). Appends their K/V, returns the last position's logits.
std::vector<std::vector<float>> forward(Model& m, const std::vector<std::vector<SeqId>>& ids,
                                        const std::vector<std::vector<int>>& tokens, const std::vector<int>& start) {
    const int B = static_cast<int>(tokens.size()), L = static_cast<int>(tokens[0].size()), n = B * L;
    std::vector<float> h(static_cast<std::size_t>(n) * kD), x(h.size()), q(static_cast<std::size_t>(n) * kHq * kHd),
        k(static_cast<std::size_t>(n) * kHkv * kHd), v(k.size()), a(q.size()), tmp(h.size()),
        mlp(static_cast<std::size_t>(n) * kHidden);
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < L; ++t)
            for (int c = 0; c < kD; ++c)
                h[(b * L + t) * kD + c] = m.emb[static_cast<std::size_t>(tokens[b][t]) * kD + c] + m.pos[static_cast<std::size_t>(start[b] + t) * kD + c];
    for (int l = 0; l < kLayers; ++l) {
        Layer& ly = m.layers[static_cast<std::size_t>(l)];
        layer_norm(h.data(), n, x.data());
        linear(x.data(), n, kD, ly.wq, kHq * kHd, q.data());
        linear(x.data(), n, kD, ly.wk, kHkv * kHd, k.data());
        linear(x.data(), n, kD, ly.wv, kHkv * kHd, v.data());
        // (B, L, H, hd) buffers seen as (B, H, L, hd) / (H, L, hd): strides, no copies.
        for (int b = 0; b < B; ++b) {
            const attn::TensorView kb(k.data() + static_cast<std::ptrdiff_t>(b) * L * kHkv * kHd, attn::DType::f32,
                                      attn::Shape{kHkv, L, kHd}, attn::Strides{kHd, kHkv * kHd, 1, 0});
            const attn::TensorView vb(v.data() + static_cast<std::ptrdiff_t>(b) * L * kHkv * kHd, attn::DType::f32,
                                      attn::Shape{kHkv, L, kHd}, attn::Strides{kHd, kHkv * kHd, 1, 0});
            ly.cache.append(ids[static_cast<std::size_t>(l)][static_cast<std::size_t>(b)], kb, vb);
        }
        const attn::TensorView qv(q.data(), attn::DType::f32, attn::Shape{B, kHq, L, kHd},
                                  attn::Strides{L * kHq * kHd, kHd, kHq * kHd, 1});
        const attn::TensorView av(a.data(), attn::DType::f32, attn::Shape{B, kHq, L, kHd},
                                  attn::Strides{L * kHq * kHd, kHd, kHq * kHd, 1});
        attn::SdpaOptions opt;
        opt.causal = attn::Causal::bottom_right;  // each sequence's new tokens are its last L
        attn::paged_attention(qv, ly.cache, ids[static_cast<std::size_t>(l)], opt, av);
        linear(a.data(), n, kHq * kHd, ly.wo, kD, tmp.data());
        for (std::size_t i = 0; i < h.size(); ++i) h[i] += tmp[i];
        layer_norm(h.data(), n, x.data());
        linear(x.data(), n, kD, ly.w1, kHidden, mlp.data());
        for (float& y : mlp) y = y > 0.0f ? y : 0.0f;
        linear(mlp.data(), n, kHidden, ly.w2, kD, tmp.data());
        for (std::size_t i = 0; i < h.size(); ++i) h[i] += tmp[i];
    }
    std::vector<std::vector<float>> logits(static_cast<std::size_t>(B), std::vector<float>(kVocab));
    for (int b = 0; b < B; ++b) {
        layer_norm(h.data() + static_cast<std::ptrdiff_t>(b * L + L - 1) * kD, 1, x.data());
        linear(x.data(), 1, kD, m.emb, kVocab, logits[static_cast<std::size_t>(b)].data());
    }
    return logits;
}

int sample(const std::vector<float>& logits, std::mt19937& rng) {
    const float mx = *std::max_element(logits.begin(), logits.end());
    std::vector<double> p(logits.size());
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = std::exp(static_cast<double>(logits[i] - mx));
    return std::discrete_distribution<int>(p.begin(), p.end())(rng);
}

struct Request {
    int id = 0;
    std::vector<int> prompt;
    int max_new = 0;
    int samples = 1;
};

struct Running {  // one sample of one request
    int request = 0, sample = 0;
    std::vector<SeqId> ids;  // per layer
    int length = 0;          // tokens in the cache
    int next = 0;            // the token to feed next
    int generated = 0, max_new = 0;
    std::vector<int> text;
};

}  // namespace

int main(int argc, char** argv) {
    int requests = 48, max_running = 16, pages = 512, page_size = 16;
    unsigned seed = 1;
    const char* usage =
        "usage: paged_server [--requests N (48)] [--max-running N (16)] [--pages N (512)] [--page-size N (16)] "
        "[--seed S (1)]\n"
        "  --max-running >= 2 (a request may run two samples); --pages >= 1; --page-size a power of two up to 2^20\n";
    for (int i = 1; i < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--help" || a == "-h") {
            std::fputs(usage, stdout);
            return 0;
        }
        int* target = a == "--requests" ? &requests : a == "--max-running" ? &max_running : a == "--pages" ? &pages
                    : a == "--page-size" ? &page_size : nullptr;
        if (target == nullptr && a != "--seed") {
            std::fprintf(stderr, "paged_server: unknown option %s\n%s", a.c_str(), usage);
            return 2;
        }
        // Every option takes a whole decimal number: 0 <= x <= 2^31 - 1.
        char* end = nullptr;
        const long x = i + 1 < argc ? std::strtol(argv[i + 1], &end, 10) : -1;
        if (i + 1 >= argc || end == argv[i + 1] || *end != '\0' || x < 0 || x > 2147483647L) {
            std::fprintf(stderr, "paged_server: %s: expected a number >= 0 but got '%s'\n", a.c_str(),
                         i + 1 < argc ? argv[i + 1] : "nothing");
            return 2;
        }
        if (target != nullptr) *target = static_cast<int>(x);
        else seed = static_cast<unsigned>(x);
    }
    // A request may ask for two samples (parallel sampling), admitted together.
    if (max_running < 2 || pages < 1 || page_size < 1) {
        std::fprintf(stderr, "paged_server: expected --max-running >= 2, --pages >= 1 and --page-size >= 1 but got %d, %d, %d\n",
                     max_running, pages, page_size);
        return 2;
    }
    try {
        std::mt19937 rng(seed);
        attn::PagedKVCacheConfig cfg;
        cfg.kv_heads = kHkv;
        cfg.head_dim = kHd;
        cfg.page_size = page_size;
        cfg.num_pages = pages;
        Model model(rng, cfg);
        std::deque<Request> waiting;
        for (int r = 0; r < requests; ++r) {
            Request q;
            q.id = r;
            q.prompt.resize(8 + rng() % 89);
            for (int& t : q.prompt) t = static_cast<int>(rng() % kVocab);
            q.max_new = 8 + static_cast<int>(rng() % 57);
            q.samples = rng() % 4 == 0 ? 2 : 1;  // parallel sampling: fork after the prompt
            waiting.push_back(q);
        }
        std::vector<Running> running;
        long long generated = 0, prompt_tokens = 0, steps = 0, forks = 0, dropped = 0, refused = 0;
        std::size_t peak_running = 0;
        std::int64_t peak_pages = 0;
        const auto t0 = std::chrono::steady_clock::now();
        attn::PagedKVCache& pool = model.layers[0].cache;  // every layer's pool is used alike
        while (!waiting.empty() || !running.empty()) {
            // Admit: a prompt's pages plus what its samples' first new tokens take — a fresh page each
            // when the prompt fills its last page; else the shared last page is copied on write for
            // every sample but the last writer, which then holds it alone.
            const auto pages_for = [&](const Request& q) {
                const auto n = static_cast<std::int64_t>(q.prompt.size());
                return (n + page_size - 1) / page_size + (n % page_size == 0 ? q.samples : q.samples - 1);
            };
            // The pages the running sequences' next tokens take: a fresh page for a sequence whose
            // last page is full; for a partly filled last page shared by g running samples (forks
            // of one prompt), g − 1 copies — the last writer then holds it alone. (Summing each
            // sequence's pages_needed counted g copies, and preempted a sample that fit.)
            const auto step_need = [&] {
                std::int64_t need = 0;
                std::map<std::int32_t, std::int64_t> sharing;  // shared last page → running holders
                for (const Running& r : running) {
                    const SeqId id = r.ids[0];
                    if (pool.pages_needed(id, 1) == 0) continue;
                    if (pool.length(id) % page_size == 0) ++need;
                    else ++sharing[pool.page_table(id).back()];
                }
                for (const auto& [page, holders] : sharing) need += holders - 1;
                return need;
            };
            // What the running sequences' next tokens take is not free for new prompts (admitting
            // past it prefilled a request only to preempt it before its first token).
            std::int64_t reserved = step_need();
            while (!waiting.empty()) {
                const Request& q = waiting.front();
                const std::int64_t need = pages_for(q);
                if (need > pool.num_pages() || q.samples > max_running) {  // it could never run
                    if (need > pool.num_pages())
                        std::printf("request %d refused: its prompt of %zu tokens and %d sample(s) need %lld pages of %d "
                                    "tokens; the pool has %d\n",
                                    q.id, q.prompt.size(), q.samples, static_cast<long long>(need), page_size, pages);
                    else
                        std::printf("request %d refused: its %d samples run at once; --max-running is %d\n", q.id,
                                    q.samples, max_running);
                    ++refused;
                    waiting.pop_front();
                    continue;
                }
                if (static_cast<int>(running.size()) + q.samples > max_running || reserved + need > pool.free_pages()) break;
                Running s;
                s.request = q.id;
                for (Layer& ly : model.layers) s.ids.push_back(ly.cache.add_sequence());
                // Prefill: the whole prompt in one call (Lq = prompt length, chunked over the pages).
                std::vector<std::vector<SeqId>> one;
                for (SeqId id : s.ids) one.push_back({id});
                const auto logits = forward(model, one, {q.prompt}, {0});
                prompt_tokens += static_cast<long long>(q.prompt.size());
                s.length = static_cast<int>(q.prompt.size());
                s.max_new = q.max_new;
                for (int k = 0; k < q.samples; ++k) {
                    Running r = s;
                    r.sample = k;
                    if (k > 0) {  // shares the prompt's pages until it writes into them
                        r.ids.clear();
                        for (std::size_t l = 0; l < model.layers.size(); ++l) r.ids.push_back(model.layers[l].cache.fork(s.ids[l]));
                        ++forks;
                    }
                    r.next = sample(logits[0], rng);
                    r.text.push_back(r.next);
                    running.push_back(r);
                }
                reserved += need - (static_cast<std::int64_t>(q.prompt.size()) + page_size - 1) / page_size;  // its first tokens'
                waiting.pop_front();
            }
            if (running.empty()) continue;  // the rest were refused, or the next one is admitted now
            // Preempt when the pool cannot take this step's tokens (a real server would swap
            // or recompute; here the newest sequence gives its pages back and is dropped).
            while (step_need() > pool.free_pages() && !running.empty()) {
                Running& r = running.back();
                for (std::size_t l = 0; l < model.layers.size(); ++l) model.layers[l].cache.free(r.ids[l]);
                // The last one has the whole pool and still no page for its next token: it ends there.
                std::printf("request %d sample %d %s at %d tokens\n", r.request, r.sample,
                            running.size() > 1 ? "preempted" : "stopped (the pool is full)", r.generated);
                ++dropped;
                running.pop_back();
            }
            if (running.empty()) continue;  // admit the next request, or end
            // One decode step for every running sequence at once, each at its own length.
            std::vector<std::vector<SeqId>> ids(model.layers.size());
            std::vector<std::vector<int>> toks;
            std::vector<int> start;
            for (const Running& r : running) {
                for (std::size_t l = 0; l < ids.size(); ++l) ids[l].push_back(r.ids[l]);
                toks.push_back({r.next});
                start.push_back(r.length);
            }
            const auto logits = forward(model, ids, toks, start);
            ++steps;
            peak_running = std::max(peak_running, running.size());
            peak_pages = std::max(peak_pages, pool.num_pages() - pool.free_pages());
            std::vector<Running> still;
            for (std::size_t b = 0; b < running.size(); ++b) {
                Running& r = running[b];
                ++r.length;
                ++r.generated;
                ++generated;
                r.next = sample(logits[b], rng);
                r.text.push_back(r.next);
                if (r.generated >= r.max_new || r.length + 1 >= kMaxPos) {
                    for (std::size_t l = 0; l < model.layers.size(); ++l) model.layers[l].cache.free(r.ids[l]);
                    if (r.request < 3) {
                        std::printf("request %d sample %d:", r.request, r.sample);
                        for (std::size_t i = 0; i < std::min<std::size_t>(r.text.size(), 12); ++i) std::printf(" %d", r.text[i]);
                        std::printf(" ...\n");
                    }
                } else {
                    still.push_back(std::move(r));
                }
            }
            running = std::move(still);
        }
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("%d requests (%lld forks for parallel samples): %lld prompt tokens, %lld generated tokens in "
                    "%lld steps, %.2f s: %.0f generated tokens/s, %.0f tokens/s with prompts\n",
                    requests, forks, prompt_tokens, generated, steps, s, static_cast<double>(generated) / s,
                    static_cast<double>(generated + prompt_tokens) / s);
        if (dropped > 0 || refused > 0)
            std::printf("not finished: %lld sample(s) preempted or stopped by a full pool, %lld request(s) refused as larger "
                        "than the pool\n", dropped, refused);
        std::printf("up to %zu sequences at once; peak %lld of %d pages of %d tokens in use per layer; free at the end: %lld\n",
                    peak_running, static_cast<long long>(peak_pages), pages, page_size,
                    static_cast<long long>(pool.free_pages()));
        return pool.free_pages() == pool.num_pages() ? 0 : 1;
    } catch (const attn::Error& e) {
        std::fprintf(stderr, "paged_server: %s\n", e.what());
        return 2;
    } catch (const std::bad_alloc& e) {  // attn::OutOfMemory (a pool too large for this machine) among them
        std::fprintf(stderr, "paged_server: %s\n", e.what());
        return 1;
    }
}
