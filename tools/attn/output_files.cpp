#include "output_files.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <memory>

#include "attn/error.hpp"
#include "io/atomic_file.hpp"
#include "io/npy_writer.hpp"

namespace attn::cli {
namespace {

// The file a path names, independent of spelling: "o.npy", "./o.npy" and "sub/../o.npy" are
// one file. (weakly_canonical resolves the existing prefix, so the file need not exist yet.)
std::string identity(const std::string& path) {
    std::error_code ec;
    const std::filesystem::path p = std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec);
    return ec ? path : p.string();
}

}  // namespace

void OutputFiles::add(const std::string& flag, const std::string& path) {
    if (!path.empty()) files_.emplace_back(flag, path);
}

void OutputFiles::check() const {
    std::vector<detail::OutputTarget> targets;
    for (const auto& [flag, p] : files_) {
        try {
            targets.push_back(detail::resolve_output(p));
        } catch (const Error& e) {
            throw Error(flag + ": " + e.what());
        }
    }
    for (std::size_t i = 0; i < files_.size(); ++i) {
        const auto& [flag, p] = files_[i];
        // Two outputs into one device or FIFO (say /dev/null) just write one after the other;
        // two onto one regular file would lose one of them.
        for (std::size_t j = 0; j < i && !targets[i].direct; ++j) {
            if (identity(p) == identity(files_[j].second)) {
                throw Error(flag + ": path '" + p + "' names the same file as " + files_[j].first + " ('" +
                            files_[j].second + "')");
            }
        }
        if (targets[i].direct) continue;  // written in place: its directory is not touched
        const std::string& file = targets[i].file;
        const std::size_t slash = file.find_last_of('/');
        const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : file.substr(0, slash));
        if (::access(dir.c_str(), W_OK) != 0) {
            throw Error(flag + ": directory '" + dir + "' does not exist or is not writable");
        }
    }
}

// All or nothing, as far as the file system allows: every regular output is first written
// completely to its staging file, then devices and FIFOs get their bytes (those cannot be
// taken back), and only then are the staging files renamed into place. A failure before the
// renames (disk full, EFBIG, a reader that went away) removes every staging file and leaves
// every regular target untouched.
void OutputFiles::write_all(const std::vector<std::pair<std::string, TensorView>>& outputs) {
    std::vector<std::unique_ptr<detail::AtomicFile>> files;
    for (int pass = 0; pass < 2; ++pass) {  // pass 0: staged files; pass 1: devices and FIFOs
        for (const auto& [path, view] : outputs) {
            if (detail::resolve_output(path).direct != (pass == 1)) continue;
            files.push_back(std::make_unique<detail::AtomicFile>(path));
            detail::write_npy_into(*files.back(), view);
            files.back()->finish();
        }
    }
    for (auto& f : files) f->publish();
}

}  // namespace attn::cli
