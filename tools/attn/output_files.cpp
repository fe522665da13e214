#include "core/check.hpp"
#include "output_files.hpp"

#include <fcntl.h>
#include <linux/kcmp.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "attn/error.hpp"
#include "attn/npy.hpp"
#include "io/atomic_file.hpp"
#include "io/tensor_writers.hpp"
#include "tensor_args.hpp"

namespace attn::cli {
namespace {

// The file a path names, independent of spelling: "o.npy", "./o.npy" and "sub/../o.npy" are
// one file. (weakly_canonical resolves the existing prefix, so the file need not exist yet.)
std::string identity(const std::string& path) {
    std::error_code ec;
    const std::filesystem::path p = std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec);
    return ec ? path : p.string();
}

// The regular file an output lands on, when one exists: its (device, inode) as resolve_output
// found them — through the descriptor for /dev/stdout and the like, whose file a shell redirect chose.
std::optional<std::pair<dev_t, ino_t>> regular_file_of(const detail::OutputTarget& t) {
    if (t.type != S_IFREG) return std::nullopt;
    return std::pair{t.dev, t.ino};
}

// The regular file a descriptor is open on, as regular_file_of says of an output.
std::optional<std::pair<dev_t, ino_t>> regular_file_behind(int fd) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) return std::nullopt;
    return regular_file_of(detail::OutputTarget{"", true, fd, st.st_mode & S_IFMT, st.st_dev, st.st_ino});
}

// Whether two outputs written through descriptors come out one after the other, as one stream
// (docs/conventions.md, "Two outputs on one file"): one descriptor named twice; two sharing one
// open file, so one offset (`> f 2>&1`: kcmp(KCMP_FILE) tells, where the kernel has kcmp and lets
// a process compare its own descriptors — else refused, as before); or two in append mode
// (`>> f 2>> f`), each write at the end whatever the other wrote. Two with an offset each
// (`1> f 2> f`, `<> f`) would write the second output over the first.
bool one_stream(const detail::OutputTarget& a, const detail::OutputTarget& b) {
    if (a.descriptor < 0 || b.descriptor < 0) return false;
    if (a.descriptor == b.descriptor) return true;
    const int fa = ::fcntl(a.descriptor, F_GETFL), fb = ::fcntl(b.descriptor, F_GETFL);
    if (fa != -1 && fb != -1 && (fa & O_APPEND) != 0 && (fb & O_APPEND) != 0) return true;
    const pid_t self = ::getpid();
    return ::syscall(SYS_kcmp, self, self, KCMP_FILE, a.descriptor, b.descriptor) == 0;
}

bool is_safetensors(const std::string& path) {
    constexpr std::string_view kExt = ".safetensors";
    return path.size() >= kExt.size() && path.compare(path.size() - kExt.size(), kExt.size(), kExt) == 0;
}

std::string tensor_name(const std::string& flag) {  // "--out" → "out"
    const std::size_t start = flag.find_first_not_of('-');
    return start == std::string::npos ? "tensor" : flag.substr(start);
}

// A file system error names the option too (check() cannot foresee every one: /proc refuses new
// files although access() says it is writable).
template <typename Step>
void naming(const std::string& flag, const Step& step) {
    try {
        step();
    } catch (const Error& e) {
        throw Error(flag + ": " + e.what());
    }
}

}  // namespace

// A FIFO that several outputs name (however spelt), or that one output writes in several calls
// (write_bytes), is opened once, when its first bytes are written, and kept open until the
// OutputFiles ends: opened and closed for each, its reader could take the first close for the end
// of the stream, and the next open would then wait for a reader that never comes. (A device named
// twice is opened once per spelling: a close ends nothing there.)
class OpenFifos {
public:
    OpenFifos() = default;
    OpenFifos(const OpenFifos&) = delete;
    OpenFifos& operator=(const OpenFifos&) = delete;
    ~OpenFifos() {
        for (const auto& f : open_) ::close(f.second);
    }
    // `t` unchanged unless it is a FIFO named by path; else a target writing into its one descriptor.
    detail::OutputTarget through_one_open(const std::string& path, const detail::OutputTarget& t) {
        if (t.type != S_IFIFO || t.descriptor >= 0) return t;
        const std::pair file{t.dev, t.ino};
        auto it = std::find_if(open_.begin(), open_.end(), [&](const auto& f) { return f.first == file; });
        if (it == open_.end()) {
            const int fd = detail::open_direct(path, t);
            open_.emplace_back(file, fd);
            it = open_.end() - 1;
        }
        detail::OutputTarget one = t;
        one.descriptor = it->second;
        return one;
    }

private:
    std::vector<std::pair<std::pair<dev_t, ino_t>, int>> open_;
};

OutputFiles::OutputFiles() : fifos_(std::make_unique<OpenFifos>()) {}

OutputFiles::~OutputFiles() {
    for (const auto& [path, fd] : devices_) ::close(fd);
}

void OutputFiles::add(const std::string& flag, const std::string& path) {
    if (!path.empty()) files_.emplace_back(flag, path);
}

void OutputFiles::add_input(const std::string& flag, const std::string& path) {
    if (!path.empty()) inputs_.emplace_back(flag, path);
}

void OutputFiles::check() {
    std::vector<detail::OutputTarget> targets;
    // Named pairs, not structured bindings: clang 14 (the fuzz build) cannot capture a binding in a lambda.
    for (const auto& file : files_) naming(file.first, [&] { targets.push_back(detail::resolve_output(file.second)); });
    // What the pairs below compare, found once per output.
    std::vector<std::optional<std::pair<dev_t, ino_t>>> landings;
    std::vector<std::string> identities;
    for (const detail::OutputTarget& t : targets) {
        landings.push_back(regular_file_of(t));
        identities.push_back(t.direct ? std::string() : identity(t.file));
    }
    for (std::size_t i = 0; i < files_.size(); ++i) {
        const auto& [flag, p] = files_[i];
        const auto& landing = landings[i];
        // Two outputs into one device or FIFO (say /dev/null), or into one stream of descriptors
        // (one_stream), just write one after the other (a FIFO opened once: see OpenFifos); two
        // onto one regular file otherwise would lose one of them, however each is spelt (a link, a
        // descriptor): a staged one renamed over the other, or two descriptors open on the file
        // each at its own offset (`1> f 2> f`, `<> f`), the second written over the first.
        for (std::size_t j = 0; j < i; ++j) {
            const bool same_path = !targets[i].direct && !targets[j].direct && identities[i] == identities[j];
            if (same_path || (!one_stream(targets[i], targets[j]) && landing && landing == landings[j])) {
                const bool descriptors = targets[i].descriptor >= 0 && targets[j].descriptor >= 0;
                throw Error(flag + ": path " + detail::quoted_path(p) + " names the same file as " + files_[j].first + " (" +
                            detail::quoted_path(files_[j].second) + ")" +
                            (descriptors ? " (descriptors " + std::to_string(targets[j].descriptor) + " and " +
                                               std::to_string(targets[i].descriptor) + " are open on one regular file)"
                                         : ""));
            }
        }
        // Writing over an input, or into it through a descriptor, would lose it (an existing file
        // only: a new one is no input).
        if (landing) {
            for (const auto& [in_flag, in_path] : inputs_) {
                struct stat in_st {};
                if (::stat(in_path.c_str(), &in_st) == 0 && std::pair{in_st.st_dev, in_st.st_ino} == *landing) {
                    throw Error(flag + ": path " + detail::quoted_path(p) + " names the same file as the input " + in_flag + " (" +
                                detail::quoted_path(in_path) + "), which it would " + (targets[i].direct ? "overwrite" : "replace"));
                }
            }
        }
        if (targets[i].direct) continue;  // written in place: its directory is not touched
        const std::string& file = targets[i].file;
        const std::size_t slash = file.find_last_of('/');
        const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : file.substr(0, slash));
        struct stat dir_st {};
        if (::stat(dir.c_str(), &dir_st) == 0 && !S_ISDIR(dir_st.st_mode)) {
            throw Error(flag + ": " + detail::quoted_path(dir) + " is not a directory (in the path " + detail::quoted_path(p) + ")");
        }
        if (::access(dir.c_str(), W_OK) != 0) {
            // ENOENT, EACCES, EROFS — or ENAMETOOLONG, which is no directory's fault (a path past
            // PATH_MAX was refused by resolve_output).
            const int err = errno;
            if (err == ENAMETOOLONG) {  // one of the directories' names is past NAME_MAX
                throw Error(flag + ": a directory name in " + detail::quoted(dir) + ": " + std::strerror(err));
            }
            throw Error(flag + ": directory " + detail::quoted_path(dir) + " does not exist or is not writable (" + std::strerror(err) + ")");
        }
        const std::string name = slash == std::string::npos ? file : file.substr(slash + 1);
        const long name_max = ::pathconf(dir.c_str(), _PC_NAME_MAX);
        if (name_max > 0 && name.size() > static_cast<std::size_t>(name_max)) {
            throw Error(flag + ": " + detail::quoted(name, 40) + ": File name too long (" + std::to_string(name.size()) +
                        " bytes; directory " + detail::quoted_path(dir) + " allows " + std::to_string(name_max) + ")");
        }
    }
    // A shell redirect onto an output (`--out o.npy > o.npy`): the rename would replace the file
    // stdout or stderr is open on, and what attn prints there (bench's report, --verbose, a
    // warning) would be lost with the old file. Written through the descriptor instead
    // (--out /dev/stdout), the output stays beside the text.
    for (const auto& [stream, fd] : {std::pair{"stdout", 1}, std::pair{"stderr", 2}}) {
        const auto redirected = regular_file_behind(fd);
        for (std::size_t i = 0; i < files_.size() && redirected; ++i) {
            if (targets[i].direct || landings[i] != redirected) continue;
            const auto& [flag, p] = files_[i];
            throw Error(flag + ": path " + detail::quoted_path(p) + " names the file " + stream + " is redirected to, which it would replace, " +
                        "losing what attn prints there: redirect " + stream + " to another file");
        }
    }
    // Every path accepted: the character devices are opened now (see the header), each once; the
    // FIFOs when written, as the file found here.
    for (std::size_t i = 0; i < files_.size(); ++i) {
        const std::string& flag = files_[i].first;
        const std::string& p = files_[i].second;
        // A device by its type as resolve_output found it: the open's fstat (open_direct) tells
        // whether it still is one; a stat of the path in between would tell nothing more.
        if (!targets[i].direct || targets[i].descriptor >= 0 || targets[i].type != S_IFCHR ||
            std::any_of(devices_.begin(), devices_.end(), [&](const auto& d) { return d.first == p; }))
            continue;
        // Kept through the computation: open_direct never gives it a standard stream's number.
        int fd = -1;
        naming(flag, [&] { fd = detail::open_direct(p, targets[i]); });
        devices_.emplace_back(p, fd);
    }
    checked_ = std::move(targets);
}

detail::OutputTarget OutputFiles::target_of(const std::string& path) const {
    for (const auto& [p, fd] : devices_)
        if (p == path) return detail::OutputTarget{path, true, fd};
    // The file check() found — a FIFO, a regular file, a new name, a descriptor —, never looked up
    // again by name: the write checks on the file it opens (or replaces) that it is that one
    // (detail::open_direct, AtomicFile::publish), so a FIFO or a link put in its place in between is
    // refused, not written unchecked.
    for (std::size_t i = 0; i < checked_.size(); ++i)
        if (files_[i].second == path) return checked_[i];
    return detail::resolve_output(path);
}

void OutputFiles::require_safetensors(const std::string& flag, const std::string& path) {
    if (!path.empty() && !is_safetensors(path)) {
        throw Error(flag + ": " + detail::quoted_path(path) + " would hold several tensors, which only safetensors holds: give a path ending "
                    "in .safetensors");
    }
}

void OutputFiles::check_dtype(const std::string& flag, const std::string& path, DType dtype,
                              const std::vector<DType>& out_dtypes) {
    if (path.empty()) return;
    if (is_safetensors(path)) {
        if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16) {
            throw Error(flag + ": " + detail::quoted_path(path) + " would hold " + std::string(dtype_name(dtype)) +
                        ", but attn writes safetensors as float32, float16 or bfloat16 (use a .npy path)");
        }
    } else if (!npy_holds(dtype)) {
        std::vector<DType> in_npy;  // the --out-dtype values a .npy output can be given
        for (const DType d : out_dtypes)
            if (npy_holds(d)) in_npy.push_back(d);
        throw Error(flag + ": " + detail::quoted_path(path) + " would hold " + std::string(dtype_name(dtype)) +
                    ", which .npy cannot store: give a path ending in .safetensors" +
                    (in_npy.empty() ? "" : ", or --out-dtype " + dtype_list(in_npy)));
    }
}

void OutputFiles::write_bytes(const std::string& flag, const std::string& path, const std::string& bytes) const {
    naming(flag, [&] {
        detail::AtomicFile file(path, fifos_->through_one_open(path, target_of(path)));
        file.write(bytes.data(), bytes.size());
        file.commit();
    });
}

// All or nothing, as far as the file system allows: every regular output is first written
// completely to its staging file, then devices and FIFOs get their bytes (those cannot be
// taken back), and only then are the staging files renamed into place. A failure before the
// renames (disk full, EFBIG, a reader that went away) removes every staging file and leaves
// every regular target untouched.
void OutputFiles::write_all(const std::vector<Output>& outputs) const { stage(outputs).publish(); }

OutputFiles::Staged::Staged() = default;
OutputFiles::Staged::Staged(Staged&&) noexcept = default;
OutputFiles::Staged& OutputFiles::Staged::operator=(Staged&&) noexcept = default;
OutputFiles::Staged::~Staged() = default;

OutputFiles::Staged OutputFiles::stage(const std::vector<Output>& outputs) const {
    for (const Output& o : outputs) {
        if (o.tensors.empty()) check_dtype(o.flag, o.path, o.view.dtype(), {});
        if (!o.tensors.empty()) require_safetensors(o.flag, o.path);
        for (const auto& [name, t] : o.tensors) check_dtype(o.flag, o.path, t.dtype(), {});
    }
    // Each path resolved once: which pass writes it, and the file its AtomicFile writes.
    std::vector<detail::OutputTarget> targets;
    targets.reserve(outputs.size());
    for (const Output& o : outputs) naming(o.flag, [&] { targets.push_back(target_of(o.path)); });
    Staged staged;
    std::vector<std::unique_ptr<detail::AtomicFile>>& files = staged.files_;
    for (int pass = 0; pass < 2; ++pass) {  // pass 0: staged files; pass 1: devices and FIFOs
        for (std::size_t i = 0; i < outputs.size(); ++i) {
            const Output& o = outputs[i];
            if (targets[i].direct != (pass == 1)) continue;
            naming(o.flag, [&] {
                targets[i] = fifos_->through_one_open(o.path, targets[i]);
                if (is_safetensors(o.path)) {
                    const std::vector<std::pair<std::string, TensorView>> one{{tensor_name(o.flag), o.view}};
                    const auto& tensors = o.tensors.empty() ? one : o.tensors;
                    const detail::SafetensorsHeader header = detail::safetensors_header(o.path, tensors, {}, true);
                    files.push_back(std::make_unique<detail::AtomicFile>(o.path, targets[i]));
                    detail::write_safetensors_into(*files.back(), header, tensors, true);
                } else {
                    files.push_back(std::make_unique<detail::AtomicFile>(o.path, targets[i]));
                    detail::write_npy_into(*files.back(), o.view);
                }
                files.back()->finish();
            });
            staged.flags_.push_back(o.flag);
        }
    }
    return staged;
}

void OutputFiles::Staged::publish() {
    // Every rename first, then each directory synced once (the outputs usually share one). The
    // directories are gathered before the first rename: nothing may fail after the files are in place.
    std::vector<std::string> dirs;
    for (const auto& f : files_) {
        if (!f->direct() && std::find(dirs.begin(), dirs.end(), f->directory()) == dirs.end()) dirs.push_back(f->directory());
    }
    const auto sync = [&dirs]() noexcept {
        for (const std::string& d : dirs) detail::sync_directory(d);
    };
    try {
        for (std::size_t i = 0; i < files_.size(); ++i) naming(flags_[i], [&] { files_[i]->publish(/*sync_directory=*/false); });
    } catch (...) {
        sync();  // those already in place stay there
        throw;
    }
    sync();
}

}  // namespace attn::cli
