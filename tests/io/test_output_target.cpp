// detail::open_direct opens the device or FIFO resolve_output checked, or refuses: a file put in
// its place between the check and the open (another type, or another file of the same type) is an
// error naming the path, and nothing is written into it. Likewise AtomicFile::publish renames only
// over the regular file checked (or onto a name that was free): a FIFO, a symbolic link or another
// file there by then is refused and left as it is. The swap is made by the test itself between the
// two calls, so nothing here depends on timing.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "io/atomic_file.hpp"

namespace {

namespace fs = std::filesystem;
using attn::detail::open_direct;
using attn::detail::resolve_output;

class OutputTarget : public ::testing::Test {
protected:
    void SetUp() override {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        dir_ = fs::temp_directory_path() / ("attn_output_target_" + std::to_string(::getpid()) + "_" + info->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override {
        for (const int fd : readers_) ::close(fd);
        fs::remove_all(dir_);
    }
    std::string path(const std::string& name) const { return (dir_ / name).string(); }
    // A FIFO at `p` with a reader held open by the test, so that opening it for writing never waits.
    void fifo_with_reader(const std::string& p) {
        ASSERT_EQ(::mkfifo(p.c_str(), 0666), 0) << std::strerror(errno);
        const int fd = ::open(p.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        ASSERT_GE(fd, 0) << std::strerror(errno);
        readers_.push_back(fd);
    }
    // A character device with /dev/null's numbers in the test's directory (needs CAP_MKNOD).
    bool null_device(const std::string& p) const { return ::mknod(p.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0; }

    fs::path dir_;
    std::vector<int> readers_;
};

std::string message_of_open(const std::string& p, const attn::detail::OutputTarget& t) {
    try {
        const int fd = open_direct(p, t);
        ::close(fd);
    } catch (const attn::Error& e) {
        return e.what();
    }
    return "(opened)";
}

TEST_F(OutputTarget, ADeviceReplacedByAFifoBeforeTheOpenIsRefused) {
    const std::string p = path("dev");
    if (!null_device(p)) GTEST_SKIP() << "mknod needs CAP_MKNOD";
    const auto checked = resolve_output(p);
    ASSERT_EQ(checked.type, S_IFCHR);
    ASSERT_EQ(::unlink(p.c_str()), 0);
    fifo_with_reader(p);  // a reader is there: the open itself succeeds
    EXPECT_EQ(message_of_open(p, checked), "'" + p + "' was a character device when checked but is a FIFO (named pipe) now "
                                           "(replaced in between); nothing was written");
}

TEST_F(OutputTarget, ADeviceReplacedByAFifoWithoutAReaderIsRefusedNotWaitedFor) {
    const std::string p = path("dev");
    if (!null_device(p)) GTEST_SKIP() << "mknod needs CAP_MKNOD";
    const auto checked = resolve_output(p);
    ASSERT_EQ(::unlink(p.c_str()), 0);
    ASSERT_EQ(::mkfifo(p.c_str(), 0666), 0);
    ::alarm(20);  // an open that waits for a reader would never return: end the test instead
    const std::string message = message_of_open(p, checked);
    ::alarm(0);
    EXPECT_EQ(message, "'" + p + "' was a character device when checked but is a FIFO (named pipe) now "
                       "(replaced in between); nothing was written");
}

TEST_F(OutputTarget, AFifoReplacedByAnotherFifoOrARegularFileIsRefused) {
    const std::string p = path("pipe");
    fifo_with_reader(p);
    const auto checked = resolve_output(p);
    ASSERT_EQ(checked.type, S_IFIFO);
    // Another FIFO of that name (the old one's reader still open: its inode lives on).
    ASSERT_EQ(::rename(p.c_str(), path("old").c_str()), 0);
    fifo_with_reader(p);
    EXPECT_EQ(message_of_open(p, checked), "'" + p + "' was a FIFO (named pipe) when checked but is another one now "
                                           "(replaced in between); nothing was written");
    // A regular file of that name: not written into either.
    ASSERT_EQ(::unlink(p.c_str()), 0);
    { std::FILE* f = std::fopen(p.c_str(), "w"); ASSERT_NE(f, nullptr); std::fclose(f); }
    EXPECT_EQ(message_of_open(p, checked), "'" + p + "' was a FIFO (named pipe) when checked but is a regular file now "
                                           "(replaced in between); nothing was written");
    EXPECT_EQ(fs::file_size(p), 0u);
}

TEST_F(OutputTarget, TheFifoCheckedIsOpened) {
    const std::string p = path("pipe");
    fifo_with_reader(p);
    const int fd = open_direct(p, resolve_output(p));
    ASSERT_GE(fd, 3);
    ASSERT_EQ(::write(fd, "ab", 2), 2);
    ::close(fd);
    char buf[4] = {};
    EXPECT_EQ(::read(readers_.at(0), buf, sizeof buf), 2);
    EXPECT_STREQ(buf, "ab");
}

std::string content(const std::string& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

// AtomicFile(p) staged "new" for p and finished it; then `swap` changed what p names; publish()'s
// message ("(published)" if it renamed).
template <typename Swap>
std::string message_of_publish(const std::string& p, const Swap& swap) {
    try {
        attn::detail::AtomicFile file(p);
        file.write("new", 3);
        file.finish();
        swap();
        file.publish();
    } catch (const attn::Error& e) {
        return e.what();
    }
    return "(published)";
}

// Before, publish() took a path that had become a symbolic link by a stat that followed it (a
// regular file: fine) and renamed over the link; the CLI looked the path up again at write time,
// followed the new link and replaced the file it points to, unchecked (an input, say).
TEST_F(OutputTarget, ARegularFileReplacedByALinkBeforeThePublishIsRefused) {
    const std::string p = path("o.npy"), other = path("input.npy");
    std::ofstream(p) << "old";
    std::ofstream(other) << "kept";
    EXPECT_EQ(message_of_publish(p, [&] {
                  ASSERT_EQ(::unlink(p.c_str()), 0);
                  ASSERT_EQ(::symlink(other.c_str(), p.c_str()), 0);
              }),
              "'" + p + "' was a regular file when checked but is a symbolic link now (replaced in between); nothing was written");
    EXPECT_TRUE(fs::is_symlink(p));
    EXPECT_EQ(content(other), "kept");
    EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 2) << "a staging file was left";
}

TEST_F(OutputTarget, ARegularFileReplacedByAFifoOrAnotherFileBeforeThePublishIsRefused) {
    const std::string p = path("o.npy");
    std::ofstream(p) << "old";
    EXPECT_EQ(message_of_publish(p, [&] {
                  ASSERT_EQ(::unlink(p.c_str()), 0);
                  fifo_with_reader(p);
              }),
              "'" + p + "' was a regular file when checked but is a FIFO (named pipe) now (replaced in between); nothing was written");
    char buf[4];
    EXPECT_EQ(::read(readers_.at(0), buf, sizeof buf), 0) << "bytes went into the FIFO";
    ASSERT_EQ(::unlink(p.c_str()), 0);
    std::ofstream(p) << "old";
    EXPECT_EQ(message_of_publish(p, [&] {
                  ASSERT_EQ(::rename(p.c_str(), path("moved").c_str()), 0);  // the inode lives on: another file at p
                  std::ofstream(p) << "kept";
              }),
              "'" + p + "' was a regular file when checked but is another one now (replaced in between); nothing was written");
    EXPECT_EQ(content(p), "kept");
}

TEST_F(OutputTarget, ANameMadeBeforeThePublishIsNotReplaced) {
    const std::string p = path("new.npy");
    EXPECT_EQ(message_of_publish(p, [&] { std::ofstream(p) << "kept"; }),
              "'" + p + "' did not exist when checked but is a regular file now (made in between); nothing was written");
    EXPECT_EQ(content(p), "kept");
    EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1) << "a staging file was left";
}

TEST_F(OutputTarget, TheFileCheckedIsReplacedWhole) {
    const std::string p = path("o.npy"), fresh = path("fresh.npy");
    std::ofstream(p) << "old";
    EXPECT_EQ(message_of_publish(p, [&] { std::ofstream(p, std::ios::app) << " and more"; }), "(published)");  // the same inode
    EXPECT_EQ(content(p), "new");
    EXPECT_EQ(message_of_publish(fresh, [] {}), "(published)");
    EXPECT_EQ(content(fresh), "new");
}

}  // namespace
