// attn demo — the tutorial's example sentence (一只 / 蓝色 / 怪兽 / 走进 / 森林) step by step:
// X → Q, K, V → S = Q·Kᵀ/√d_k → causal mask → A = softmax → O = A·V, each with its shape,
// then the tutorial's point: a masked score set to 0 still gets weight, −inf gets none.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/heatmap.hpp"
#include "attn/reference.hpp"
#include "attn/sdpa.hpp"
#include "commands.hpp"
#include "core/check.hpp"
#include "output_files.hpp"
#include "threads_option.hpp"

namespace attn::cli {
namespace {

constexpr int kL = 5;       // tokens
constexpr int kModel = 4;   // d_model
constexpr int kHead = 4;    // d_k = d_v
const char* const kTokens[kL] = {"一只", "蓝色", "怪兽", "走进", "森林"};  // each 4 columns wide

using Matrix = std::vector<std::vector<double>>;

// Small deterministic numbers (no RNG, so every run and machine prints the same).
Matrix make(int rows, int cols, double a, double b) {
    Matrix m(static_cast<std::size_t>(rows), std::vector<double>(static_cast<std::size_t>(cols)));
    for (int i = 0; i < rows; ++i)
        for (int j = 0; j < cols; ++j)
            m[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] = std::round(100.0 * std::sin(a * (i + 1) + b * (j + 1))) / 100.0;
    return m;
}

Matrix matmul(const Matrix& x, const Matrix& w) {
    Matrix y(x.size(), std::vector<double>(w[0].size(), 0.0));
    for (std::size_t i = 0; i < x.size(); ++i)
        for (std::size_t k = 0; k < w.size(); ++k)
            for (std::size_t j = 0; j < w[0].size(); ++j) y[i][j] += x[i][k] * w[k][j];
    return y;
}

void print_matrix(const char* title, const Matrix& m, bool token_rows, bool token_cols) {
    std::printf("\n%s  shape (%zu, %zu)\n", title, m.size(), m[0].size());
    std::printf("      ");
    for (std::size_t j = 0; j < m[0].size(); ++j) {
        // Each column is 7 wide, as the values' %7.3f: a token is 4 columns wide (two CJK
        // characters), a dim label right-aligned over its numbers.
        if (token_cols) std::printf("   %s", kTokens[j]);
        else std::printf("%7s", ("d" + std::to_string(j)).c_str());
    }
    std::printf("\n");
    for (std::size_t i = 0; i < m.size(); ++i) {
        if (token_rows) std::printf("%s  ", kTokens[i]);
        else std::printf("row%zu  ", i);
        for (double v : m[i]) {
            if (std::isinf(v)) std::printf("%7s", v < 0 ? "-inf" : "inf");
            else std::printf("%7.3f", v);
        }
        std::printf("\n");
    }
}

Matrix head_of(const Tensor& t, int rows, int cols) {  // (1, 1, rows, cols) float64 → Matrix
    Matrix m(static_cast<std::size_t>(rows), std::vector<double>(static_cast<std::size_t>(cols)));
    for (int i = 0; i < rows; ++i)
        for (int j = 0; j < cols; ++j) m[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] = t.data_as<double>()[i * cols + j];
    return m;
}

Tensor as_tensor(const Matrix& m) {  // Matrix → (1, 1, rows, cols) float32
    Tensor t(DType::f32, Shape{1, 1, static_cast<std::int64_t>(m.size()), static_cast<std::int64_t>(m[0].size())});
    for (std::size_t i = 0; i < m.size(); ++i)
        for (std::size_t j = 0; j < m[0].size(); ++j) t.data_as<float>()[i * m[0].size() + j] = static_cast<float>(m[i][j]);
    return t;
}

std::vector<double> softmax(const std::vector<double>& s) {
    double m = -INFINITY, sum = 0.0;
    for (double v : s) m = std::max(m, v);
    std::vector<double> p;
    for (double v : s) p.push_back(std::exp(v - m)), sum += p.back();
    for (double& v : p) v /= sum;
    return p;
}

void print_row(const char* label, const std::vector<double>& v) {
    std::printf("  %-28s [", label);
    for (std::size_t i = 0; i < v.size(); ++i) {
        if (std::isinf(v[i])) std::printf("%s%s", i ? ", " : "", v[i] < 0 ? "-inf" : "inf");
        else std::printf("%s%.2f", i ? ", " : "", v[i]);
    }
    std::printf("]\n");
}

void run_demo(const std::string& heatmap_path) {
    OutputFiles outputs;
    if (!heatmap_path.empty()) {  // a bad picture path fails before anything is printed
        try {
            image_format_for_path(heatmap_path);
        } catch (const Error&) {
            throw Error("--heatmap: expected a file name ending in .png or .svg but got " + detail::quoted_path(heatmap_path));
        }
        outputs.add("--heatmap", heatmap_path);
        outputs.check();
    }
    std::printf("attn demo: self-attention step by step, on the tutorial's sentence\n");
    std::printf("tokens: 一只 / 蓝色 / 怪兽 / 走进 / 森林  (L = %d, d_model = %d, d_k = d_v = %d, one head, causal)\n",
                kL, kModel, kHead);
    const Matrix X = make(kL, kModel, 0.9, 0.4);
    const Matrix Wq = make(kModel, kHead, 0.7, 1.1), Wk = make(kModel, kHead, 1.3, 0.5), Wv = make(kModel, kHead, 0.3, 0.8);
    print_matrix("X: token embeddings", X, true, false);
    const Matrix Q = matmul(X, Wq), K = matmul(X, Wk), V = matmul(X, Wv);
    print_matrix("Q = X·W_Q  (what each token looks for)", Q, true, false);
    print_matrix("K = X·W_K  (what each token offers to be matched)", K, true, false);
    print_matrix("V = X·W_V  (what each token hands over)", V, true, false);

    const Tensor q = as_tensor(Q), k = as_tensor(K), v = as_tensor(V);
    SdpaOptions opt;
    opt.causal = Causal::top_left;
    const AttentionSteps steps = reference_steps(q, k, v, opt);
    print_matrix("S = Q·Kᵀ/√d_k  (scores: row = query, column = key)", head_of(steps.scores, kL, kL), true, true);

    Matrix mask(kL, std::vector<double>(kL));
    for (int i = 0; i < kL; ++i)
        for (int j = 0; j < kL; ++j) mask[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] = j <= i ? 1 : 0;
    print_matrix("causal mask  (1 = may see, 0 = a future token)", mask, true, true);
    print_matrix("masked S  (future positions set to -inf before the softmax)", head_of(steps.masked_scores, kL, kL), true, true);
    print_matrix("A = softmax(masked S)  (each row sums to 1; the future gets exactly 0)", head_of(steps.weights, kL, kL), true, true);
    print_matrix("O = A·V  (each token's new vector, mixed from what it may see)", head_of(steps.out, kL, kL > kHead ? kHead : kL), true, false);

    // The library's own operator (the kernel auto-dispatch picks) must give the same O.
    Tensor out(DType::f32, Shape{1, 1, kL, kHead});
    SdpaReport report;
    sdpa(q, k, v, opt, out, nullptr, nullptr, &report);
    double worst = 0.0;
    for (int i = 0; i < kL * kHead; ++i) worst = std::max(worst, std::fabs(out.data_as<float>()[i] - steps.out.data_as<double>()[i]));
    std::printf("\nattn::sdpa (kernel: %s) gives the same O: max |difference| = %.1e\n", report.kernel.c_str(), worst);

    std::printf("\nWhy -inf and not 0: the softmax turns 0 into a real weight.\n");
    print_row("scores", {2.0, 0.0, 0.0});
    print_row("softmax, masked set to 0", softmax({2.0, 0.0, 0.0}));
    print_row("softmax, masked set to -inf", softmax({2.0, -INFINITY, -INFINITY}));
    std::vector<double> row0 = head_of(steps.scores, kL, kL)[0], zeroed = row0;
    for (int j = 1; j < kL; ++j) zeroed[static_cast<std::size_t>(j)] = 0.0;
    std::printf("On our sentence, query 一只 may see only itself:\n");
    print_row("its scores S[0]", row0);
    print_row("softmax, future set to 0", softmax(zeroed));
    print_row("attn (future = -inf)", head_of(steps.weights, kL, kL)[0]);
    std::printf("With 0 the future tokens would leak into 一只's output; with -inf they get no weight at all.\n");

    if (!heatmap_path.empty()) {  // A as a picture: the same matrix as the printout above
        HeatmapOptions hm;
        hm.key_tokens.assign(kTokens, kTokens + kL);
        hm.title = "attn demo: A = softmax(masked S), the tutorial's sentence";
        hm.subtitle = "one head, causal: each query sees itself and the tokens before it";
        const HeatmapImage image = render_heatmap(TensorView(steps.weights.data(), DType::f64, Shape{kL, kL}), hm,
                                                  image_format_for_path(heatmap_path));
        // The walkthrough must have reached stdout before the picture appears (`attn demo >
        // /dev/full` exited 2 and left the picture behind), and the line naming the picture comes
        // after it is written (a failed write left a line naming a file that is not there).
        if (const std::string failed = stdout_write_error(); !failed.empty()) throw Error(failed);
        outputs.write_bytes("--heatmap", heatmap_path, image.bytes);
        std::printf("\nHeatmap of A (rows = queries, columns = keys; hatched grey = masked future): %s%s\n",
                    heatmap_path.find('/') == std::string::npos ? "./" : "", heatmap_path.c_str());
    }
}

}  // namespace

void add_demo_command(CLI::App& app) {
    CLI::App* cmd = app.add_subcommand("demo", "Walk through self-attention on a five-token sentence step by step, printing every shape");
    auto heatmap = std::make_shared<std::string>("attn-demo-heatmap.png");
    auto no_heatmap = std::make_shared<bool>(false);
    auto* path = cmd->add_option("--heatmap", *heatmap, "where to draw A as a heatmap (.png or .svg)")->capture_default_str();
    cmd->add_flag("--no-heatmap", *no_heatmap, "draw no heatmap")->excludes(path);
    add_threads_option(cmd);
    cmd->callback([heatmap, no_heatmap] { run_demo(*no_heatmap ? std::string() : *heatmap); });
}

}  // namespace attn::cli
