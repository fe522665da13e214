// The CLI's OutputFiles (tools/attn/output_files.hpp) and FIFO outputs: a FIFO is opened once for
// every write into it (write_bytes called more than once, as write_all does for several outputs
// naming it), so its reader sees one stream and one end of file; and it is opened as the FIFO
// check() found, so a file put in its place before the write is refused, naming the option.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "attn/error.hpp"
#include "output_files.hpp"

namespace {

namespace fs = std::filesystem;
using attn::cli::OutputFiles;

class FifoOutput : public ::testing::Test {
protected:
    void SetUp() override {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        dir_ = fs::temp_directory_path() / ("attn_output_files_" + std::to_string(::getpid()) + "_" + info->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
        pipe_ = (dir_ / "pipe").string();
        ASSERT_EQ(::mkfifo(pipe_.c_str(), 0666), 0) << std::strerror(errno);
        // The test is the FIFO's reader, non-blocking: opening it for writing never waits, and
        // each read tells what is there now.
        reader_ = ::open(pipe_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        ASSERT_GE(reader_, 0) << std::strerror(errno);
    }
    void TearDown() override {
        ::close(reader_);
        fs::remove_all(dir_);
    }
    // What the reader gets now: the bytes, "" at end of file (no writer has it open), nullopt when
    // nothing is there yet but a writer still has it open (EAGAIN).
    std::optional<std::string> read_now() const {
        char buf[256];
        const ssize_t n = ::read(reader_, buf, sizeof buf);
        if (n < 0 && errno == EAGAIN) return std::nullopt;
        EXPECT_GE(n, 0) << std::strerror(errno);
        return std::string(buf, static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
    }

    fs::path dir_;
    std::string pipe_;
    int reader_ = -1;
};

TEST_F(FifoOutput, WritesIntoOneFifoAreOneStreamWithOneEnd) {
    {
        OutputFiles outputs;
        outputs.add("--out", pipe_);
        outputs.check();
        outputs.write_bytes("--out", pipe_, "first ");
        EXPECT_EQ(read_now(), std::optional<std::string>("first "));
        // Opened and closed per call, the reader saw its end of file here, before the second part.
        EXPECT_EQ(read_now(), std::nullopt) << "the FIFO was closed after the first write";
        outputs.write_bytes("--out", pipe_, "second");
        EXPECT_EQ(read_now(), std::optional<std::string>("second"));
        EXPECT_EQ(read_now(), std::nullopt);
    }
    EXPECT_EQ(read_now(), std::optional<std::string>(""));  // the one end of file, when the outputs end
}

TEST_F(FifoOutput, AFileReplacingTheFifoAfterTheCheckIsRefusedNamingTheOption) {
    OutputFiles outputs;
    outputs.add("--out", pipe_);
    outputs.check();
    ASSERT_EQ(::unlink(pipe_.c_str()), 0);
    std::ofstream(pipe_) << "kept";  // say, a link to an input, put there while attn computed
    try {
        outputs.write_bytes("--out", pipe_, "picture");
        FAIL() << "a regular file in the FIFO's place was written";
    } catch (const attn::Error& e) {
        EXPECT_EQ(std::string(e.what()), "--out: '" + pipe_ + "' was a FIFO (named pipe) when checked but is a regular file now "
                                         "(replaced in between); nothing was written");
    }
    std::ifstream in(pipe_);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "kept");
}

// check() found a regular file; a FIFO was put at its name before the write. The write looked the
// path up again and wrote into the FIFO, past every comparison check() had made (with an input,
// with the other outputs). Now the file written is the one checked.
TEST_F(FifoOutput, AFifoReplacingARegularOutputAfterTheCheckIsRefusedNamingTheOption) {
    const std::string out = (dir_ / "o.npy").string();
    std::ofstream(out) << "old";
    OutputFiles outputs;
    outputs.add("--out", out);
    outputs.check();
    ASSERT_EQ(::rename(pipe_.c_str(), out.c_str()), 0);  // the FIFO (and its reader) now at o.npy
    try {
        outputs.write_bytes("--out", out, "picture");
        FAIL() << "the FIFO in the regular file's place was written";
    } catch (const attn::Error& e) {
        EXPECT_EQ(std::string(e.what()), "--out: '" + out + "' was a regular file when checked but is a FIFO (named pipe) now "
                                         "(replaced in between); nothing was written");
    }
    EXPECT_EQ(read_now(), std::optional<std::string>("")) << "the FIFO was written into";
    EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1) << "a staging file was left";
}

}  // namespace
