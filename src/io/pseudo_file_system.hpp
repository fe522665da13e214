// Kernel pseudo file systems (/proc, sysfs, cgroupfs, debugfs, ...): their files are the kernel's
// knobs and reports, made by the kernel, never by a program's open, write and rename. An output
// staged there failed only when its staging file was created, after the computation — or, where
// such a file system takes new files (efivarfs: an EFI variable; mqueue: a message queue, which
// write(2) refuses), would put a tensor where no tensor belongs or fail at the write. hugetlbfs
// (files only mapped, never written) is refused by the same rule.
#pragma once

#include <string>

namespace attn::detail {

// The name of the pseudo file system `path` (a file or directory that exists) is on, as mount(8)
// shows it ("proc", "sysfs", "cgroup2", ...), or nullptr: another file system, or `path` cannot
// be statfs'd (the caller's own checks say why).
const char* pseudo_file_system(const std::string& path);

}  // namespace attn::detail
