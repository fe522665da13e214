// An output file: the one way attn writes what a user names (write_npy, write_safetensors,
// heatmaps, the CLI's outputs). What a path gets depends on what it names (docs/conventions.md,
// "Files"):
//  - a regular file, or a name that does not exist yet: the bytes go to an unnamed file in the
//    target's directory (O_TMPFILE) that publish() links as a hidden staging name
//    (`.NAME.tmp.XXXXXX`, NAME shortened so the whole stays within NAME_MAX and its path within
//    PATH_MAX; a target whose directory leaves no room for that is refused) and renames into
//    place at once; destroyed before that, the unnamed file goes with its descriptor — so an
//    error half-way, or a SIGKILL (mpirun's second signal) while writing, leaves nothing. On a
//    file system without O_TMPFILE the staging name is created first (mkstemp) and removed on
//    failure and on termination signals. A symbolic link is followed: the file it points to is
//    replaced, the link stays. The rename replaces only the file resolve_output found: publish()
//    checks what the name holds then (fstat of it opened without following a link) and refuses
//    another file, a FIFO or a link put there in between, and takes a name that was free with
//    RENAME_NOREPLACE — nothing is looked up by the user's path again.
//  - a character device or a FIFO (/dev/null, a terminal, a named pipe, /dev/stdout on a pipe):
//    the bytes are written straight into it, as a shell redirect would. It is never replaced,
//    whoever runs attn (root included); one attn may not write (access W_OK) is refused. Opening
//    a FIFO waits for its reader.
//  - an open descriptor by name (/dev/stdin, /dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N,
//    /proc/thread-self/fd/N, /proc/<attn's pid>/fd/N, /proc/self/task/<its thread>/fd/N, the directory
//    however spelt, or a
//    symbolic link to one of these): written
//    into that descriptor (a duplicate), at its offset and with its flags, whatever it is open
//    on but a directory — a regular file behind `> f` or `>> f` included, which renaming would
//    have replaced (the rest of a `>>` log was lost, and what the shell wrote after attn went to
//    the old file). The CLI checks such a file against its inputs and other outputs. One open
//    read-only (`3< f`, `< f` for /dev/stdin) is refused. Another process's /proc/PID/fd/N is
//    followed to what it is open on, as a shell's open follows it.
//  - any other path naming a directory, a block device or a socket, a file no rename can replace
//    (mounted over its name, immutable, append-only, another user's in a sticky directory) or in
//    a directory that takes no rename (immutable, append-only) or on a kernel pseudo file system
//    (/proc, sysfs, cgroupfs, debugfs, ...: pseudo_file_system.hpp; another process's
//    /proc/PID/fd/N open on a deleted file is one), or an empty path: refused.
// Live staging files are tracked (staging_files.hpp), so a signal handler can remove them.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace attn::detail {

struct OutputTarget {
    std::string file;     // where the bytes end up: the path with symbolic links resolved
    bool direct = false;  // a character device or FIFO: written in place, never staged or replaced
    int descriptor = -1;  // >= 0: direct, into a duplicate of this open descriptor
    // What resolve_output found there (stat of `file`, or fstat of the descriptor), so that callers
    // tell a device from a FIFO and compare outputs without a stat of their own: the file's type
    // (S_IFREG, S_IFCHR, S_IFIFO, ...; 0 for a name that does not exist yet), device and inode.
    mode_t type = 0;
    dev_t dev = 0;
    ino_t ino = 0;
};

// Decides how `path` is written, or throws attn::Error with a reason that quotes the path
// (e.g. "'out' is a directory, not a file"); callers add the option name. Whether the
// directory is writable is left to the creation (or to a caller's earlier check).
OutputTarget resolve_output(const std::string& path);

// Opens a direct target that names no descriptor (a character device or FIFO) for writing, as a
// shell redirect does: never created or truncated, never made the controlling terminal; a FIFO's
// open waits for its reader. The descriptor (close-on-exec, never 0, 1 or 2), or attn::Error naming `path`: an open
// no permission bit foretells fails here (ENXIO: /dev/tty without a controlling terminal, a
// device with nothing behind it; EACCES: a device on a nodev mount).
int open_direct(const std::string& path, const OutputTarget& target);

class AtomicFile {
public:
    explicit AtomicFile(std::string path);  // throws attn::Error (see resolve_output)
    // With `target` = resolve_output(path) already found: a caller that had to know how each of
    // its paths is written (OutputFiles stages regular files before it opens devices) resolves
    // each once, and the file written is the one that resolve found (open_direct, publish).
    AtomicFile(std::string path, OutputTarget target);
    ~AtomicFile();
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;

    // Before the first write: asks the file system for the whole size at once (fallocate), so a
    // file that cannot fit — a broadcast view of 2^60 elements, a full disk — is an error
    // before any byte is written, not a disk filled up to the error. No-op for devices, FIFOs
    // and open descriptors, and where the file system has no fallocate (the writes find out).
    void reserve(std::int64_t bytes);
    void write(const void* data, std::size_t bytes);  // throws attn::Error (e.g. disk full, EFBIG)
    void finish();   // every byte flushed (and synced when staged); nothing visible yet
    // staged: rename into place, then sync its directory (the rename is on disk only then) unless
    // sync_directory is false: a caller publishing several files syncs their directories once
    // each afterwards (sync_directory). direct: nothing left to do.
    void publish(bool sync_directory = true);
    void commit() { finish(); publish(); }
    bool direct() const { return target_.direct; }
    const std::string& path() const { return path_; }  // as the user gave it
    const std::string& directory() const { return dir_; }  // of the file written ("" for the working one)

private:
    [[noreturn]] void fail(const std::string& what, int err);
    void discard() noexcept;

    std::string path_;  // as the user gave it: every error names this, never the staging file
    OutputTarget target_;
    std::string dir_;  // target_.file's directory, found before publish() (which must not allocate after the rename)
    // Name the finished unnamed file at a fresh staging name (publish).
    void link_unnamed();

    std::string stage_;  // staged: the staging name (named at once, or by link_unnamed)
    int slot_ = -1;      // in the staging-file registry
    std::FILE* file_ = nullptr;
    int unnamed_ = -1;   // O_TMPFILE: the finished file's descriptor, kept until it is linked
    std::int64_t reserved_ = 0, written_ = 0;  // reserve() sets the file's size: finish() checks it was filled
};

// fsync(2) of a directory (AtomicFile::directory()), best effort: a rename is on disk only once its
// directory is. Allocates nothing: it runs after files are in place, where a failure would report
// an error for a file already written.
void sync_directory(const std::string& dir) noexcept;

}  // namespace attn::detail
