#include "output_files.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "attn/error.hpp"
#include "attn/npy.hpp"

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
    for (std::size_t i = 0; i < files_.size(); ++i) {
        const auto& [flag, p] = files_[i];
        for (std::size_t j = 0; j < i; ++j) {
            if (identity(p) == identity(files_[j].second)) {
                throw Error(flag + ": path '" + p + "' names the same file as " + files_[j].first + " ('" +
                            files_[j].second + "')");
            }
        }
        struct stat st {};
        if (::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
            throw Error(flag + ": '" + p + "' is a directory, not a file");
        }
        const std::size_t slash = p.find_last_of('/');
        const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : p.substr(0, slash));
        if (::access(dir.c_str(), W_OK) != 0) {
            throw Error(flag + ": directory '" + dir + "' does not exist or is not writable");
        }
    }
}

// All or nothing, as far as the file system allows: every output is first written completely
// to a staging file beside its target (write_npy is itself atomic), and only when all of them
// exist are they renamed into place. A failure while writing (disk full, a target that turned
// into a directory) removes the staging files and leaves every target untouched.
void OutputFiles::write_all(const std::vector<std::pair<std::string, TensorView>>& outputs) {
    std::vector<std::string> staged;
    auto discard = [&staged] {
        for (const std::string& s : staged) ::unlink(s.c_str());
    };
    try {
        for (const auto& [path, view] : outputs) {
            const std::size_t slash = path.find_last_of('/');
            const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
            const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
            std::string name = dir + "." + base + ".stage.XXXXXX";
            const int fd = ::mkstemp(name.data());
            if (fd < 0) throw Error(path + ": cannot create output file (" + std::strerror(errno) + ")");
            ::close(fd);
            staged.push_back(name);
            write_npy(name, view);
        }
        for (std::size_t i = 0; i < outputs.size(); ++i) {
            struct stat st {};
            if (::stat(outputs[i].first.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
                throw Error(outputs[i].first + ": is a directory, not a file");
            }
        }
    } catch (...) {
        discard();
        throw;
    }
    for (std::size_t i = 0; i < outputs.size(); ++i) {
        if (std::rename(staged[i].c_str(), outputs[i].first.c_str()) != 0) {
            const int e = errno;
            staged.erase(staged.begin(), staged.begin() + static_cast<std::ptrdiff_t>(i));
            discard();
            throw Error(outputs[i].first + ": cannot move the finished file into place (" + std::strerror(e) + ")");
        }
    }
}

}  // namespace attn::cli
