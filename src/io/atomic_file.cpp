#include "atomic_file.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "../core/check.hpp"
#include "attn/error.hpp"
#include "file_kind.hpp"
#include "pseudo_file_system.hpp"
#include "staging_files.hpp"

namespace attn::detail {
namespace {

// "a/b/c.npy" → ("a/b/", "c.npy"); "c.npy" → ("", "c.npy").
std::pair<std::string, std::string> split_dir(const std::string& path) {
    const std::size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return {"", path};
    return {path.substr(0, slash + 1), path.substr(slash + 1)};
}

// The longest path the system takes (PATH_MAX counts the terminating NUL).
constexpr std::size_t kPathBytes = PATH_MAX - 1;
const std::string kStagingSuffix = ".tmp.XXXXXX";

// The staging file's name: hidden, beside the target (rename stays on one file system), within
// NAME_MAX however long the target's name is, and within PATH_MAX however long its path is — the
// target's name is cut, not the suffix. (A target path a few bytes below PATH_MAX is valid; its
// staging name, 12 bytes longer, failed at the rename, after the command's other outputs had
// been renamed into place.) Empty when not even one byte of the name fits beside the directory:
// resolve_output refuses such a target, so a staged AtomicFile always has a staging name.
std::string staging_template(const std::string& file) {
    const auto [dir, base] = split_dir(file);
    const long limit = ::pathconf(dir.empty() ? "." : dir.c_str(), _PC_NAME_MAX);
    const std::size_t name_max = limit > 0 ? static_cast<std::size_t>(limit) : 255;
    const std::size_t fixed = dir.size() + 1 + kStagingSuffix.size();  // the directory, '.', the suffix
    if (fixed >= kPathBytes) return {};
    const std::size_t room = std::min(name_max > kStagingSuffix.size() + 2 ? name_max - kStagingSuffix.size() - 1 : 1,
                                      kPathBytes - fixed);
    return dir + "." + base.substr(0, room) + kStagingSuffix;
}

// Follows the symbolic links `path` itself is (its last component's, not its directories'),
// asking `stop` of the path and then of each link's target in turn: the first hop it stops at,
// or the first that is no link (or whose link cannot be read); nullopt past the kernel's own
// limit of 40 links (a loop).
template <typename Stop>
std::optional<std::filesystem::path> follow_links(const std::string& path, const Stop& stop) {
    std::filesystem::path p = path;
    for (int links = 0;; ++links) {
        struct stat st {};
        if (stop(p.string()) || ::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
        if (links == 40) return std::nullopt;
        std::error_code ec;
        const std::filesystem::path to = std::filesystem::read_symlink(p, ec);
        if (ec) return p;
        p = to.is_absolute() ? to : p.parent_path() / to;
    }
}

// Where a symbolic link that points at nothing (yet) leads: the file to create, so that the
// link stays and comes to point at the new file (canonical() fails on such a link).
std::string dangling_link_target(const std::string& path) {
    const auto end = follow_links(path, [](const std::string&) { return false; });
    if (!end) throw Error(detail::quoted_path(path) + ": too many levels of symbolic links");
    std::error_code ec;
    const std::filesystem::path w = std::filesystem::weakly_canonical(*end, ec);
    return ec ? end->string() : w.string();
}

// Why no rename can replace `path` (a mount point: EBUSY; immutable or append-only: EPERM) or,
// for a directory (whose being a mount point is no matter), put a file in it or remove one — in
// words for a message, or empty: nothing, or nothing statx can tell (no mount points before
// Linux 5.8).
std::string unreplaceable(const std::string& path, bool directory) {
#ifdef STATX_ATTR_IMMUTABLE
    struct statx stx {};
    if (::statx(AT_FDCWD, path.c_str(), 0, STATX_BASIC_STATS, &stx) != 0) return {};
    const std::uint64_t set = stx.stx_attributes & stx.stx_attributes_mask;
#ifdef STATX_ATTR_MOUNT_ROOT  // Linux 5.8's headers: without them the other attributes still count
    if (!directory && (set & STATX_ATTR_MOUNT_ROOT) != 0) return "a mount point (a file mounted over that name)";
#else
    (void)directory;
#endif
    if ((set & STATX_ATTR_IMMUTABLE) != 0) return "immutable (chattr +i)";
    if ((set & STATX_ATTR_APPEND) != 0) return "append-only (chattr +a)";
#else
    (void)path;
    (void)directory;
#endif
    return {};
}

// The number `s` is (decimal digits only), or -1.
int decimal(std::string_view s) {
    int n = -1;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
    return ec == std::errc() && end == s.data() + s.size() && n >= 0 ? n : -1;
}

// Removes `prefix` from the front of `s` if it is there.
bool consume(std::string_view& s, std::string_view prefix) {
    if (s.substr(0, prefix.size()) != prefix) return false;
    s.remove_prefix(prefix.size());
    return true;
}

// The descriptor a name spells, or -1: /dev/stdin 0, /dev/stdout 1, /dev/stderr 2, /dev/fd/N (these
// without /proc too), and N in a directory that is, however spelt (/dev/fd, /proc/self/fd,
// /proc/thread-self/fd, /proc/PID/task/TID/fd, with //, .. or a relative path), /proc/T/fd or
// /proc/P/task/T/fd where T is one of this process's threads (they share one descriptor table) —
// a malformed N: -1. The directory is compared resolved: a spelling the names missed (/dev//fd/0,
// /proc/self/fd/../fd/0) was followed to the file the descriptor is open on, and replaced it.
int descriptor_spelt(const std::string& path) {
    if (path == "/dev/stdin") return 0;
    if (path == "/dev/stdout") return 1;
    if (path == "/dev/stderr") return 2;
    std::string_view rest = path;
    if (consume(rest, "/dev/fd/")) return decimal(rest);
    const auto [dir, name] = split_dir(path);
    std::error_code ec;
    const std::string real = std::filesystem::canonical(dir.empty() ? "." : dir, ec).string();
    if (ec) return -1;
    rest = real;
    if (!consume(rest, "/proc/")) return -1;
    std::string_view thread = rest.substr(0, rest.find('/'));  // /proc/T/fd or /proc/P/task/T/fd
    rest.remove_prefix(thread.size());
    if (consume(rest, "/task/")) {
        thread = rest.substr(0, rest.find('/'));
        rest.remove_prefix(thread.size());
    }
    // /proc/self/task lists this process's threads only.
    if (rest != "/fd" || decimal(thread) < 0 || ::access(("/proc/self/task/" + std::string(thread)).c_str(), F_OK) != 0)
        return -1;
    return decimal(name);
}

// The descriptor a path names, spelt so itself or through its own symbolic links (a link to
// /dev/stdout, so named for its extension), or -1. Each spelling is caught before the link to
// /proc's magic link is read: canonical() followed /dev/stdin to the file stdin was redirected
// from, which the rename then replaced (a shell's `> /dev/stdin` writes into descriptor 0).
// Another process's /proc/P/fd/N is no descriptor of ours: it is followed to what it is open on,
// as a shell's open follows it.
int named_descriptor(const std::string& path) {
    int fd = -1;
    (void)follow_links(path, [&fd](const std::string& hop) { return (fd = descriptor_spelt(hop)) >= 0; });
    return fd;
}

// AtomicFile::unnamed_ while an O_TMPFILE file is written (finish() keeps its descriptor then).
constexpr int kUnnamedWriting = -2;

// Termination signals wait while a staging name is made and recorded (the registry the handler
// reads), so that none arrives between the two and leaves an unrecorded staging file behind.
class TerminationSignalsHeld {
public:
    TerminationSignalsHeld() {
        sigset_t block;
        sigemptyset(&block);
        for (const int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&block, sig);
        ::pthread_sigmask(SIG_BLOCK, &block, &old_);
    }
    ~TerminationSignalsHeld() { ::pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
    TerminationSignalsHeld(const TerminationSignalsHeld&) = delete;
    TerminationSignalsHeld& operator=(const TerminationSignalsHeld&) = delete;

private:
    sigset_t old_;
};

}  // namespace

// Why a target that cannot be renamed over is refused.
constexpr const char* kReplacedWhole = ", and attn replaces an output whole (a new file written beside it, then renamed over it)";

OutputTarget resolve_output(const std::string& path) {
    if (path.empty()) throw Error("an empty path names no file");
    OutputTarget t{path, false};
    struct stat st {};
    const auto found = [&t](const struct stat& s) {
        t.type = s.st_mode & S_IFMT;
        t.dev = s.st_dev;
        t.ino = s.st_ino;
    };
    if (const int fd = named_descriptor(path); fd >= 0) {
        if (::fstat(fd, &st) != 0) throw Error(detail::quoted_path(path) + " names descriptor " + std::to_string(fd) + ", which is not open");
        found(st);
        if (S_ISDIR(st.st_mode)) throw Error(detail::quoted_path(path) + " is descriptor " + std::to_string(fd) + ", open on a directory");
        // Refused here, before a command computes: opening it for writing failed (EINVAL) only at the end.
        if (const int flags = ::fcntl(fd, F_GETFL); flags != -1 && (flags & O_ACCMODE) == O_RDONLY) {
            throw Error(detail::quoted_path(path) + " is descriptor " + std::to_string(fd) + ", which is open read-only, not for writing");
        }
        t.direct = true;  // written into as a shell redirect would: a file, device, FIFO or socket
        t.descriptor = fd;
        return t;
    }
    if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
        // Follow the link, so that the rename replaces the file it points to and not the link
        // (and /dev/stdout → /proc/self/fd/1 → a terminal or pipe is seen as what it is).
        std::error_code ec;
        const std::filesystem::path real = std::filesystem::canonical(path, ec);
        if (!ec) {
            t.file = real.string();
        } else if (::stat(path.c_str(), &st) != 0) {  // not /proc's magic links: they work
            // A dangling link: its target is created. Any other failure (a loop, a component that
            // is not a directory, no permission) is an error, as a shell redirect gives one: the
            // rename replaced the link with a regular file.
            if (errno != ENOENT) {
                throw Error(detail::quoted_path(path) + " is a symbolic link whose target cannot be reached (" + std::strerror(errno) + ")");
            }
            t.file = dangling_link_target(path);
        }
    }
    if (::stat(t.file.c_str(), &st) == 0) {
        found(st);
        if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
            // Its permission, as the directory's is for a staged file, told before a command
            // computes: the open failed (EACCES) only at the end. (The open may still fail for a
            // reason no permission tells: a device with nothing behind it, ENXIO.)
            if (::access(t.file.c_str(), W_OK) != 0) {
                throw Error(detail::quoted_path(path) + " is " + describe_file_kind(st.st_mode) + " attn may not write (" +
                            std::strerror(errno) + ")");
            }
            t.direct = true;
            return t;
        }
        if (S_ISDIR(st.st_mode)) throw Error(detail::quoted_path(path) + " is a directory, not a file");
        if (!S_ISREG(st.st_mode)) {
            throw Error(detail::quoted_path(path) + " is " + describe_file_kind(st.st_mode) +
                        "; outputs may be regular files (replaced whole), character devices or FIFOs (written into)");
        }
        // Refused here, before anything is computed: the rename failed after the computation, and
        // after the command's other outputs had been renamed into place.
        if (const std::string why = unreplaceable(t.file, false); !why.empty())
            throw Error(detail::quoted_path(path) + " is " + why + ", which no rename can replace" + kReplacedWhole);
        // In a sticky directory (/tmp) only the file's owner, the directory's or root may rename
        // over it, though anyone may write into it when it is world-writable (a shell redirect does).
        const std::string dir = split_dir(t.file).first;
        struct stat dir_st {};
        const uid_t me = ::geteuid();
        if (::stat(dir.empty() ? "." : dir.c_str(), &dir_st) == 0 && (dir_st.st_mode & S_ISVTX) != 0 && me != 0 &&
            dir_st.st_uid != me && st.st_uid != me) {
            throw Error(detail::quoted_path(path) + " belongs to another user (uid " + std::to_string(st.st_uid) +
                        ") in the sticky directory " + detail::quoted_path(dir.empty() ? "." : dir) + ", where only its owner may rename over it" +
                        kReplacedWhole);
        }
    }
    if (split_dir(t.file).second.empty()) throw Error(detail::quoted_path(path) + " names a directory, not a file");
    // Checked here, with the other paths, before a command computes (the path is too long to quote).
    if (t.file.size() > kPathBytes) {
        throw Error("path of " + std::to_string(t.file.size()) + " bytes: " + std::strerror(ENAMETOOLONG) +
                    " (the system allows " + std::to_string(kPathBytes) + " bytes)");
    }
    if (staging_template(t.file).empty()) {
        throw Error("path of " + std::to_string(t.file.size()) + " bytes: " + std::strerror(ENAMETOOLONG) +
                    " for the staging file written beside it first (its directory's path, " +
                    std::to_string(split_dir(t.file).first.size()) + " bytes, leaves less than the " +
                    std::to_string(kStagingSuffix.size() + 2) + " bytes of a staging name within the system's " +
                    std::to_string(kPathBytes) + ")");
    }
    // The directory, where the staging file is made and renamed: another process's /proc/PID/fd/N
    // open on a deleted file is itself to be replaced, and statfs of the path would follow the
    // link to the deleted file's own file system. Where access() calls such a directory writable
    // (root, /proc/PID/fd, sysfs), the output failed only when created, after the computation.
    if (const std::string dir = split_dir(t.file).first; const char* fs = pseudo_file_system(dir)) {
        throw Error(detail::quoted_path(path) + " is on " + fs + " (" + detail::quoted_path(dir.empty() ? "." : dir) +
                    "), a kernel pseudo file system, where no output can be written and renamed into place: attn writes "
                    "results to regular files of other file systems, character devices, FIFOs or open descriptors");
    }
    if (const std::string dir = split_dir(t.file).first, why = unreplaceable(dir.empty() ? "." : dir, true); !why.empty()) {
        throw Error(detail::quoted_path(path) + ": its directory is " + why + ", where no file can be renamed into place or removed" +
                    kReplacedWhole);
    }
    return t;
}

namespace {
// The staged file gets its final permissions while no one else can reach it (unnamed, or 0600
// from mkstemp): a replaced file's permission bits (a private 0600 result stays private, as with
// `cmd > file`) and, where the process may (root), its owner and group; a new file 0666 & ~umask.
void give_permissions_of(const std::string& target, int fd) {
    struct stat st {};
    if (::stat(target.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
        if (::geteuid() == 0) (void)!::fchown(fd, st.st_uid, st.st_gid);
        ::fchmod(fd, st.st_mode & 0777);
        return;
    }
    const mode_t mask = ::umask(0);
    ::umask(mask);
    ::fchmod(fd, 0666 & ~mask);
}

// Whether `st` is the file resolve_output found for `t`: its type, device and inode.
bool is_checked_file(const struct stat& st, const OutputTarget& t) {
    return (st.st_mode & S_IFMT) == t.type && st.st_dev == t.dev && st.st_ino == t.ino;
}

Error replaced_since_checked(const std::string& path, const OutputTarget& t, const struct stat& now) {
    const std::string was = describe_file_kind(t.type), is = describe_file_kind(now.st_mode);
    if (t.type == 0) {
        return Error(detail::quoted_path(path) + " did not exist when checked but is " + is +
                     " now (made in between); nothing was written");
    }
    return Error(detail::quoted_path(path) + " was " + was + " when checked but is " + (was == is ? "another one" : is) +
                 " now (replaced in between); nothing was written");
}
}  // namespace

int open_direct(const std::string& path, const OutputTarget& target) {
    // No O_CREAT, no O_TRUNC: a device or FIFO is written into, never created or replaced.
    // A FIFO's open waits for a reader, as `cmd > fifo` does. A device is opened non-blocking
    // (cleared once it is known to be that device): a FIFO put in its place would otherwise make
    // the open wait for a reader that may never come, before the check below could refuse it.
    const bool device = target.type == S_IFCHR;
    int fd = -1;
    do fd = ::open(target.file.c_str(), O_WRONLY | O_NOCTTY | O_CLOEXEC | (device ? O_NONBLOCK : 0));
    while (fd < 0 && errno == EINTR);
    const int open_errno = errno;
    // The file opened must be the one resolve_output checked (its type, device and inode): another
    // put in its place in between — a FIFO for a device, a regular file for a FIFO — was written
    // into unchecked (an input, the file stdout is redirected to). Refused before a byte is written;
    // so is a failed open (ENXIO: a FIFO without a reader, opened non-blocking) of a file replaced.
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0) {
        if (fd >= 0) ::close(fd);
        if (::stat(target.file.c_str(), &st) == 0 && !is_checked_file(st, target)) throw replaced_since_checked(path, target, st);
        throw Error(detail::quoted_path(path) + ": cannot open for writing (" + std::strerror(open_errno) + ")");
    }
    if (!is_checked_file(st, target)) {
        ::close(fd);
        throw replaced_since_checked(path, target, st);
    }
    if (device) {
        const int flags = ::fcntl(fd, F_GETFL);
        if (flags == -1 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == -1) {
            const int err = errno;
            ::close(fd);
            throw Error(detail::quoted_path(path) + ": cannot open for writing (" + std::strerror(err) + ")");
        }
    }
    // Never the number of a closed standard stream: with stdout closed the output became
    // descriptor 1, and what attn prints went into it (a device kept open through the computation,
    // a FIFO through the writes of several outputs).
    if (fd <= STDERR_FILENO) {
        const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
        const int err = errno;
        ::close(fd);
        if (moved < 0) throw Error(detail::quoted_path(path) + ": cannot open for writing (" + std::strerror(err) + ")");
        fd = moved;
    }
    return fd;
}

AtomicFile::AtomicFile(std::string path) : AtomicFile(path, resolve_output(path)) {}

AtomicFile::AtomicFile(std::string path, OutputTarget target)
    : path_(std::move(path)), target_(std::move(target)), dir_(split_dir(target_.file).first) {
    int fd = -1;
    if (target_.descriptor >= 0) {
        // What the program printed there comes first, as it would with stdio alone.
        if (target_.descriptor == 1) std::fflush(stdout);
        if (target_.descriptor == 2) std::fflush(stderr);
        fd = ::fcntl(target_.descriptor, F_DUPFD_CLOEXEC, 0);
        if (fd < 0) fail("cannot duplicate descriptor " + std::to_string(target_.descriptor), errno);
    } else if (target_.direct) {
        fd = open_direct(path_, target_);
    } else if (const std::string dir = split_dir(target_.file).first;
               // Only where the finished file can be named without privilege (/proc/self/fd: see
               // link_unnamed); a chroot without /proc keeps the named staging file.
               ::access("/proc/self/fd", X_OK) == 0 &&
               (fd = ::open(dir.empty() ? "." : dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666)) >= 0) {
        unnamed_ = kUnnamedWriting;
    } else {
        std::string name = staging_template(target_.file);
        int err = 0;
        {
            const TerminationSignalsHeld held;
            fd = ::mkstemp(name.data());
            err = errno;
            if (fd >= 0) slot_ = track_staging_file(name.c_str());
        }
        if (fd < 0) fail("cannot create output file", err);
        stage_ = std::move(name);
    }
    if (!target_.direct) give_permissions_of(target_.file, fd);
    file_ = ::fdopen(fd, "wb");
    if (file_ == nullptr) {
        const int e = errno;
        ::close(fd);
        fail("cannot open output file", e);
    }
}

AtomicFile::~AtomicFile() { discard(); }

void AtomicFile::discard() noexcept {
    if (file_ != nullptr) {
        std::fclose(file_);
        file_ = nullptr;
    }
    if (unnamed_ >= 0) ::close(unnamed_);  // an unnamed file goes with its last descriptor
    unnamed_ = -1;
    if (!stage_.empty()) {
        ::unlink(stage_.c_str());
        untrack_staging_file(slot_);
        slot_ = -1;
        stage_.clear();
    }
}

void AtomicFile::fail(const std::string& what, int err) {
    discard();
    throw Error(detail::quoted_path(path_) + ": " + what + " (" + std::strerror(err) + ")");
}

void AtomicFile::reserve(std::int64_t bytes) {
    if (file_ == nullptr || target_.direct || bytes <= 0) return;
    if (::fallocate(::fileno(file_), 0, 0, static_cast<off_t>(bytes)) == 0) {
        reserved_ = bytes;
        return;
    }
    const int err = errno;
    if (err == ENOSPC || err == EFBIG || err == EDQUOT)
        fail("write failed: the file needs " + std::to_string(bytes) + " bytes, more than the file system takes", err);
    // EOPNOTSUPP (no fallocate here), EINTR, ...: the writes report what goes wrong.
}

void AtomicFile::write(const void* data, std::size_t bytes) {
    if (file_ == nullptr) throw Error(detail::quoted_path(path_) + ": write after the file was finished");
    if (bytes != 0 && std::fwrite(data, 1, bytes, file_) != bytes) fail("write failed", errno);
    written_ += static_cast<std::int64_t>(bytes);
}

void AtomicFile::finish() {
    if (file_ == nullptr) return;
    // fallocate set the size: a writer that wrote less would leave zeros at the end.
    if (reserved_ != 0 && written_ != reserved_) {
        discard();
        throw Error(detail::quoted_path(path_) + ": internal error: " + std::to_string(written_) + " bytes written into a file reserved for " +
                    std::to_string(reserved_));
    }
    std::FILE* f = file_;
    file_ = nullptr;
    bool ok = std::fflush(f) == 0;
    if (ok && !target_.direct) ok = ::fsync(::fileno(f)) == 0;  // a device or pipe has nothing to sync
    int err = errno;
    if (ok && unnamed_ == kUnnamedWriting) {  // the descriptor that publish() links by
        unnamed_ = ::fcntl(::fileno(f), F_DUPFD_CLOEXEC, 0);
        if (unnamed_ < 0) ok = false, err = errno;
    }
    if (std::fclose(f) != 0 && ok) {
        ok = false;
        err = errno;
    }
    if (!ok) fail("write failed", err);
}

void AtomicFile::link_unnamed() {
    // /proc/self/fd/N with AT_SYMLINK_FOLLOW links the open file (no privilege needed; the
    // constructor chose O_TMPFILE only where /proc is there); AT_EMPTY_PATH is the fallback (it
    // needs CAP_DAC_READ_SEARCH before Linux 6.10).
    const std::string proc = "/proc/self/fd/" + std::to_string(unnamed_);
    int err = EEXIST;
    for (int attempt = 0; attempt < 100 && err == EEXIST; ++attempt) {
        std::string name = staging_template(target_.file);
        // mkstemp's letters without its file: a name to link to (EEXIST: another try).
        std::uint64_t bits = (static_cast<std::uint64_t>(::getpid()) << 32) ^ reinterpret_cast<std::uintptr_t>(this) ^
                             (static_cast<std::uint64_t>(attempt) * 0x9E3779B97F4A7C15ull) ^ static_cast<std::uint64_t>(::clock());
        for (std::size_t i = name.size() - 6; i < name.size(); ++i, bits /= 62)
            name[i] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"[bits % 62];
        const TerminationSignalsHeld held;  // the name is recorded before a handler could miss it
        int rc = ::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, name.c_str(), AT_SYMLINK_FOLLOW);
        if (rc != 0 && errno == ENOENT) rc = ::linkat(unnamed_, "", AT_FDCWD, name.c_str(), AT_EMPTY_PATH);
        err = rc == 0 ? 0 : errno;
        if (rc == 0) {
            slot_ = track_staging_file(name.c_str());
            stage_ = std::move(name);
        }
    }
    ::close(unnamed_);
    unnamed_ = -1;
    if (err != 0) fail("cannot move the finished file into place", err);
}

void AtomicFile::publish(bool sync_directory) {
    finish();
    if (unnamed_ >= 0) link_unnamed();
    if (stage_.empty()) return;  // direct, or already published
    // The rename replaces what is at target_.file now, which must be what resolve_output checked:
    // the same regular file (type, device, inode), or no file for a name that did not exist. A
    // FIFO, a symbolic link or another file put there in between (a link to an input, the file
    // stdout is redirected to) was replaced, or written into, unchecked. Told by fstat of the name
    // opened without following a link, just before the rename; a name that was free is taken with
    // RENAME_NOREPLACE, so a file made there after this look is not replaced either.
    // (The permissions were given when the staged file was created: give_permissions_of.)
    struct stat st {};
    const int at = ::open(target_.file.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
    const int look_errno = errno;
    const bool exists = at >= 0 && ::fstat(at, &st) == 0;
    if (at >= 0) ::close(at);
    if (at < 0 && look_errno != ENOENT) fail("cannot move the finished file into place", look_errno);
    if (exists && !is_checked_file(st, target_)) {
        discard();
        throw replaced_since_checked(path_, target_, st);
    }
    int rc = -1;
    if (!exists) {  // a new name, or the file checked removed since: create, never replace
        rc = ::renameat2(AT_FDCWD, stage_.c_str(), AT_FDCWD, target_.file.c_str(), RENAME_NOREPLACE);
        const int err = errno;
        if (rc != 0 && err == EEXIST && ::lstat(target_.file.c_str(), &st) == 0) {
            discard();
            throw replaced_since_checked(path_, target_, st);
        }
        if (rc != 0 && err != EINVAL && err != ENOSYS) fail("cannot move the finished file into place", err);
        // EINVAL, ENOSYS: a file system (or kernel) without RENAME_NOREPLACE: the look above stands.
    }
    if (rc != 0 && std::rename(stage_.c_str(), target_.file.c_str()) != 0) fail("cannot move the finished file into place", errno);
    untrack_staging_file(slot_);
    slot_ = -1;
    stage_.clear();
    if (sync_directory) detail::sync_directory(dir_);
}

// Without this, a crash soon after attn said it had written a file could bring back the old one,
// or none — the file's own bytes were synced before the rename. Best effort: the file is in place
// by now, and a file system whose directories take no fsync (EINVAL) has nothing more to give.
void sync_directory(const std::string& dir) noexcept {
    const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    (void)::fsync(fd);
    ::close(fd);
}

}  // namespace attn::detail
