// attn heatmap W.npy --out FILE.png|FILE.svg [--tokens "t1,t2,…" | --tokens-file F]
//               [--query-tokens … | --query-tokens-file F] [--head N | --mean | --all-heads]
//               [--batch N] [--batched] [--title T] [--vmax V]
// W is what `attn sdpa --weights` writes: (Lq, Lk), (H, Lq, Lk) or (B, H, Lq, Lk); with --batched a
// 3-d W is (B, Lq, Lk), what `attn mha --weights` writes (averaged over heads).
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/heatmap.hpp"
#include "attn/npy.hpp"
#include "commands.hpp"
#include "number_text.hpp"
#include "strict_options.hpp"
#include "core/check.hpp"
#include "io/input_file.hpp"
#include "viz/pool.hpp"
#include "output_files.hpp"
#include "tensor_args.hpp"

namespace attn::cli {
namespace {

struct HeatmapArgs {
    std::string weights, out, tokens, tokens_file, query_tokens, query_tokens_file, title;
    std::optional<std::int64_t> head, batch;
    std::optional<double> vmax;
    bool mean = false, all_heads = false, verbose = false;
    bool batched = false;  // --batched: a 3-d W is (B, Lq, Lk), not (H, Lq, Lk)
};

// "a,b,c" → {"a", "b", "c"}; tokens are kept exactly (spaces included).
std::vector<std::string> split_commas(const std::string& flag, const std::string& s) {
    std::vector<std::string> out;
    std::size_t start = 0;
    while (true) {
        const std::size_t comma = s.find(',', start);
        out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    for (std::size_t i = 0; i < out.size(); ++i) {
        if (out[i].empty()) throw Error(flag + ": token " + std::to_string(i + 1) + " is empty (in '" + s + "')");
    }
    return out;
}

// One token per line (so tokens may contain commas); a final newline and CRs are ignored, and an
// empty line is an error, as an empty token of --tokens is.
// The file is opened like every input (regular files only: not a FIFO, not /dev/zero) and
// may hold at most kMaxTokensFileBytes: far more than any picture can label, far less than
// what would exhaust memory.
constexpr std::size_t kMaxTokensFileBytes = 16u << 20;

std::vector<std::string> read_lines(const std::string& flag, const std::string& path) {
    std::string text;
    try {
        text = detail::read_text_file(path, kMaxTokensFileBytes);
    } catch (const Error& e) {
        throw Error(flag + ": " + e.what());
    }
    std::vector<std::string> out;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty()) throw Error(flag + ": " + detail::quoted_path(path) + ": line " + std::to_string(out.size() + 1) + " is empty");
        out.push_back(line);
    }
    if (out.empty()) throw Error(flag + ": " + detail::quoted_path(path) + " holds no tokens");
    return out;
}

// The tokens of --tokens (comma-separated) or --tokens-file (one per line), each checked as the
// labels must be (valid UTF-8, no NUL byte) and named by the option and its place in it.
std::vector<std::string> tokens_from(const std::string& flag, const std::string& list, const std::string& file_flag,
                                     const std::string& file) {
    const bool from_file = list.empty();
    std::vector<std::string> tokens;
    if (!from_file) tokens = split_commas(flag, list);
    else if (!file.empty()) tokens = read_lines(file_flag, file);
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        if (!heatmap_label_ok(tokens[i])) {
            throw Error((from_file ? file_flag + ": " + detail::quoted_path(file) + ": line " : flag + ": token ") + std::to_string(i + 1) +
                        " is not valid UTF-8 text (or holds a NUL byte)");
        }
    }
    return tokens;
}

// The weights' name in the subtitle: the file's base name, then ":NAME" for a safetensors
// tensor (whose name may hold '/': cutting the whole spec at its last '/' dropped the file).
// A name that is not UTF-8 (a file name can be any bytes) is shown quoted, its bytes \xNN.
std::string subtitle_name(const std::string& spec) {
    const std::string file = tensor_arg_file(spec);
    const std::size_t slash = file.find_last_of('/');
    const std::string name = (slash == std::string::npos ? file : file.substr(slash + 1)) + spec.substr(file.size());
    return heatmap_label_ok(name) ? name : detail::quoted(name);
}

void run(const HeatmapArgs& a) {
    if (a.weights.empty()) {
        throw Error("heatmap: which weights? give the .npy file first: attn heatmap W.npy --out W.png "
                    "(W.npy as written by attn sdpa --weights)");
    }
    if (a.out.empty()) throw Error("--out: required: the picture to write, FILE.png or FILE.svg");
    // Output first: a bad name or directory fails before any reading or drawing.
    try {
        image_format_for_path(a.out);
    } catch (const Error&) {
        throw Error("--out: expected a file name ending in .png or .svg but got " + detail::quoted_path(a.out));
    }
    OutputFiles outputs;
    outputs.add("--out", a.out);
    outputs.add_input("weights", tensor_arg_file(a.weights));
    outputs.add_input("--tokens-file", a.tokens_file);  // the picture replaced them, exit 0
    outputs.add_input("--query-tokens-file", a.query_tokens_file);
    outputs.check();

    // A .npy or FILE.safetensors:NAME, as every tensor argument (what `attn sdpa --weights` writes).
    const Tensor w = read_tensor_arg("weights", a.weights);
    if (!is_floating(w.dtype())) {
        throw Error("weights: " + detail::quoted_path(a.weights) + ": attention weights must be float16, bfloat16, float32 or float64 but the file holds " +
                    std::string(dtype_name(w.dtype())));
    }
    const Shape& s = w.shape();
    if (s.rank < 2 || s.rank > 4) {
        throw Error("weights: " + detail::quoted_path(a.weights) + ": expected attention weights of shape (Lq, Lk), (H, Lq, Lk) or (B, H, Lq, Lk) but got " + s.str());
    }
    for (int i = 0; i < s.rank; ++i) {
        if (s[i] == 0) throw Error("weights: " + detail::quoted_path(a.weights) + ": attention weights must not be empty but have shape " + s.str());
    }
    if (a.batched && s.rank != 3) {
        throw Error("--batched: only for 3-d weights, read as (B, Lq, Lk), but " + detail::quoted_path(a.weights) + " has shape " + s.str());
    }
    // Seen as (B, H, Lq, Lk) whatever the file's rank: batch and head dims and their strides (0
    // for a dim the file does not have). A 3-d W is (H, Lq, Lk), or (B, Lq, Lk) with --batched.
    const Strides st = w.view().strides();
    const bool has_b = s.rank == 4 || a.batched, has_h = s.rank == 4 || (s.rank == 3 && !a.batched);
    const std::int64_t B = has_b ? s[0] : 1, H = has_h ? s[s.rank - 3] : 1;
    const std::int64_t sb = has_b ? st[0] : 0, sh = has_h ? st[static_cast<std::size_t>(s.rank - 3)] : 0;
    const std::int64_t Lq = s[s.rank - 2], Lk = s[s.rank - 1];
    const char* dims = s.rank == 4 ? "(B, H, Lq, Lk)" : s.rank == 2 ? "(Lq, Lk)" : a.batched ? "(B, Lq, Lk)" : "(H, Lq, Lk)";
    const std::string described = a.weights + " " + s.str() + " read as " + dims;

    const std::int64_t b = a.batch.value_or(0);
    if (b < 0 || b >= B) {
        throw Error("--batch: " + std::to_string(b) + " is out of range: " + described + " has B = " + std::to_string(B) +
                    " (valid: 0.." + std::to_string(B - 1) + ")" +
                    (s.rank == 3 && !a.batched ? "; a 3-d W of `attn mha --weights` is (B, Lq, Lk): add --batched" : ""));
    }
    if (a.head && (*a.head < 0 || *a.head >= H)) {
        throw Error("--head: " + std::to_string(*a.head) + " is out of range: " + described + " has H = " + std::to_string(H) +
                    " (valid: 0.." + std::to_string(H - 1) + ")");
    }

    HeatmapOptions opt;
    opt.key_tokens = tokens_from("--tokens", a.tokens, "--tokens-file", a.tokens_file);
    opt.query_tokens = tokens_from("--query-tokens", a.query_tokens, "--query-tokens-file", a.query_tokens_file);
    const bool have_keys = !opt.key_tokens.empty(), have_queries = !opt.query_tokens.empty();
    if (have_keys && static_cast<std::int64_t>(opt.key_tokens.size()) != Lk) {
        throw Error(std::string(a.tokens.empty() ? "--tokens-file" : "--tokens") + ": " + std::to_string(opt.key_tokens.size()) +
                    " tokens given but " + described + " has Lk = " + std::to_string(Lk) + " keys (columns)" +
                    (Lq != Lk && static_cast<std::int64_t>(opt.key_tokens.size()) == Lq
                         ? "; for cross-attention give the query tokens with --query-tokens"
                         : ""));
    }
    if (have_queries && static_cast<std::int64_t>(opt.query_tokens.size()) != Lq) {
        throw Error(std::string(a.query_tokens.empty() ? "--query-tokens-file" : "--query-tokens") + ": " +
                    std::to_string(opt.query_tokens.size()) + " tokens given but " + described + " has Lq = " +
                    std::to_string(Lq) + " queries (rows)");
    }
    if (!heatmap_label_ok(a.title)) throw Error("--title: expected UTF-8 text without NUL bytes but got " + detail::quoted(a.title));
    opt.vmax = a.vmax;
    if (a.vmax && !(*a.vmax > 0.0 && *a.vmax < 1e300)) {  // the colour bar's ticks need a finite range
        throw Error("--vmax: expected a number > 0 and < 1e300 but got " + given_number("--vmax", *a.vmax));
    }

    // Pick the panels: (P, Lq, Lk) as a view of batch b, or the mean over heads.
    const std::size_t es = dtype_size(w.dtype());
    const std::int64_t sq = st[static_cast<std::size_t>(s.rank - 2)], sk = st[static_cast<std::size_t>(s.rank - 1)];
    char* base = static_cast<char*>(w.data()) + static_cast<std::size_t>(b * sb) * es;
    TensorView panels;
    Tensor mean;
    std::string what;
    if (a.mean) {
        mean = Tensor(DType::f64, Shape{1, Lq, Lk}, true);
        const TensorView all(base, w.dtype(), Shape{H, Lq, Lk}, Strides{sh, sq, sk, 0});
        double* m = mean.data_as<double>();
        // Each weight is checked before it is averaged, as the drawing checks what it draws: a
        // mean let −1 and +1 through as a cell of 0, drawn hatched as "masked".
        for (std::int64_t h = 0; h < H; ++h) {
            for (std::int64_t i = 0; i < Lq; ++i) {
                for (std::int64_t j = 0; j < Lk; ++j) {
                    const double value = all.load_as_double(all.offset(h, i, j));
                    if (!std::isfinite(value) || value < 0.0) {  // (the check first: no message built per weight)
                        if (has_b) viz::require_drawable_weight(value, "weights: " + a.weights, {b, h, i, j});
                        else viz::require_drawable_weight(value, "weights: " + a.weights, {h, i, j});
                    }
                    m[i * Lk + j] += value / static_cast<double>(H);
                }
            }
        }
        panels = mean.view();
        what = "mean over " + std::to_string(H) + " heads";
    } else if (a.all_heads) {
        if (H > kHeatmapMaxPanels) {
            throw Error("--all-heads: at most " + std::to_string(kHeatmapMaxPanels) + " panels fit in one picture but " +
                        described + " has H = " + std::to_string(H) + " heads: draw one with --head N, or --mean");
        }
        panels = TensorView(base, w.dtype(), Shape{H, Lq, Lk}, Strides{sh, sq, sk, 0});
        if (H > 1) what = "all " + std::to_string(H) + " heads";
    } else {
        const std::int64_t h = a.head.value_or(0);
        panels = TensorView(base + static_cast<std::size_t>(h * sh) * es, w.dtype(), Shape{1, Lq, Lk}, Strides{0, sq, sk, 0});
        if (H > 1) what = "head " + std::to_string(h) + " of " + std::to_string(H);
    }
    if (B > 1) what = "batch " + std::to_string(b) + " of " + std::to_string(B) + (what.empty() ? "" : ", " + what);
    opt.title = a.title.empty() ? "Attention weights" : a.title;
    opt.subtitle = subtitle_name(a.weights) + " " + s.str() + (what.empty() ? "" : ": " + what);
    opt.name = a.weights + (what.empty() ? "" : " (" + what + ")");

    const HeatmapImage img = render_heatmap(panels, opt, image_format_for_path(a.out));
    outputs.write_bytes("--out", a.out, img.bytes);
    if (a.verbose) {
        std::fprintf(stderr, "attn heatmap: %s: %d x %d px, %zu panel(s), blocks %d x %d, vmax %.6g\n", a.out.c_str(), img.width,
                     img.height, img.panels.size(), img.block_rows, img.block_cols, img.vmax);
        for (std::size_t i = 0; i < img.panels.size(); ++i) {
            const auto& g = img.panels[i];
            std::fprintf(stderr, "panel %zu: x %d y %d cell %d x %d rows %d cols %d\n", i, g.x, g.y, g.cell_w, g.cell_h, g.rows,
                         g.cols);
        }
    }
}

}  // namespace

void add_heatmap_command(CLI::App& app) {
    auto args = std::make_shared<HeatmapArgs>();
    CLI::App* cmd = app.add_subcommand("heatmap", "Draw attention weights as a labelled heatmap (PNG or SVG)");
    // Both required; checked in run() so that the message says what to give (CLI11 would say
    // only "weights is required").
    cmd->add_option("weights", args->weights, "attention weights, .npy or FILE.safetensors:NAME: (Lq, Lk), (H, Lq, Lk) or (B, H, Lq, Lk) (required)");
    cmd->add_option("--out", args->out, "output picture: FILE.png or FILE.svg (required)");
    auto* tokens = cmd->add_option("--tokens", args->tokens, "key tokens (columns), comma-separated; also the query tokens when Lq = Lk");
    auto* tokens_file = cmd->add_option("--tokens-file", args->tokens_file, "key tokens, one per line (a regular file of at most 16 MiB)");
    tokens->excludes(tokens_file);
    auto* qtokens = cmd->add_option("--query-tokens", args->query_tokens, "query tokens (rows), comma-separated");
    auto* qtokens_file = cmd->add_option("--query-tokens-file", args->query_tokens_file, "query tokens, one per line (a regular file of at most 16 MiB)");
    qtokens->excludes(qtokens_file);
    auto* head = cmd->add_option("--head", args->head, "head to draw (default 0)");
    auto* mean = cmd->add_flag("--mean", args->mean, "draw the mean over heads");
    auto* all = cmd->add_flag("--all-heads", args->all_heads, "draw every head, as a grid of small multiples");
    head->excludes(mean)->excludes(all);
    mean->excludes(all);
    cmd->add_option("--batch", args->batch, "batch entry to draw (default 0)");
    cmd->add_flag("--batched", args->batched,
                  "a 3-d W is (B, Lq, Lk) — one map per batch entry, as `attn mha --weights` writes head-averaged "
                  "weights — instead of (H, Lq, Lk)");
    cmd->add_option("--title", args->title, "title above the picture");
    cmd->add_option("--vmax", args->vmax, "value drawn as the top colour (default: the largest weight drawn)");
    cmd->add_flag("--verbose", args->verbose, "print the picture's size and where the cells are");
    cmd->callback([args] { run(*args); });
}

}  // namespace attn::cli
