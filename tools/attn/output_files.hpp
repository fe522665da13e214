// Output files of a CLI command: every path is checked (distinct, of a kind attn writes,
// in a writable directory) before any compute, and each file is published only after all
// results are written. How one path is written (staged and renamed, or straight into a
// device/FIFO) is decided by detail::AtomicFile (src/io/atomic_file.hpp).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attn/dtype.hpp"
#include "attn/tensor.hpp"

namespace attn::detail {
class AtomicFile;
struct OutputTarget;
}

namespace attn::cli {

class OpenFifos;

class OutputFiles {
public:
    OutputFiles();
    ~OutputFiles();  // closes the devices check() opened and the FIFOs written
    OutputFiles(const OutputFiles&) = delete;
    OutputFiles& operator=(const OutputFiles&) = delete;

    // `flag` names the option in errors, e.g. "--weights". Empty paths mean "not requested"
    // (an empty value given on the command line is refused earlier, by the parser).
    void add(const std::string& flag, const std::string& path);
    // An input file (a tensor spec's file, or --params): check() refuses an output path that
    // names the same file, which the output would replace. Empty: not given.
    void add_input(const std::string& flag, const std::string& path);
    // Throws attn::Error naming the flag if two outputs share a path, an output names an input's
    // file (however spelt: the same device and inode), a path names something
    // attn does not write (a directory, a block device, a file no rename may replace, ...: see
    // detail::resolve_output), its directory is not writable or its file name is longer than the
    // directory allows (the rename into place would fail only after the other outputs were published),
    // or it would replace the file stdout or stderr is redirected to (and what attn prints there).
    // Last, with every path accepted, it opens the outputs that are character devices and keeps
    // them for the writes below: an open no permission bit foretells (/dev/tty without a
    // controlling terminal, a nodev mount, a device with nothing behind it: detail::open_direct)
    // fails before any compute, not after other outputs were written. Nothing is written or
    // truncated by the open. FIFOs are opened when written: see write_all.
    void check();
    // Throws attn::Error naming the flag unless `path` ends in ".safetensors": an output of
    // several tensors (Output::tensors) has no .npy form.
    static void require_safetensors(const std::string& flag, const std::string& path);
    // Throws attn::Error naming the flag when `path` cannot hold `dtype`: bfloat16 has no .npy
    // form (a path ending in .safetensors can hold it), and attn writes no F64 safetensors.
    // out_dtypes: what the command's --out-dtype takes (float_dtypes, tensor_args.hpp); the
    // error for a .npy path suggests those a .npy holds (none given: only .safetensors).
    // Call it for every output before any compute.
    static void check_dtype(const std::string& flag, const std::string& path, DType dtype,
                            const std::vector<DType>& out_dtypes);

    // One output: a path ending in ".safetensors" gets a safetensors file with one tensor named
    // after the flag without its dashes ("--out" → "out"), in the tensor's own dtype (float32,
    // float16, bfloat16); any other path a .npy. With `tensors` (several named tensors, e.g.
    // gradients), the path must end in ".safetensors" and gets those instead of `view`.
    struct Output {
        std::string flag, path;
        TensorView view;
        std::vector<std::pair<std::string, TensorView>> tensors = {};
    };
    // Writes every output: all regular files are written completely to staging files, then
    // devices/FIFOs are written into, then the staging files are renamed into place — so an
    // error while writing leaves none of the regular files behind. A device check() opened is
    // written through its descriptor. A FIFO is opened only now, when its bytes are ready: the
    // open waits for a reader, as `cmd > fifo` does, and no earlier probe could tell more — with
    // O_NONBLOCK it fails (ENXIO) while no reader has come yet though one may, and opening and
    // closing it under a waiting reader would give that reader its end of file. It is opened as
    // the FIFO check() found (a file put in its place since is refused), once, and stays open
    // until this OutputFiles ends, so that every write into it is one stream with one end of file.
    // A dtype the path cannot hold is refused here too, before any file is opened.
    void write_all(const std::vector<Output>& outputs) const;
    // write_all in its two steps, for outputs that several processes write (attn ring
    // --shard-outputs): stage() writes every output and publishes none; the processes agree that
    // all of them staged, then each publish()es. A rank whose write failed then leaves no other
    // rank's file behind. Destroyed unpublished, it removes its staging files.
    class Staged {
    public:
        Staged();
        Staged(Staged&&) noexcept;
        Staged& operator=(Staged&&) noexcept;
        ~Staged();
        void publish();  // the renames into place; errors name the option

    private:
        friend class OutputFiles;
        std::vector<std::unique_ptr<detail::AtomicFile>> files_;
        std::vector<std::string> flags_;
    };
    Staged stage(const std::vector<Output>& outputs) const;
    // One output of encoded bytes (a picture, a JSON report), written as write_all writes a file;
    // a file system error names `flag`. A FIFO is opened once for all the calls that write into it.
    void write_bytes(const std::string& flag, const std::string& path, const std::string& bytes) const;

private:
    // How `path` is written: into the descriptor of a device check() opened, else as the file
    // check() found there (detail::resolve_output for a path check() did not see).
    detail::OutputTarget target_of(const std::string& path) const;

    std::vector<std::pair<std::string, std::string>> files_;
    std::vector<detail::OutputTarget> checked_;  // what check() found for files_[i], written as that file
    std::vector<std::pair<std::string, std::string>> inputs_;
    std::vector<std::pair<std::string, int>> devices_;  // check()'s opened devices: path, descriptor
    // The FIFOs check() found, each opened once when first written and kept open until the end
    // (write_all and write_bytes alike): its reader sees one stream and one end of file.
    std::unique_ptr<OpenFifos> fifos_;
};

}  // namespace attn::cli
