#include "output_files.hpp"

#include <unistd.h>

#include "attn/error.hpp"
#include "attn/npy.hpp"

namespace attn::cli {

void OutputFiles::add(const std::string& flag, const std::string& path) {
    if (!path.empty()) files_.emplace_back(flag, path);
}

void OutputFiles::check() const {
    for (std::size_t i = 0; i < files_.size(); ++i) {
        for (std::size_t j = 0; j < i; ++j) {
            if (files_[i].second == files_[j].second) {
                throw Error(files_[i].first + ": path '" + files_[i].second + "' is also given to " + files_[j].first);
            }
        }
        const std::string& p = files_[i].second;
        const std::size_t slash = p.find_last_of('/');
        const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : p.substr(0, slash));
        if (::access(dir.c_str(), W_OK) != 0) {
            throw Error(files_[i].first + ": directory '" + dir + "' does not exist or is not writable");
        }
    }
}

void OutputFiles::write_all(const std::vector<std::pair<std::string, TensorView>>& outputs) {
    for (const auto& [path, view] : outputs) write_npy(path, view);
}

}  // namespace attn::cli
