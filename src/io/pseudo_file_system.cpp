#include "pseudo_file_system.hpp"

#include <linux/magic.h>
#include <sys/vfs.h>

#include <cstdint>

namespace attn::detail {
namespace {

// Not in linux/magic.h (the kernel keeps them in its own sources): configfs's, fusectl's and
// mqueue's (/dev/mqueue: a file created there is a POSIX message queue, which write(2) refuses
// with EINVAL — the output failed after the computation, "write failed (Invalid argument)").
constexpr std::uint64_t kConfigfsMagic = 0x62656570;
constexpr std::uint64_t kFusectlMagic = 0x65735543;
constexpr std::uint64_t kMqueueMagic = 0x19800202;

struct PseudoFileSystem {
    std::uint64_t magic;  // statfs(2)'s f_type
    const char* name;
};

constexpr PseudoFileSystem kPseudoFileSystems[] = {
    {PROC_SUPER_MAGIC, "proc"},         {SYSFS_MAGIC, "sysfs"},
    {CGROUP_SUPER_MAGIC, "cgroup"},     {CGROUP2_SUPER_MAGIC, "cgroup2"},
    {DEBUGFS_MAGIC, "debugfs"},         {TRACEFS_MAGIC, "tracefs"},
    {SECURITYFS_MAGIC, "securityfs"},   {kConfigfsMagic, "configfs"},
    {PSTOREFS_MAGIC, "pstore"},         {BPF_FS_MAGIC, "bpf"},
    {EFIVARFS_MAGIC, "efivarfs"},       {SELINUX_MAGIC, "selinuxfs"},
    {SMACK_MAGIC, "smackfs"},           {BINFMTFS_MAGIC, "binfmt_misc"},
    {RDTGROUP_SUPER_MAGIC, "resctrl"},  {DEVPTS_SUPER_MAGIC, "devpts"},
    {kFusectlMagic, "fusectl"},         {NSFS_MAGIC, "nsfs"},
    {kMqueueMagic, "mqueue"},
    // Not the kernel's knobs, but as final for an output: a hugetlbfs file is memory mapped,
    // never written (write(2) fails; attn said "the file needs 384 bytes, more than the file
    // system takes (No space left on device)" after the computation).
    {HUGETLBFS_MAGIC, "hugetlbfs"},
};

}  // namespace

const char* pseudo_file_system(const std::string& path) {
    struct statfs fs {};
    if (::statfs(path.empty() ? "." : path.c_str(), &fs) != 0) return nullptr;
    // f_type is a signed long on some ABIs: compared as the 32-bit number the kernel stores.
    const auto type = static_cast<std::uint64_t>(static_cast<std::uint32_t>(fs.f_type));
    for (const PseudoFileSystem& p : kPseudoFileSystems)
        if (p.magic == type) return p.name;
    return nullptr;
}

}  // namespace attn::detail
