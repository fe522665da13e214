#include "command_path.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace attn::cli {

std::string command_path(const std::string& name) {
    if (name.empty() || name.find('/') != std::string::npos) return name;
    std::string path;
    if (const char* env = std::getenv("PATH")) {
        path = env;
    } else if (const std::size_t n = ::confstr(_CS_PATH, nullptr, 0); n > 0) {  // as execvp: the default path
        path.resize(n);  // with its terminating NUL
        ::confstr(_CS_PATH, path.data(), n);
        path.pop_back();
    }
    std::size_t begin = 0;
    while (begin <= path.size()) {
        std::size_t end = path.find(':', begin);
        if (end == std::string::npos) end = path.size();
        const std::string dir = path.substr(begin, end - begin);
        const std::string file = (dir.empty() ? "." : dir) + "/" + name;
        struct stat st {};
        if (::stat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(file.c_str(), X_OK) == 0) return file;
        begin = end + 1;
    }
    return {};
}

}  // namespace attn::cli
