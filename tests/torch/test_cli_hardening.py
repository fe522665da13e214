"""The CLI against inputs an attacker would try (issue 19, classes 2, 3 and 7):
  - files that are not files: FIFOs and devices as inputs (refused at once, never a hang or an
    endless read), devices and FIFOs as outputs (written into, never replaced, also as root);
  - signals and limits: SIGINT/SIGTERM/SIGHUP during a write leave no staging file, `ulimit -f`
    gives the one-line error instead of death by SIGXFSZ, errors name the user's path, empty
    output names are refused, names up to NAME_MAX work;
  - numbers: out-of-range, negative-for-unsigned, empty and malformed values are errors naming
    the option, on every numeric option of every command.
Every run has a timeout, so a hang fails the test instead of stalling the suite.
"""
import errno
import io
import json
import os
import re
import resource
import select
import shutil
import signal
import stat
import struct
import subprocess
import tempfile
import threading
import time

import numpy as np
import pytest

from cli_util import attn_bin, listing

B, HQ, HKV, LQ, LK, DK, DV = 2, 4, 2, 5, 7, 8, 6
TIMEOUT = 30


@pytest.fixture
def work(tmp_path):
    rng = np.random.default_rng(11)
    np.save(tmp_path / "q.npy", rng.standard_normal((B, HQ, LQ, DK)).astype(np.float32))
    np.save(tmp_path / "k.npy", rng.standard_normal((B, HKV, LK, DK)).astype(np.float32))
    np.save(tmp_path / "v.npy", rng.standard_normal((B, HKV, LK, DV)).astype(np.float32))
    np.save(tmp_path / "w.npy", rng.random((3, 4)).astype(np.float32))  # heatmap weights
    return tmp_path


def sdpa(d, *extra, out="o.npy"):
    args = ["sdpa", "--q", d / "q.npy", "--k", d / "k.npy", "--v", d / "v.npy"]
    if out is not None:
        args += ["--out", out if os.path.isabs(str(out)) else d / out]
    return args + list(extra)


def run(args, cwd=None, preexec_fn=None, timeout=TIMEOUT, pass_fds=()):
    return subprocess.run([attn_bin(), *map(str, args)], capture_output=True, cwd=cwd, preexec_fn=preexec_fn,
                          timeout=timeout, pass_fds=pass_fds)


def expect_error(d, args, *fragments, preexec_fn=None, pass_fds=()):
    """exit 2, one stderr line `attn: error: ` holding each fragment, no stdout, no new file in d,
    and never the name of a staging file."""
    before = listing(d)
    r = run(args, preexec_fn=preexec_fn, pass_fds=pass_fds)
    err = r.stderr.decode()
    assert r.returncode == 2, f"exit {r.returncode}, stderr: {err!r}"
    assert len(err.splitlines()) == 1 and err.startswith("attn: error: "), err
    assert r.stdout == b"", r.stdout[:200]
    for f in fragments:
        assert f in err, f"{f!r} not in {err!r}"
    assert ".tmp." not in err and ".stage." not in err, f"an error names a staging file: {err!r}"
    assert listing(d) == before, f"files appeared: {sorted(set(listing(d)) - set(before))}"
    return err


def staging_files(d):
    return [n for n in os.listdir(d) if ".tmp." in n or ".stage." in n]


def staged_outputs(p, d):
    """The outputs process p is writing into directory d: named staging files, or (where the file
    system has O_TMPFILE) its descriptors open on unnamed files there ('d/#inode (deleted)')."""
    unnamed = []
    try:
        for fd in os.listdir(f"/proc/{p.pid}/fd"):
            try:
                target = os.readlink(f"/proc/{p.pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(f"{d}/#"):
                unnamed.append(target)
    except OSError:  # the process has ended
        pass
    return staging_files(d) + unnamed


def has_o_tmpfile(d):
    try:
        os.close(os.open(d, os.O_TMPFILE | os.O_WRONLY, 0o600))
        return True
    except OSError:
        return False


def reference_output(d, *extra):
    """The bytes a successful run writes to a regular file (the oracle for device/FIFO outputs)."""
    r = run(sdpa(d, *extra, out=d / "ref.npy"))
    assert r.returncode == 0, r.stderr
    data = (d / "ref.npy").read_bytes()
    os.remove(d / "ref.npy")
    return data


# ---- class 2: inputs that are not regular files -------------------------------------------------

@pytest.mark.parametrize("flag", ["--q", "--k", "--mask", "--key-lengths", "--query-offsets"])
def test_a_fifo_as_an_input_is_refused_at_once(work, flag):
    os.mkfifo(work / "pipe")
    args = sdpa(work, out="o.npy")
    if flag in ("--q", "--k"):
        args[args.index(flag) + 1] = work / "pipe"
    else:
        args += [flag, work / "pipe"] + (["--causal"] if flag == "--query-offsets" else [])  # an offset places causal
    t0 = time.monotonic()
    expect_error(work, args, "pipe", "FIFO", "regular file")
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null", "/dev/urandom"])
def test_a_device_as_an_input_is_refused(work, device):
    expect_error(work, sdpa(work, "--mask", device), device, "character device")


def test_a_directory_as_an_input_is_refused(work):
    (work / "adir").mkdir()
    expect_error(work, sdpa(work, "--key-lengths", work / "adir"), "adir", "directory")


def test_other_readers_refuse_fifos_and_devices(work):
    """The heatmap's weights (.npy), the MHA's params (safetensors) and the tokens files all go
    through the same opening helper."""
    os.mkfifo(work / "pipe")
    for bad in (work / "pipe", "/dev/zero"):
        expect_error(work, ["heatmap", bad, "--out", work / "h.png"], str(bad), "not a regular file")
        expect_error(work, ["mha", "--params", bad, "--num-heads", "1", "--query", work / "q.npy", "--out", work / "o.npy"],
                     str(bad), "not a regular file")
        expect_error(work, ["heatmap", work / "w.npy", "--out", work / "h.png", "--tokens-file", bad],
                     "--tokens-file", str(bad), "not a regular file")
        expect_error(work, ["heatmap", work / "w.npy", "--out", work / "h.png", "--query-tokens-file", bad],
                     "--query-tokens-file", str(bad), "not a regular file")


def test_a_tokens_file_is_bounded(work):
    """A 17 MiB tokens file (sparse: nothing is really stored) is refused before it is read."""
    big = work / "tokens.txt"
    with open(big, "wb") as f:
        f.truncate(17 << 20)
    expect_error(work, ["heatmap", work / "w.npy", "--out", work / "h.png", "--tokens-file", big],
                 "--tokens-file", "17825792 bytes", "16777216")
    # and a real tokens file of the right length still works
    (work / "t.txt").write_text("a\nb\nc\nd\n")
    r = run(["heatmap", work / "w.npy", "--out", work / "h.png", "--tokens-file", work / "t.txt"])
    assert r.returncode == 0, r.stderr
    assert (work / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- class 2: outputs that are devices or FIFOs -------------------------------------------------

def null_device(d):
    """A character device to write into. As root, a private node with /dev/null's numbers (so a
    broken attn could only replace that one, never the system's /dev/null); else /dev/null."""
    if os.geteuid() != 0:
        return "/dev/null"
    node = d / "null"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return str(node)


def test_a_character_device_output_is_written_into_never_replaced(work):
    dev = null_device(work)
    before = os.stat(dev)
    for extra in ([], ["--weights", dev, "--lse", dev]):  # several outputs into one device are fine
        r = run(sdpa(work, *extra, out=dev))
        assert r.returncode == 0, r.stderr
        after = os.stat(dev)
        assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino
        assert staging_files(work) == [] and staging_files(os.path.dirname(dev)) == []
    assert "o.npy" not in listing(work)


def test_a_failing_device_write_is_the_one_line_error_and_leaves_no_regular_output(work):
    """/dev/full (every write: ENOSPC). The device cannot be unwritten, but the regular --lse
    output, written first to its staging file, must not appear."""
    if os.geteuid() == 0:
        dev = str(work / "full")
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    else:
        dev = "/dev/full"
    err = expect_error(work, sdpa(work, "--lse", work / "lse.npy", out=dev), dev, "No space left on device")
    assert "write failed" in err
    assert stat.S_ISCHR(os.lstat(dev).st_mode)


def test_a_block_device_output_is_refused(work):
    if os.geteuid() != 0:
        pytest.skip("creating a block device node needs root")
    node = work / "blk"
    os.mknod(node, 0o600 | stat.S_IFBLK, os.makedev(7, 200))  # a loop device number; never opened
    expect_error(work, sdpa(work, out=node), "--out", "block device")
    assert stat.S_ISBLK(os.lstat(node).st_mode)


def test_a_descriptor_output_open_read_only_is_refused_before_anything_runs(work):
    """--lse /dev/fd/N with N open read-only (`3< f`) failed only when written, after the
    computation and after --out /dev/stdout had gone down the pipe: exit 2 with half the outputs out."""
    kept = work / "kept.txt"
    kept.write_bytes(b"kept")
    fd = os.open(kept, os.O_RDONLY)
    try:
        for spelling in (f"/dev/fd/{fd}", f"/proc/self/fd/{fd}"):
            expect_error(work, sdpa(work, "--lse", spelling, out="/dev/stdout"),
                         f"--lse: '{spelling}' is descriptor {fd}, which is open read-only, not for writing", pass_fds=(fd,))
    finally:
        os.close(fd)
    assert kept.read_bytes() == b"kept"


def nobody_can_run_attn():
    """Skips unless this is root and nobody may run the binary (a clone under /root, 0700, is not)."""
    if os.geteuid() != 0:
        pytest.skip("running attn as another user needs root")
    try:
        probe = run(["--version"], preexec_fn=as_nobody)
    except PermissionError as e:
        pytest.skip(f"nobody cannot run {attn_bin()}: {e}")
    if probe.returncode != 0:
        pytest.skip(f"nobody cannot run {attn_bin()}: {probe.stderr.decode()[-200:]}")


def shared_copy_of_inputs(work):
    """A directory under /tmp that nobody may enter and write (tmp_path's parents are root's
    alone), holding copies of work's inputs; the caller removes it."""
    shared = tempfile.mkdtemp(dir="/tmp")
    os.chmod(shared, 0o1777)
    for name in ("q.npy", "k.npy", "v.npy"):
        shutil.copy(work / name, shared)
        os.chmod(os.path.join(shared, name), 0o644)
    return shared


@pytest.mark.parametrize("kind", ["fifo", "character device"])
def test_a_device_or_fifo_output_attn_may_not_write_is_refused_before_anything_runs(work, kind):
    """Its open failed (EACCES) only when written, after the computation; now the permission is
    told with the other paths, as a staged output's directory's is. (Root may write anything, so
    attn runs as nobody.)"""
    nobody_can_run_attn()
    shared = shared_copy_of_inputs(work)
    try:
        node = os.path.join(shared, "node")
        if kind == "fifo":
            os.mkfifo(node, 0o444)
        else:
            os.mknod(node, 0o444 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers, read-only for all
        os.chmod(node, 0o444)  # mkfifo/mknod apply the umask
        args = ["sdpa", "--q", f"{shared}/q.npy", "--k", f"{shared}/k.npy", "--v", f"{shared}/v.npy",
                "--out", f"{shared}/o.npy", "--lse", node]
        r = run(args, preexec_fn=as_nobody)
        err = r.stderr.decode()
        assert r.returncode == 2, err
        what = "a FIFO (named pipe)" if kind == "fifo" else "a character device"
        assert err == f"attn: error: --lse: '{node}' is {what} attn may not write (Permission denied)\n", err
        assert sorted(os.listdir(shared)) == ["k.npy", "node", "q.npy", "v.npy"]
    finally:
        shutil.rmtree(shared)


def test_stdout_as_the_output(work):
    """--out /dev/stdout on a pipe: the .npy goes down the pipe, nothing is created. (Spelled
    /proc/self/fd/1, the link /dev/stdout points to: were attn ever to stage and rename again,
    it could not replace anything in /proc, whereas as root it could replace /dev/stdout.)"""
    expected = reference_output(work)
    r = run(sdpa(work, out="/proc/self/fd/1"))
    assert r.returncode == 0, r.stderr
    assert r.stdout == expected
    np.load(io.BytesIO(r.stdout))
    assert "o.npy" not in listing(work)


def test_stdout_redirected_to_a_file_is_written_into_not_replaced(work):
    """--out /dev/stdout with stdout a regular file (`>> log`): written at the descriptor's
    offset, so the log keeps what it had; renaming over the file behind the redirect lost it."""
    expected = reference_output(work)
    log = work / "log"
    log.write_bytes(b"LOG\n")
    with open(log, "ab") as f:
        r = subprocess.run([attn_bin(), *map(str, sdpa(work, out="/dev/stdout"))], stdout=f, stderr=subprocess.PIPE)
    assert r.returncode == 0, r.stderr
    assert log.read_bytes() == b"LOG\n" + expected
    assert staging_files(work) == []


def run_with_stdin(args, stdin_file, shell_out=None):
    """attn args with stdin redirected from stdin_file (`< f`: open read-only). With shell_out, a
    shell that execs attn (same pid) adds `--out shell_out` after expanding it ($$: attn's pid).
    Returns (CompletedProcess-like result, attn's pid)."""
    with open(stdin_file, "rb") as f:
        cmd = [attn_bin(), *map(str, args)]
        if shell_out is not None:
            cmd = ["sh", "-c", f'exec "$0" "$@" --out {shell_out}', *cmd]
        p = subprocess.Popen(cmd, stdin=f, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = p.communicate(timeout=TIMEOUT)
    return subprocess.CompletedProcess(cmd, p.returncode, out, err), p.pid


@pytest.mark.parametrize("spelling", ["/dev/stdin", "/proc/thread-self/fd/0", "/proc/$$/fd/0", "/proc/self/task/$$/fd/0",
                                      "/proc/$$/task/$$/fd/0", "a link to /dev/stdin",
                                      # Spelt otherwise, the same directory: these were followed to data.
                                      "/dev//fd/0", "/proc/self/fd/../fd/0", "/proc/self/task/$$/../../fd/0",
                                      "0 in a link to /proc/self/fd"])
def test_stdin_named_as_an_output_is_descriptor_0_not_the_file_it_reads(work, spelling):
    """`attn sdpa … --out /dev/stdin < data` replaced data: the path was followed (/dev/stdin →
    /proc/self/fd/0 → data) to a regular file, renamed over. A shell's `> /dev/stdin` writes into
    descriptor 0, which `<` opened read-only: refused, like `--out /dev/fd/0`, before anything runs.
    /proc/thread-self/fd/N, /proc/<attn's pid>/fd/N, /proc/self/task/<a thread of attn's>/fd/N and a
    link to /dev/stdin are descriptor N too."""
    data = work / "data.bin"
    data.write_bytes(b"DATA")
    if spelling == "a link to /dev/stdin":
        os.symlink("/dev/stdin", work / "in.npy")
        spelling = str(work / "in.npy")
    if spelling == "0 in a link to /proc/self/fd":
        os.symlink("/proc/self/fd", work / "fds")
        spelling = str(work / "fds" / "0")
    before = listing(work)
    if "$$" in spelling:
        r, pid = run_with_stdin(sdpa(work, out=None), data, shell_out=spelling)
        spelling = spelling.replace("$$", str(pid))
    else:
        r, _ = run_with_stdin(sdpa(work, out=spelling), data)
    assert r.returncode == 2, r.stderr
    assert r.stderr.decode() == f"attn: error: --out: '{spelling}' is descriptor 0, which is open read-only, not for writing\n"
    assert data.read_bytes() == b"DATA"
    assert listing(work) == before


def test_a_link_to_stdout_is_written_into_the_descriptor(work):
    """A picture's name must end in .png, so stdout is named through a link (docs/conventions.md):
    with stdout `>> log` the link was followed to log and refused as the file stdout is redirected
    to, where /dev/stdout itself is written at the descriptor's offset. Both are descriptor 1 now."""
    expected = reference_output(work)
    os.symlink("/dev/stdout", work / "out.npy")
    log = work / "log"
    log.write_bytes(b"LOG\n")
    with open(log, "ab") as f:
        r = subprocess.run([attn_bin(), *map(str, sdpa(work, out=work / "out.npy"))], stdout=f, stderr=subprocess.PIPE,
                           timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert log.read_bytes() == b"LOG\n" + expected
    assert os.path.islink(work / "out.npy") and staging_files(work) == []


def unregistered_device(d):
    """A character device node whose major number no driver here has taken: its open fails
    (ENXIO) though its permission bits allow it. Needs root (mknod)."""
    if os.geteuid() != 0:
        pytest.skip("creating a device node needs root")
    node = d / "nothing"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(240, 7))  # 240-254: local/experimental use
    try:
        os.close(os.open(node, os.O_WRONLY))
        pytest.skip("a driver here took major 240")
    except OSError as e:
        assert e.errno == errno.ENXIO, e
    return str(node)


@pytest.mark.parametrize("kind", ["/dev/tty without a controlling terminal", "a device with nothing behind it"])
def test_a_device_whose_open_fails_is_refused_before_anything_runs(work, kind):
    """The open of a character device can fail where its permission bits allow it (ENXIO). It was
    opened only when written, after the computation and after --out /dev/stdout had gone down the
    pipe: exit 2 with half the outputs out. Now every device is opened before the computation."""
    if kind.startswith("/dev/tty"):
        dev, preexec = "/dev/tty", os.setsid  # a new session has no controlling terminal
    else:
        dev, preexec = unregistered_device(work), None
    err = expect_error(work, sdpa(work, "--lse", dev, out="/dev/stdout"), preexec_fn=preexec)
    assert err == f"attn: error: --lse: '{dev}': cannot open for writing (No such device or address)\n", err


def test_a_device_on_a_nodev_mount_is_refused_before_anything_runs(work):
    """A device node on a file system mounted nodev cannot be opened (EACCES) though access() says
    it may be written: that failure came after the computation, after --out /dev/stdout was written."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (a private mount namespace)")
    mnt = work / "mnt"
    mnt.mkdir()
    script = ('mount -t tmpfs -o nodev,size=1m none "$0" || exit 99; mknod "$0/null" c 1 3 || exit 99; '
              'exec "$@" --lse "$0/null"')
    r = subprocess.run(["unshare", "-m", "sh", "-c", script, str(mnt), attn_bin(), *map(str, sdpa(work, out="/dev/stdout"))],
                       capture_output=True, timeout=TIMEOUT)
    if r.returncode == 99:
        pytest.skip(f"cannot mount a nodev tmpfs here: {r.stderr.decode()[-200:]}")
    assert r.returncode == 2, r.stderr
    assert r.stderr.decode() == f"attn: error: --lse: '{mnt}/null': cannot open for writing (Permission denied)\n"
    assert r.stdout == b""


def test_a_device_kept_open_never_takes_a_closed_standard_stream(work):
    """A device output is opened before the computation and kept: with stdout closed it took the
    lowest free number, 1, and the demo's walkthrough went into the device (a terminal here)
    instead of failing as printing to a closed stdout does."""
    master, slave = os.openpty()
    got = b""
    try:
        os.symlink(os.ttyname(slave), work / "h.png")  # a picture's name must end in .png
        p = subprocess.Popen([attn_bin(), "demo", "--heatmap", str(work / "h.png")], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, preexec_fn=lambda: os.close(1))
        deadline = time.monotonic() + TIMEOUT
        while True:  # read what reaches the terminal as it comes (a full buffer would block attn)
            if select.select([master], [], [], 0.05)[0]:
                got += os.read(master, 1 << 16)
            elif p.poll() is not None:
                break
            assert time.monotonic() < deadline, "attn did not end"
        r = subprocess.CompletedProcess(p.args, p.returncode, b"", p.stderr.read())
        p.stderr.close()
    finally:
        os.close(master)
        os.close(slave)
    assert r.returncode == 2, r.stderr
    assert r.stderr.decode().startswith("attn: error: stdout: write failed"), r.stderr
    assert b"attn demo" not in got, got[:200]


def test_another_process_descriptor_on_a_deleted_file_is_refused_before_anything_runs(work):
    """/proc/PID/fd/N of another process (here the test's) is followed to the file it is open on;
    open on a deleted file, its link leads to no file, so the path itself was to be replaced: staged
    in /proc/PID/fd/, which access() called writable (root) but /proc takes no new file, it failed
    only when created, after the computation. (The missing --mask is read, and named, only after
    the outputs are checked.)"""
    gone = work / "gone.txt"
    with open(gone, "w") as f:
        os.remove(gone)
        out = f"/proc/{os.getpid()}/fd/{f.fileno()}"
        err = expect_error(work, sdpa(work, "--mask", work / "no_such_mask.npy", out=out))
    assert err == pseudo_file_system_error("--out", out, "proc", f"/proc/{os.getpid()}/fd/"), err


def pseudo_file_system_error(flag, out, fs, directory):
    return (f"attn: error: {flag}: '{out}' is on {fs} ('{directory}'), a kernel pseudo file system, where no output "
            "can be written and renamed into place: attn writes results to regular files of other file systems, "
            "character devices, FIFOs or open descriptors\n")


def pseudo_file_system_directories():
    """(directory, file system) for /proc, /sys and the first directory of each other pseudo file system
    mounted here (cgroup, cgroup2, debugfs, ...) — read from /proc/self/mounts, not from attn."""
    # /proc is mounted wherever attn's tests run (they read /proc/self/...); /sys may not be (a container)
    found = {"proc": "/proc/sys", **({"sysfs": "/sys/kernel"} if os.path.isdir("/sys/kernel") else {})}
    kinds = ("cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "configfs", "pstore", "bpf", "efivarfs")
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            _, where, fs = line.split()[:3]
            if fs in kinds and fs not in found and os.path.isdir(where):
                found[fs] = where
    return [(d, fs) for fs, d in found.items()]


@pytest.mark.parametrize("directory,fs", pseudo_file_system_directories())
def test_an_output_on_a_kernel_pseudo_file_system_is_refused_before_anything_runs(work, directory, fs):
    """Only /proc was refused up front: an output on sysfs, cgroupfs, debugfs, ... failed when its
    staging file was created, after the computation (root: access() calls /sys writable). The
    missing --mask is read, and named, only after the outputs are checked."""
    out = f"{directory}/attn-test-output.npy"
    err = expect_error(work, sdpa(work, "--lse", work / "l.npy", "--mask", work / "no_such_mask.npy", out=out))
    assert err == pseudo_file_system_error("--out", out, fs, directory + "/"), err
    assert not os.path.exists(out)


@pytest.mark.parametrize("fs", ["mqueue", "hugetlbfs"])
def test_an_output_on_a_file_system_that_takes_no_write_is_refused_before_anything_runs(work, fs):
    """mqueue (/dev/mqueue where mounted) takes a new file, but it is a POSIX message queue that
    write(2) refuses (EINVAL): the output failed after the computation, "write failed (Invalid
    argument)"; a hugetlbfs file is only mapped, and failed as "more than the file system takes (No
    space left on device)". Mounted here in a private mount namespace: seldom there in a container."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (a private mount namespace)")
    mnt = work / "mnt"
    mnt.mkdir()
    out = f"{mnt}/o.npy"
    script = f'mount -t {fs} none "$0" || exit 99; exec "$@"'
    r = subprocess.run(["unshare", "-m", "sh", "-c", script, str(mnt), attn_bin(),
                        *map(str, sdpa(work, "--mask", work / "no_such_mask.npy", out=out))],
                       capture_output=True, timeout=TIMEOUT)
    if r.returncode == 99:
        pytest.skip(f"cannot mount a {fs} file system here: {r.stderr.decode()[-200:]}")
    assert r.returncode == 2, r.stderr
    assert r.stderr.decode() == pseudo_file_system_error("--out", out, fs, f"{mnt}/"), r.stderr
    assert r.stdout == b""


def test_a_file_name_with_control_characters_is_one_error_line(work):
    """The error quoting a name with a newline (or ESC) was several lines (or a terminal command)."""
    err = expect_error(work, sdpa(work, out=work / "o\nx\x1b[2J.npy", ) + ["--mask", work / "no\nsuch.npy"],
                       "no\\x0asuch.npy")
    assert "\x1b" not in err


def test_a_path_with_a_quote_a_newline_or_a_non_utf8_byte_is_quoted_unambiguously(work):
    """One quoting rule for every path in a message (docs/errors.md, "Quoting"): the checks of an
    output's dtype and of an input's format named the path bare — a newline split the one error
    line, a quote or a byte that is not UTF-8 made it ambiguous (or not UTF-8)."""
    name = "it's\n\udcff.npy"  # the byte 0xFF (os.fsencode's surrogate escape)
    shown = f"'{work}/it\\'s\\x0a\\xff.npy'"
    expect_error(work, sdpa(work, "--out-dtype", "bfloat16", out=work / name),
                 f"--out: {shown} would hold bfloat16, which .npy cannot store")
    expect_error(work, ["mha", "--params", work / "p.safetensors", "--num-heads", "1", "--query", work / "q.npy",
                        "--out", work / "o.npy", "--grad-out", work / "q.npy", "--grads", work / name],
                 f"--grads: {shown} would hold several tensors")
    (work / name).write_bytes(b"not a .npy file")
    args = sdpa(work)
    args[args.index("--q") + 1] = work / name
    expect_error(work, args, f"--q: {shown}: not a .npy file")


def test_an_output_path_past_path_max_says_so(work):
    """It was "directory … does not exist or is not writable" (access() failed with ENAMETOOLONG)."""
    deep = "/".join(["d" * 250] * 20)
    expect_error(work, sdpa(work, out=work / deep / "o.npy"), "--out: path of", "File name too long")


def directory_of_length(base, length):
    """A new directory under base whose absolute path is `length` bytes long (components of at most
    250 bytes)."""
    path = str(base)
    while length - len(path) > 251:
        path += "/" + "d" * 200
    path += "/" + "e" * (length - len(path) - 1)
    os.makedirs(path)
    assert len(path) == length
    return path


PATH_BYTES = os.pathconf("/", "PC_PATH_MAX") - 1  # the longest path the system takes (4095)


def test_output_paths_up_to_path_max(work):
    """A path just below PATH_MAX is valid (a shell redirect writes it), but the staging name beside
    it, 12 bytes longer, was past PATH_MAX: its rename failed after --out had been renamed into
    place, and the run exited 2 with o.npy written. The staging name is now cut to fit."""
    lse = directory_of_length(work, PATH_BYTES - len("/llllllllll.npy")) + "/llllllllll.npy"
    assert len(lse) == PATH_BYTES
    r = run(sdpa(work, "--lse", lse))
    assert r.returncode == 0, r.stderr
    assert np.load(lse).shape == (B, HQ, LQ)
    assert np.load(work / "o.npy").shape == (B, HQ, LQ, DV)
    assert staging_files(os.path.dirname(lse)) == []


def test_a_path_whose_directory_leaves_no_room_for_a_staging_name_is_refused_before_any_output(work):
    """Directory, '/', '.', one byte of the name and '.tmp.XXXXXX' must fit in PATH_MAX: a path of a
    long directory and a short name cannot be staged — refused with the other paths, not after
    --out was published."""
    directory = directory_of_length(work, PATH_BYTES - len("/l.npy"))
    expect_error(work, sdpa(work, "--lse", directory + "/l.npy"), f"--lse: path of {PATH_BYTES} bytes: File name too long",
                 "staging file")
    assert not (work / "o.npy").exists()
    assert os.listdir(directory) == []


def as_nobody():
    """preexec_fn: the child runs as nobody (uid and gid 65534), without root's groups."""
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)


def test_another_users_file_in_a_sticky_directory_is_refused_before_any_output(work):
    """In a sticky directory (/tmp) only its owner may rename over a file, though anyone may write
    into it when it is world-writable: run by another user, --lse's rename failed (EPERM) after
    --out had been renamed into place, exit 2 with o.npy written."""
    nobody_can_run_attn()
    shared = shared_copy_of_inputs(work)
    try:
        theirs = os.path.join(shared, "lse.npy")
        with open(theirs, "wb") as f:
            f.write(b"root's")
        os.chmod(theirs, 0o666)
        r = run(["sdpa", "--q", f"{shared}/q.npy", "--k", f"{shared}/k.npy", "--v", f"{shared}/v.npy",
                 "--out", f"{shared}/o.npy", "--lse", theirs], preexec_fn=as_nobody)
        err = r.stderr.decode()
        assert r.returncode == 2, err
        assert err.startswith(f"attn: error: --lse: '{theirs}' belongs to another user (uid 0) in the sticky directory"), err
        assert sorted(os.listdir(shared)) == ["k.npy", "lse.npy", "q.npy", "v.npy"]
        with open(theirs, "rb") as f:
            assert f.read() == b"root's"
    finally:
        shutil.rmtree(shared)


def test_a_file_mounted_over_an_output_name_is_refused_before_any_output(work):
    """A file bind-mounted over a name (a container's `-v FILE:PATH`) cannot be renamed over (EBUSY):
    --lse's rename failed after --out had been renamed into place, exit 2 with o.npy written."""
    host, target = work / "host.npy", work / "mounted.npy"
    host.write_bytes(b"host's")
    target.write_bytes(b"")
    if subprocess.run(["mount", "--bind", str(host), str(target)], capture_output=True).returncode != 0:
        pytest.skip("a bind mount needs CAP_SYS_ADMIN")
    try:
        expect_error(work, sdpa(work, "--lse", target), f"--lse: '{target}' is a mount point")
        assert target.read_bytes() == b"host's"
    finally:
        subprocess.run(["umount", str(target)], check=True)


def chattr(flag, path):
    """True when chattr FLAG PATH worked (root, on a file system with the attribute)."""
    return subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0


def test_an_immutable_output_is_refused_before_any_output(work):
    """No rename replaces an immutable file (EPERM): --lse's rename failed after --out had been
    renamed into place, exit 2 with o.npy written."""
    target = work / "lse.npy"
    target.write_bytes(b"kept")
    if not chattr("+i", target):
        pytest.skip("chattr +i needs root and a file system that has it")
    try:
        expect_error(work, sdpa(work, "--lse", target), f"--lse: '{target}' is immutable (chattr +i)")
    finally:
        chattr("-i", target)
    assert target.read_bytes() == b"kept"


def test_an_output_in_an_append_only_directory_is_refused_before_anything_runs(work):
    """An append-only directory takes new names but no rename or removal: the rename into place
    failed after the computation (EPERM), and the staging file, which could not be removed either,
    was left behind."""
    out = work / "appendonly"
    out.mkdir()
    if not chattr("+a", out):
        pytest.skip("chattr +a needs root and a file system that has it")
    try:
        expect_error(work, sdpa(work, out=out / "o.npy"), f"--out: '{out / 'o.npy'}': its directory is append-only")
        assert os.listdir(out) == []
    finally:
        chattr("-a", out)


def traced_sdpa(work, *extra):
    """The rename/open/fsync calls of `attn sdpa` on work's inputs (strace), pids stripped; skips
    where strace is missing or cannot trace."""
    if shutil.which("strace") is None:
        pytest.skip("needs strace")
    log = work / "strace.log"
    r = subprocess.run(["strace", "-f", "-o", str(log), "-e", "trace=rename,renameat,renameat2,open,openat,fsync",
                        attn_bin(), *map(str, sdpa(work, *extra))], capture_output=True, timeout=TIMEOUT)
    if r.returncode != 0 and not (work / "o.npy").exists():
        pytest.skip(f"strace cannot trace here: {r.stderr.decode()[-200:]}")
    assert r.returncode == 0, r.stderr
    return [re.sub(r"^\d+ +", "", line) for line in log.read_text().splitlines()]


def directory_syncs(calls, directory):
    """Indices of the fsyncs of `directory` in calls. Descriptor numbers are reused (the staged
    files' own fsyncs use them too): each fsync is judged by what the latest open that returned
    its descriptor opened."""
    on_directory, synced = {}, []
    for i, c in enumerate(calls):
        if m := re.match(r'open(?:at)?\((?:AT_FDCWD, )?"([^"]*)", ([^)]*)\) = (\d+)', c):
            on_directory[m.group(3)] = m.group(1) == directory and "O_DIRECTORY" in m.group(2)
        elif (m := re.match(r"fsync\((\d+)\) += 0", c)) and on_directory.get(m.group(1)):
            synced.append(i)
    return synced


def test_a_renamed_output_is_synced_with_its_directory(work):
    """The staged file was synced before its rename, but not the rename: until the directory is
    synced a crash soon after attn exited 0 can bring back the old output (or none)."""
    calls = traced_sdpa(work)
    renamed = [i for i, c in enumerate(calls) if re.match(r"rename(at2?)?\(.*/o\.npy\"", c)]
    assert len(renamed) == 1, calls
    assert any(i > renamed[0] for i in directory_syncs(calls, str(work) + "/")), calls[renamed[0]:]


def test_outputs_sharing_a_directory_sync_it_once_after_every_rename(work):
    """Each rename synced the directory on its own: --out and --lse beside each other paid two
    directory fsyncs (3–5 ms each on ext4) where one after both renames puts both on disk."""
    calls = traced_sdpa(work, "--lse", work / "l.npy")
    renamed = [i for i, c in enumerate(calls) if re.match(r"rename(at2?)?\(.*/[ol]\.npy\"", c)]
    assert len(renamed) == 2, calls
    synced = directory_syncs(calls, str(work) + "/")
    assert len(synced) == 1 and synced[0] > max(renamed), calls[min(renamed):]


def test_each_output_is_resolved_once_when_written(work):
    """OutputFiles::stage resolved every output three times (once to pick the files staged before
    devices are opened, again for the devices' turn, again in AtomicFile), each a stat, an lstat and
    statx calls; then twice (check, and again when written — so a FIFO or link put at the name in
    between was written unchecked). Resolved once, before the computation (check), an existing
    output's statx is made once: the write checks the file it replaces on a descriptor (fstat)."""
    if shutil.which("strace") is None:
        pytest.skip("needs strace")
    for name in ("o.npy", "l.npy"):
        (work / name).write_bytes(b"old")
    log = work / "strace.log"
    r = subprocess.run(["strace", "-f", "-o", str(log), "-e", "trace=statx", attn_bin(),
                        *map(str, sdpa(work, "--lse", work / "l.npy"))], capture_output=True, timeout=TIMEOUT)
    if r.returncode != 0 and b"strace" in r.stderr:
        pytest.skip(f"strace cannot trace here: {r.stderr.decode()[-200:]}")
    assert r.returncode == 0, r.stderr
    calls = log.read_text()
    for name in ("o.npy", "l.npy"):
        assert calls.count(f'statx(AT_FDCWD, "{work / name}"') == 1, calls


def test_a_device_output_is_stated_once_and_checked_on_its_open_descriptor(work):
    """check() stat'ed a character device output twice more after resolve_output had (to find
    its landing file, then to tell it is a device before opening it) where the type resolve_output
    found and the fstat of the opened descriptor (open_direct) tell all: one stat that follows links."""
    if shutil.which("strace") is None:
        pytest.skip("needs strace")
    dev = null_device(work)
    log = work / "strace.log"
    r = subprocess.run(["strace", "-f", "-o", str(log), "-e", "trace=%stat,%lstat,%fstat", attn_bin(),
                        *map(str, sdpa(work, "--lse", work / "l.npy", out=dev))], capture_output=True, timeout=TIMEOUT)
    if r.returncode != 0 and b"strace" in r.stderr:
        pytest.skip(f"strace cannot trace here: {r.stderr.decode()[-200:]}")
    assert r.returncode == 0, r.stderr
    stats = [c for c in log.read_text().splitlines() if f'"{dev}"' in c and "AT_SYMLINK_NOFOLLOW" not in c]
    assert len(stats) == 1, stats


def test_a_descriptor_output_on_an_input_or_another_output_is_refused(work):
    """/dev/stdout on a regular file is checked like that file: `--out /dev/stdout >> q.npy` wrote
    into the input, and `--out o.npy --lse /dev/stdout > o.npy` lost the lse to the replaced file."""
    for target, extra, fragment in ((work / "q.npy", [], "names the same file as the input --q"),
                                    (work / "o.npy", ["--lse", "/dev/stdout"], "names the same file as --out")):
        before = target.read_bytes() if target.exists() else None
        args = sdpa(work, out="/dev/stdout" if not extra else work / "o.npy") + extra
        with open(target, "ab") as f:
            r = subprocess.run([attn_bin(), *map(str, args)], stdout=f, stderr=subprocess.PIPE)
        assert r.returncode == 2, (args, r.stderr)
        assert fragment in r.stderr.decode(), r.stderr
        assert (target.read_bytes() if target.exists() else None) == (before if before is not None else b"")


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_an_output_that_stdout_or_stderr_is_redirected_to_is_refused(work, stream):
    """`attn sdpa … --verbose --lse l.npy > l.npy` (or 2>): the rename replaced the file the shell
    had opened, and what attn printed there (--verbose's kernel choice) went with it."""
    target = work / "l.npy"
    target.write_bytes(b"OLD\n")
    with open(target, "ab") as f:
        r = subprocess.run([attn_bin(), *map(str, sdpa(work, "--verbose", "--lse", target))], timeout=TIMEOUT,
                           stdout=f if stream == "stdout" else subprocess.PIPE,
                           stderr=f if stream == "stderr" else subprocess.PIPE)
    assert r.returncode == 2, r.stderr
    text = target.read_bytes()
    assert text.startswith(b"OLD\n"), text[:100]  # not replaced
    err = (r.stderr if stream == "stdout" else text[len(b"OLD\n"):]).decode()
    assert err == (f"attn: error: --lse: path '{target}' names the file {stream} is redirected to, which it would "
                   f"replace, losing what attn prints there: redirect {stream} to another file\n"), err
    assert listing(work) == ["k.npy", "l.npy", "q.npy", "v.npy", "w.npy"]


@pytest.mark.parametrize("how", ["hard link", "symbolic link"])
def test_two_output_paths_to_one_existing_file_are_refused(work, how):
    """The rule the descriptor pairs below extend: one file by two names (its device and inode, or
    the path resolved) is one output's file, whichever option names it."""
    (work / "o.npy").write_bytes(b"OLD")
    (os.link if how == "hard link" else os.symlink)(work / "o.npy", work / "other.npy")
    err = expect_error(work, sdpa(work, "--lse", work / "other.npy", out=work / "o.npy"))
    assert err == f"attn: error: --lse: path '{work / 'other.npy'}' names the same file as --out ('{work / 'o.npy'}')\n", err
    assert (work / "o.npy").read_bytes() == b"OLD"


@pytest.mark.parametrize("redirect", ["1> f 2> f", "1> f 2>> f", "<> f"])
def test_two_descriptor_outputs_open_on_one_regular_file_are_refused(work, redirect):
    """`--out /dev/stdout --lse /dev/stderr` with the descriptors open on one regular file, each at
    its own offset, was written: through `1> f 2> f` the lse was written over the output (opened
    here without the truncation, so that the test sees nothing was written), through `1> f 2>> f`
    too when the lse came first. `<> f` opens f read-write, for /dev/stdin too. Refused before
    anything runs, as two paths to one file are."""
    target = work / "f"
    target.write_bytes(b"OLD\n")
    first, second, fds = ("/dev/stdin", "/dev/stdout", (0, 1)) if redirect == "<> f" else ("/dev/stdout", "/dev/stderr", (1, 2))
    args = [attn_bin(), *map(str, sdpa(work, "--lse", second, out=first))]
    with open(target, "r+b") as own_offset, open(target, "r+b") as own_offset_too, open(target, "ab") as appending:
        streams = {"1> f 2> f": {"stdout": own_offset, "stderr": own_offset_too},
                   "1> f 2>> f": {"stdout": own_offset, "stderr": appending},
                   "<> f": {"stdin": own_offset, "stdout": appending, "stderr": subprocess.PIPE}}[redirect]
        r = subprocess.run(args, timeout=TIMEOUT, **streams)
    assert r.returncode == 2, r.stderr
    text = target.read_bytes()
    expected = (f"attn: error: --lse: path '{second}' names the same file as --out ('{first}') (descriptors {fds[0]} "
                f"and {fds[1]} are open on one regular file)\n").encode()
    # The error line itself went to f where stderr is f: over "OLD\n" (its own offset) or after it.
    assert r.stderr == expected if r.stderr is not None else text in (expected, b"OLD\n" + expected), (r.stderr, text)
    assert b"\x93NUMPY" not in text, text[:200]  # no output was written


def kcmp_tells_shared_files():
    """Whether this kernel lets a process compare its own descriptors (kcmp(KCMP_FILE))."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open("/dev/null", os.O_WRONLY)
    dup = os.dup(fd)
    try:
        return libc.syscall(312 if os.uname().machine == "x86_64" else 272, os.getpid(), os.getpid(), 0, fd, dup) == 0
    finally:
        os.close(fd)
        os.close(dup)


@pytest.mark.parametrize("redirect", ["> f 2>&1", ">> f 2>> f"])
def test_descriptor_outputs_sharing_one_offset_or_appending_are_one_stream(work, redirect):
    """`--out /dev/stdout --lse /dev/stderr` under `> f 2>&1` (one open file: one offset) or
    `>> f 2>> f` (each write at the end) comes out one output after the other, as one descriptor
    named twice does: they were refused as two descriptors on one file. Where kcmp cannot tell
    that two descriptors share one open file, `2>&1` is still refused."""
    out = reference_output(work, "--lse", work / "ref_lse.npy")
    lse = (work / "ref_lse.npy").read_bytes()
    target = work / "f"
    target.write_bytes(b"OLD\n")
    args = [attn_bin(), *map(str, sdpa(work, "--lse", "/dev/stderr", out="/dev/stdout"))]
    with open(target, "ab") as appending, open(target, "ab") as appending_too:
        streams = {"> f 2>&1": {"stdout": appending, "stderr": subprocess.STDOUT},
                   ">> f 2>> f": {"stdout": appending, "stderr": appending_too}}[redirect]
        r = subprocess.run(args, timeout=TIMEOUT, **streams)
    if redirect == "> f 2>&1" and not kcmp_tells_shared_files():
        assert r.returncode == 2 and b"are open on one regular file" in target.read_bytes()
        return
    assert r.returncode == 0, target.read_bytes()[-300:]
    assert target.read_bytes() == b"OLD\n" + out + lse


def test_outputs_through_one_descriptor_are_written_one_after_the_other(work):
    """One descriptor named twice (`--out /dev/stdout --lse /dev/stdout > f`) is one stream at one
    offset: f holds the output, then the lse — a reader loads them in turn. Not refused."""
    out = reference_output(work, "--lse", work / "ref_lse.npy")
    lse = (work / "ref_lse.npy").read_bytes()
    with open(work / "f", "wb") as f:
        r = subprocess.run([attn_bin(), *map(str, sdpa(work, "--lse", "/proc/self/fd/1", out="/dev/stdout"))],
                           stdout=f, stderr=subprocess.PIPE, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert (work / "f").read_bytes() == out + lse


def test_printed_text_that_cannot_be_written_is_an_error(work):
    """`attn --help > /dev/full` exited 0 while every write failed."""
    with open("/dev/full", "wb") as full:
        for args in (["--help"], ["bench", "--list"], ["demo", "--no-heatmap"]):
            r = subprocess.run([attn_bin(), *args], stdout=full, stderr=subprocess.PIPE, cwd=work)
            assert r.returncode == 2, (args, r.returncode, r.stderr)
            assert r.stderr.decode().startswith("attn: error: stdout: write failed"), (args, r.stderr)


def read_in_background(fifo):
    """A thread reading `fifo` to its end, started: got["bytes"] holds what it read once joined."""
    got = {}

    def reader():
        with open(fifo, "rb") as f:
            got["bytes"] = f.read()

    t = threading.Thread(target=reader)
    t.start()
    return t, got


def test_a_fifo_output_is_written_into(work):
    expected = reference_output(work, "--lse", work / "ref_lse.npy")
    os.remove(work / "ref_lse.npy")
    os.mkfifo(work / "pipe")
    t, got = read_in_background(work / "pipe")
    r = run(sdpa(work, "--lse", work / "lse.npy", out=work / "pipe"))
    t.join(TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert got["bytes"] == expected
    assert stat.S_ISFIFO(os.lstat(work / "pipe").st_mode)
    assert np.load(work / "lse.npy").shape == (B, HQ, LQ)
    assert staging_files(work) == []


def test_a_fifo_named_by_two_outputs_is_opened_once(work):
    """`--out pipe --lse link` (a link to pipe): the FIFO was opened and closed for each output, so
    its reader could take the first close for the end of its input, and attn's second open then
    waited for a reader that never came. Now opened once: the reader gets both, in order."""
    if shutil.which("strace") is None:
        pytest.skip("needs strace")
    expected = reference_output(work, "--lse", work / "ref_lse.npy") + (work / "ref_lse.npy").read_bytes()
    os.remove(work / "ref_lse.npy")
    os.mkfifo(work / "pipe")
    os.symlink("pipe", work / "link")
    t, got = read_in_background(work / "pipe")
    log = work / "strace.log"
    r = subprocess.run(["strace", "-f", "-o", str(log), "-e", "trace=open,openat", attn_bin(),
                        *map(str, sdpa(work, "--lse", work / "link", out=work / "pipe"))], capture_output=True,
                       timeout=TIMEOUT)
    t.join(TIMEOUT)
    if r.returncode != 0 and b"strace" in r.stderr:
        pytest.skip(f"strace cannot trace here: {r.stderr.decode()[-200:]}")
    assert r.returncode == 0, r.stderr
    assert got["bytes"] == expected
    opens = [c for c in log.read_text().splitlines() if re.search(f'"{work}/(pipe|link)", O_WRONLY', c)]
    assert len(opens) == 1, opens


def test_a_fifo_whose_reader_leaves_is_an_error_not_a_silent_death(work):
    """The reader closes at once: write() gets EPIPE (SIGPIPE is ignored), the one error line names
    the FIFO, and the other (regular) output is not left behind."""
    os.mkfifo(work / "pipe")
    big = ["--weights", work / "pipe"]  # weights: large enough to outlast the pipe buffer
    np.save(work / "q.npy", np.ones((1, 1, 600, DK), np.float32))
    np.save(work / "k.npy", np.ones((1, 1, 600, DK), np.float32))
    np.save(work / "v.npy", np.ones((1, 1, 600, DV), np.float32))

    def reader():
        with open(work / "pipe", "rb") as f:
            f.read(10)

    t = threading.Thread(target=reader)
    t.start()
    err = expect_error(work, sdpa(work, *big, out="o.npy"), "pipe", "write failed")
    t.join(TIMEOUT)
    assert "Broken pipe" in err


def test_a_symlink_output_replaces_its_target_not_the_link(work):
    (work / "real.npy").write_bytes(b"old")
    os.symlink("real.npy", work / "link.npy")
    r = run(sdpa(work, out=work / "link.npy"))
    assert r.returncode == 0, r.stderr
    assert os.path.islink(work / "link.npy")
    assert np.load(work / "real.npy").shape == (B, HQ, LQ, DV)
    assert staging_files(work) == []


def test_a_dangling_symlink_output_creates_its_target_and_keeps_the_link(work):
    os.symlink("new.npy", work / "link.npy")  # new.npy does not exist yet
    r = run(sdpa(work, out=work / "link.npy"))
    assert r.returncode == 0, r.stderr
    assert os.path.islink(work / "link.npy")  # it was replaced by a regular file (a review found it)
    assert np.load(work / "new.npy").shape == (B, HQ, LQ, DV)
    assert staging_files(work) == []
    err = expect_error(work, sdpa(work, "--lse", work / "new.npy", out=work / "link.npy"), "--lse", "names the same file as --out")


def test_a_replaced_output_keeps_its_permissions(work):
    # A private 0600 result became 0644 when replaced (the new file got 0666 & ~umask); a new one
    # still gets the umask's (a hostile-use review).
    (work / "private.npy").write_bytes(b"old")
    os.chmod(work / "private.npy", 0o600)
    r = run(sdpa(work, out=work / "private.npy"))
    assert r.returncode == 0, r.stderr
    assert (os.stat(work / "private.npy").st_mode & 0o777) == 0o600
    r = run(sdpa(work, out=work / "fresh.npy"))
    mask = os.umask(0)
    os.umask(mask)
    assert (os.stat(work / "fresh.npy").st_mode & 0o777) == 0o666 & ~mask


def test_a_symlink_output_whose_target_cannot_be_reached_is_an_error_and_stays_a_link(work):
    # a → b → a, or a target under a regular file: the output replaced the link with a regular
    # file and exited 0 (reviews found both).
    os.symlink("b.npy", work / "a.npy")
    os.symlink("a.npy", work / "b.npy")
    expect_error(work, sdpa(work, out=work / "a.npy"), "--out", "is a symbolic link whose target cannot be reached",
                 "Too many levels of symbolic links")
    (work / "plain.txt").write_bytes(b"x")
    os.symlink("plain.txt/x.npy", work / "under_a_file.npy")
    expect_error(work, sdpa(work, out=work / "under_a_file.npy"), "--out", "cannot be reached (Not a directory)")
    assert all(os.path.islink(work / n) for n in ("a.npy", "b.npy", "under_a_file.npy"))


# ---- class 3: signals, limits, names ------------------------------------------------------------

def start_blocked_on_a_fifo(work):
    """sdpa with two regular outputs and a FIFO output nobody reads: attn writes the regular ones
    to staging files, then blocks opening the FIFO. Returns the process once the staging files exist."""
    os.mkfifo(work / "pipe")
    p = subprocess.Popen([attn_bin(), *map(str, sdpa(work, "--lse", work / "lse.npy", "--weights", work / "pipe"))],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + TIMEOUT
    while len(staged_outputs(p, work)) < 2:
        assert p.poll() is None, p.stderr.read()
        assert time.monotonic() < deadline, "the staging files never appeared"
        time.sleep(0.01)
    return p


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_termination_signal_removes_the_staging_files(work, sig):
    before = listing(work)
    p = start_blocked_on_a_fifo(work)
    p.send_signal(sig)
    p.wait(TIMEOUT)
    assert p.returncode == -sig, f"expected death by {sig!r}, got exit {p.returncode}"
    assert staging_files(work) == [], staging_files(work)
    assert listing(work) == sorted(before + ["pipe"])


LARGE_L = 4500  # a 160 MB --weights file


def start_large_write(work, seed, env=None):
    """Starts `attn sdpa` writing a 160 MB --weights file and returns (process, listing before)
    once its first staging file appears (or the process has ended)."""
    rng = np.random.default_rng(seed)
    for n, dd in (("q", DK), ("k", DK), ("v", DV)):
        np.save(work / f"{n}.npy", rng.standard_normal((1, 2, LARGE_L, dd)).astype(np.float32))
    before = listing(work)
    p = subprocess.Popen([attn_bin(), *map(str, sdpa(work, "--weights", work / "big.npy"))],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + TIMEOUT
    while not staged_outputs(p, work) and p.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    return p, before


def test_sigterm_during_a_large_write_leaves_nothing(work):
    """SIGTERM as soon as the staging file appears (mid-write, or at worst just before the
    rename); no staging file may survive, and no half file appear."""
    L = LARGE_L
    p, before = start_large_write(work, 0)
    p.send_signal(signal.SIGTERM)
    p.wait(TIMEOUT)
    assert staging_files(work) == []
    if p.returncode == 0:  # finished before the signal: then both outputs are complete
        assert np.load(work / "big.npy").shape == (1, 2, L, L)
    else:
        assert p.returncode == -signal.SIGTERM
        assert listing(work) == before


def test_sigkill_during_a_large_write_leaves_nothing(work):
    """SIGKILL (mpirun's second signal, a second after SIGTERM) cannot be handled: the outputs are
    written into unnamed files (O_TMPFILE), named only just before their rename, so a killed
    writer leaves nothing. (Staging names written into left 1–4 hidden files of up to 64 MB.)
    The writer is stopped once it writes, so the kill lands mid-write, never in the rename."""
    if not has_o_tmpfile(work):
        pytest.skip("skipped: the file system lacks O_TMPFILE (named staging files are used there)")
    p, before = start_large_write(work, 2)
    p.send_signal(signal.SIGSTOP)
    if p.poll() is not None or (work / "big.npy").exists():
        p.send_signal(signal.SIGCONT)
        p.wait(TIMEOUT)
        pytest.skip("the process finished its outputs before it could be stopped mid-write")
    assert staging_files(work) == [], "a named staging file while writing"
    p.send_signal(signal.SIGKILL)
    p.wait(TIMEOUT)
    assert p.returncode == -signal.SIGKILL
    assert staging_files(work) == [] and listing(work) == before


def tgkill(pid, tid, sig):
    """Send `sig` to one thread (tgkill(2); Python's os.kill is process-directed)."""
    import ctypes
    SYS_tgkill = {"x86_64": 234, "aarch64": 131}[os.uname().machine]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_tgkill, pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")


def test_sigterm_on_a_worker_thread_ends_the_process_and_leaves_nothing(work):
    """A termination signal can land on any thread of the process, e.g. an idle OpenMP worker:
    it must be passed to the main thread (which creates the staging files), so the process
    still dies of SIGTERM with no staging file left and no half file published."""
    L = LARGE_L
    p, before = start_large_write(work, 1, env={**os.environ, "OMP_NUM_THREADS": "2"})
    workers = [int(t) for t in os.listdir(f"/proc/{p.pid}/task") if int(t) != p.pid] if p.poll() is None else []
    if not workers:
        p.wait(TIMEOUT)
        pytest.skip("the process finished or had no second thread by the time its output was staged")
    both_published = (work / "big.npy").exists() and (work / "o.npy").exists()
    tgkill(p.pid, workers[0], signal.SIGTERM)
    p.wait(TIMEOUT)
    assert staging_files(work) == []
    if both_published:  # finished before the signal: then both outputs are complete
        assert np.load(work / "big.npy").shape == (1, 2, L, L)
    else:  # a signal the worker swallowed would let the process finish with status 0
        assert p.returncode == -signal.SIGTERM
        assert listing(work) == before


def limit_file_size(nbytes):
    # SIGXFSZ keeps its default action (death): attn itself must ignore it.
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, resource.RLIM_INFINITY))


def uses_llvm_openmp():
    """A clang build links LLVM's libomp, which creates a shared-memory file when it loads: under
    `ulimit -f` that fails (SIGBUS, "OMP: Error #179") before attn's main runs."""
    maps = subprocess.run(["ldd", attn_bin()], capture_output=True, text=True).stdout
    return "libomp" in maps


ulimit_f_testable = pytest.mark.skipif(uses_llvm_openmp(), reason="libomp (a clang build) dies under ulimit -f "
                                                                   "at load, before attn runs")


@ulimit_f_testable
@pytest.mark.parametrize("which", ["--out", "--weights", "--lse"])
def test_ulimit_f_gives_the_one_line_error(work, which):
    paths = {"--out": work / "o.npy", "--weights": work / "big.npy", "--lse": work / "l.npy"}
    args = sdpa(work, "--weights", paths["--weights"], "--lse", paths["--lse"], out=paths["--out"])
    # every output above 128 bytes (the .npy header) fails; the first written fails first
    err = expect_error(work, args, "write failed", "File too large", preexec_fn=limit_file_size(100))
    assert any(f"{flag}: '{p}': write failed" in err for flag, p in paths.items()), err  # the path quoted


def save_f32_safetensors(path, tensors):
    """A minimal safetensors file (F32 only), enough for the CLI's --params."""
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


@ulimit_f_testable
def test_ulimit_f_on_other_writers(work):
    """The heatmap (PNG through cairo) and the MHA output die neither of SIGXFSZ."""
    expect_error(work, ["heatmap", work / "w.npy", "--out", work / "h.png"], "h.png", "File too large",
                 preexec_fn=limit_file_size(64))
    E = 4
    rng = np.random.default_rng(1)
    np.save(work / "x.npy", rng.standard_normal((3, 1, E)).astype(np.float32))
    save_f32_safetensors(work / "p.safetensors", {
        "in_proj_weight": rng.standard_normal((3 * E, E)), "in_proj_bias": rng.standard_normal(3 * E),
        "out_proj.weight": rng.standard_normal((E, E)), "out_proj.bias": rng.standard_normal(E)})
    args = ["mha", "--params", work / "p.safetensors", "--num-heads", "1", "--query", work / "x.npy", "--out", work / "y.npy"]
    r = run(args)
    assert r.returncode == 0, r.stderr  # the arguments are good: only the limit makes it fail
    os.remove(work / "y.npy")
    expect_error(work, args, "y.npy", "File too large", preexec_fn=limit_file_size(100))


def test_an_empty_output_name_is_refused_before_anything_is_read(work):
    """The inputs do not even exist: the empty name is refused first, so nothing was computed."""
    for flag in ("--out", "--weights", "--lse"):
        args = ["sdpa", "--q", work / "nope.npy", "--k", work / "k.npy", "--v", work / "v.npy", "--out", work / "o.npy"]
        if flag == "--out":
            args[args.index("--out") + 1] = ""
        else:
            args += [flag, ""]
        expect_error(work, args, flag, "empty")
    expect_error(work, ["heatmap", work / "nope.npy", "--out", ""], "--out", "empty")
    expect_error(work, ["demo", "--heatmap", ""], "--heatmap", "empty")
    expect_error(work, ["bench", "--json", "", "--list"], "--json", "empty")


@pytest.mark.parametrize("command, option, fragment", [
    ("sdpa", "--out-dtype", "expected float16, bfloat16, float32 or float64 but got 'float8'"),
    ("mha", "--out-dtype", "expected float16, bfloat16 or float32 but got 'float8'"),
    ("mha", "--param-dtype", "expected float16, bfloat16 or float32 but got 'float8'"),
    ("mha", "--intermediate-dtype", "expected float16, bfloat16 or float32 but got 'float8'"),
])
def test_a_bad_dtype_option_is_refused_before_anything_is_read(work, command, option, fragment):
    """The inputs do not even exist: the dtype option is named, not the first file (--out-dtype
    was parsed only once Q, K and V had been read, which could take minutes)."""
    if command == "sdpa":
        args = ["sdpa", "--q", work / "nope.npy", "--k", work / "nope.npy", "--v", work / "nope.npy", "--out", work / "o.npy"]
    else:
        args = ["mha", "--params", work / "nope.safetensors", "--num-heads", "1", "--query", work / "nope.npy",
                "--out", work / "o.npy"]
    expect_error(work, args + [option, "float8"], option + ": " + fragment)


@pytest.mark.parametrize("length", [200, 243, 244, 250, 254, 255])
def test_output_names_up_to_name_max(work, length):
    name = ("n" * (length - 4)) + ".npy"
    lse = ("l" * (length - 4)) + ".npy"
    r = run(sdpa(work, "--lse", work / lse, out=work / name))
    assert r.returncode == 0, r.stderr
    assert np.load(work / name).shape == (B, HQ, LQ, DV)
    assert np.load(work / lse).shape == (B, HQ, LQ)
    assert staging_files(work) == []


def test_a_name_over_name_max_names_the_users_path(work):
    name = "x" * 256 + ".npy"
    err = expect_error(work, sdpa(work, out=work / name), name[:40], "File name too long")
    assert ".tmp." not in err


def test_a_name_over_name_max_on_a_later_output_is_refused_before_any_output(work):
    # The files were renamed into place one by one: --out was published, then --lse's rename
    # failed (found by a review). The names are now checked with the other paths, first.
    lse = "l" * 252 + ".npy"
    err = expect_error(work, sdpa(work, "--lse", work / lse, out=work / "o.npy"), "--lse", "File name too long")
    assert not (work / "o.npy").exists()
    assert staging_files(work) == []


# ---- class 7: numbers ---------------------------------------------------------------------------

BIG = "99999999999999999999"


def mha_args(d):
    x = np.random.default_rng(2).standard_normal((3, 1, 4)).astype(np.float32)
    np.save(d / "x.npy", x)
    return ["mha", "--params", d / "missing.safetensors", "--query", d / "x.npy", "--out", d / "y.npy"]


BAD_NUMBERS = [
    # (command, option, value, fragment of the message)
    ("sdpa", "--window-left", BIG, "out of range"),
    ("sdpa", "--window-left", "-" + BIG, "out of range"),
    ("sdpa", "--window-right", "9223372036854775808", "out of range"),
    ("sdpa", "--window-left", "", "empty"),
    ("sdpa", "--window-left", "1.5", "expected an integer"),
    ("sdpa", "--window-left", "0x10", "expected an integer"),
    ("sdpa", "--window-left", " 3", "expected an integer"),
    ("sdpa", "--window-left", "3 ", "expected an integer"),
    ("sdpa", "--window-left", "true", "expected an integer"),
    ("sdpa", "--query-offset", BIG, "out of range"),
    ("sdpa", "--seed", "-1", "non-negative"),
    ("sdpa", "--seed", "18446744073709551616", "out of range"),
    ("sdpa", "--seed", "", "empty"),
    ("sdpa", "--scale", "", "empty"),
    ("sdpa", "--scale", "nan", "finite"),
    ("sdpa", "--scale", "inf", "finite"),
    ("sdpa", "--scale", "-inf", "finite"),
    ("sdpa", "--scale", "1e999", "1e999 overflows a double: it rounds to infinity"),
    # It said "out of the range of a double", as if it were huge: it is a number too near 0.
    ("sdpa", "--scale", "1e-400", "1e-400 underflows a double: it is not 0 but rounds to 0"),
    ("heatmap", "--vmax", "-0.0000001e-399", "-0.0000001e-399 underflows a double"),
    ("sdpa", "--scale", "0.5x", "expected a number"),
    ("sdpa", "--scale", "0x1p3", "expected a number"),
    ("sdpa", "--dropout", "", "empty"),
    ("mha", "--num-heads", BIG, "out of range"),
    ("mha", "--num-heads", "", "empty"),
    ("mha", "--num-heads", "2.0", "expected an integer"),
    ("mha", "--dropout-seed", "-1", "non-negative"),
    ("mha", "--dropout-p", "nan", "finite"),
    ("heatmap", "--head", BIG, "out of range"),
    ("heatmap", "--batch", "-" + BIG, "out of range"),
    ("heatmap", "--vmax", "", "empty"),
    ("heatmap", "--vmax", "inf", "finite"),
    ("bench", "--runs", BIG, "out of range"),
    ("bench", "--threads", "", "empty"),
    ("bench", "--max-seconds", "nan", "finite"),
    ("bench", "--reference-max-gflop", "-1", "must be >= 0"),  # was accepted (a full run)
]


def command_args(d, command):
    if command == "sdpa":
        return sdpa(d)
    if command == "mha":
        return mha_args(d) + ["--num-heads", "1"]
    if command == "heatmap":
        return ["heatmap", d / "w.npy", "--out", d / "h.png"]
    return ["bench", "--list"]


@pytest.mark.parametrize("command,option,value,fragment", BAD_NUMBERS)
def test_bad_numbers_are_errors_naming_the_option(work, command, option, value, fragment):
    args = command_args(work, command)
    if option in args:
        args[args.index(option) + 1] = value
    else:
        args += [option, value]
    err = expect_error(work, args, option + ": ", fragment)
    if fragment == "out of range":
        assert value in err, f"the message must quote what was given, not a clamped value: {err!r}"


# A double rounds to nearest even, so the numbers the parser refuses are those that round to 0 or
# to infinity: a nonzero magnitude up to 2^-1075 (half the smallest double, 5e-324) or from
# 2^1024 - 2^970 (half a step past the largest); both bounds are ties, which round away. (The
# messages said "below the smallest, 5e-324" and "above the largest", but 3e-324 and
# 1.7976931348623158e308 are taken, as the nearest doubles.) Each bound is written out exactly.
TIE_TO_ZERO = f"{5**1075}e-1075"  # 2^-1075 = 5^1075 / 10^1075
TIE_TO_INF = str(2**1024 - 2**970)
UNDERFLOW = ("underflows a double: it is not 0 but rounds to 0, as every magnitude up to 2^-1075 ≈ "
             "2.4703282292062327e-324 does (half the smallest double, 5e-324; a larger one reads as 5e-324 or more); "
             "give 0 for zero")
OVERFLOW = ("overflows a double: it rounds to infinity, as every magnitude from 2^1024 - 2^970 ≈ "
            "1.7976931348623158e+308 up does (the largest double is 1.7976931348623157e+308)")


@pytest.mark.parametrize("value,why", [
    ("1e-400", UNDERFLOW), ("-1e-400", UNDERFLOW), (TIE_TO_ZERO, UNDERFLOW), ("-" + TIE_TO_ZERO, UNDERFLOW),
    ("2.4703282292062327e-324", UNDERFLOW),  # 17 digits of the bound: just below it
    ("1e999", OVERFLOW), (TIE_TO_INF, OVERFLOW), ("-" + TIE_TO_INF, OVERFLOW), ("1.8e308", OVERFLOW),
])
def test_a_number_a_double_cannot_hold_is_refused_with_the_bound(work, value, why):
    err = expect_error(work, sdpa(work, "--scale", value), "--scale: ")
    assert err == f"attn: error: --scale: {value} {why}\n"


@pytest.mark.parametrize("value,read_as", [
    ("3e-324", "5e-324"), ("2.4703282292062328e-324", "5e-324"), (f"{5**1075}1e-1076", "5e-324"),
    ("-3e-324", "-5e-324"), (str(2**1024 - 2**970 - 1), "1.7976931348623157e+308"),
    ("1.7976931348623158e308", "1.7976931348623157e+308"), ("-1.7976931348623158e308", "-1.7976931348623157e+308"),
])
def test_a_number_that_rounds_to_a_double_is_read_as_it(work, value, read_as):
    # The parser takes it; the scale's own rule then quotes it with the double it was read as (it
    # said "got 5e-324" where the user wrote 3e-324).
    err = expect_error(work, sdpa(work, "--scale", value), "--scale: ")
    assert "sdpa: --scale: must be " in err and f" but got {value} (reads as {read_as})" in err, err
    assert "a double" not in err
    # And where the value is in range, the command runs.
    if read_as == "5e-324":
        r = run(sdpa(work, "--dropout", value, "--seed", "1"))
        assert r.returncode == 0, r.stderr
        assert (work / "o.npy").exists()


# Values of options that need no tensor, out of the library's range (sdpa's check_option_values),
# each given with inputs that do not exist: the option is named, in the library's words with the
# flag for the field, before any file is read. The CLI read --q, --k and --v first, so it named
# the missing --q (and read gigabytes before it refused a --softcap of -1).
SOFTCAP_RANGE = "must be 0 (off) or a finite float32 in [1.1754944e-38, 3.4028235e38] but got "
WHY_A_SEED = (": the keep mask is a function of it, so a training loop passes a new seed each step and the backward "
              "the forward's (attn has no global generator)")
BAD_OPTION_VALUES = [
    # (extra arguments, the message after "attn: error: ")
    (["--softcap", "-1"], "sdpa: --softcap: " + SOFTCAP_RANGE + "-1"),
    (["--softcap", "1e-40"], "sdpa: --softcap: " + SOFTCAP_RANGE + "1e-40"),
    (["--softcap", "1e39"], "sdpa: --softcap: " + SOFTCAP_RANGE + "1e39"),
    (["--scale", "1e39"], "sdpa: --scale: must be finite in float32 (|scale| <= 3.4028235e38) but got 1e39"),
    # Non-zero, but 0 in float32: every score would be 0 (it was accepted, and gave uniform weights).
    (["--scale", "1e-50"], "sdpa: --scale: must be 0 or a normal float32 "
                           "(|scale| >= 2^-126 ≈ 1.1754944e-38 there) but got 1e-50, which rounds to 0"),
    # A float32 subnormal: the scale with fewer bits (it was accepted).
    (["--scale", "1e-40"], "sdpa: --scale: must be 0 or a normal float32 "
                           "(|scale| >= 2^-126 ≈ 1.1754944e-38 there) but got 1e-40, a float32 subnormal"),
    (["--scale", "-1e-40", "--cu-seqlens-q", "nope_cq.npy", "--cu-seqlens-k", "nope_ck.npy"],
     "sdpa_varlen: --scale: must be 0 or a normal float32 (|scale| >= 2^-126 ≈ 1.1754944e-38 there) but got -1e-40, "
     "a float32 subnormal"),
    (["--window-left", "-2"],
     "sdpa: --window-left/--window-right: left and right must be >= 0, or -1 for unbounded, but got left=-2 right=-1"),
    (["--window-right", "-7", "--causal"],
     "sdpa: --window-left/--window-right: left and right must be >= 0, or -1 for unbounded, but got left=-1 right=-7"),
    (["--query-offset", str(2**61)], f"sdpa: --query-offset: must be in [-2^60, 2^60] but got {2**61}"),
    (["--query-offset", str(-2**61)], f"sdpa: --query-offset: must be in [-2^60, 2^60] but got {-2**61}"),
    # The backward: the forward runs first, so it is the forward's words.
    (["--softcap", "-1", "--grad-out", "nope_do.npy", "--dq", "dq.npy", "--dk", "dk.npy", "--dv", "dv.npy"],
     "sdpa: --softcap: " + SOFTCAP_RANGE + "-1"),
    # Packed sequences: sdpa_varlen's.
    (["--softcap", "-1", "--cu-seqlens-q", "nope_cq.npy", "--cu-seqlens-k", "nope_ck.npy"],
     "sdpa_varlen: --softcap: " + SOFTCAP_RANGE + "-1"),
    (["--scale", "-1e39", "--cu-seqlens-q", "nope_cq.npy", "--cu-seqlens-k", "nope_ck.npy"],
     "sdpa_varlen: --scale: must be finite in float32 (|scale| <= 3.4028235e38) but got -1e39"),
    # --dropout: the library's rule and words too (the CLI had its own, "expected a probability").
    (["--dropout", "1.5", "--seed", "1"], "sdpa: --dropout: must be in [0, 1) but got 1.5"),
    (["--dropout", "-0.1"], "sdpa: --dropout: must be in [0, 1) but got -0.1"),
    (["--dropout", "1", "--cu-seqlens-q", "nope_cq.npy", "--cu-seqlens-k", "nope_ck.npy"],
     "sdpa_varlen: --dropout: must be in [0, 1) but got 1"),
    # p > 0 without a seed: the library's rule and words (require_dropout) with the options for
    # both arguments and how a seed is given here, "--seed N" (the CLI had its own, "--dropout:
    # 0.25 needs --seed N (…)"; the library's words then lost the hint).
    (["--dropout", "0.25"], "sdpa: --seed: --dropout = 0.25 needs a seed (--seed N)" + WHY_A_SEED),
    (["--dropout", "0.5", "--cu-seqlens-q", "nope_cq.npy", "--cu-seqlens-k", "nope_ck.npy"],
     "sdpa_varlen: --seed: --dropout = 0.5 needs a seed (--seed N)" + WHY_A_SEED),
]


@pytest.mark.parametrize("extra,message", BAD_OPTION_VALUES)
def test_option_values_are_checked_before_any_input_is_read(work, extra, message):
    missing = work / "nope.npy"
    args = ["sdpa", "--q", missing, "--k", missing, "--v", missing, "--out", work / "o.npy"]
    args += [work / a if a.startswith("nope_") or a.endswith(".npy") else a for a in extra]
    err = expect_error(work, args)
    assert err.rstrip("\n") == "attn: error: " + message, err


# attn mha: the layer's values that need no file (num_heads, softcap — sdpa's rule —, dropout_p),
# checked before --params is read, in the layer's words with the option for the field. --softcap
# and --num-heads were refused by the layer only after --params was read: a missing one was named.
MHA_BAD_OPTION_VALUES = [
    (["--softcap", "-1"], "MultiHeadAttention: --softcap: " + SOFTCAP_RANGE + "-1"),
    (["--softcap", "1e-40"], "MultiHeadAttention: --softcap: " + SOFTCAP_RANGE + "1e-40"),
    (["--softcap", "1e39", "--alibi"], "MultiHeadAttention: --softcap: " + SOFTCAP_RANGE + "1e39"),
    (["--num-heads", "0"], "MultiHeadAttention: --num-heads: must be >= 1 but got 0"),
    (["--num-heads", "-3", "--alibi"], "MultiHeadAttention: --num-heads: must be >= 1 but got -3"),
    (["--dropout-p", "1.5", "--grad-out", "nope_do.npy", "--grads", "g.safetensors"],
     "MultiHeadAttention: --dropout-p: must be in [0, 1) but got 1.5"),
    (["--dropout-p", "0.25", "--grad-out", "nope_do.npy", "--grads", "g.safetensors"],
     "MultiHeadAttention: --dropout-seed: --dropout-p = 0.25 needs a seed (--dropout-seed N)" + WHY_A_SEED),
]


@pytest.mark.parametrize("extra,message", MHA_BAD_OPTION_VALUES)
def test_mha_option_values_are_checked_before_any_input_is_read(work, extra, message):
    args = ["mha", "--params", work / "nope.safetensors", "--query", work / "nope.npy", "--out", work / "o.npy"]
    args += [] if "--num-heads" in extra else ["--num-heads", "2"]
    args += [work / a if a.startswith("nope_") or a.endswith((".npy", ".safetensors")) else a for a in extra]
    err = expect_error(work, args)
    assert err.rstrip("\n") == "attn: error: " + message, err


# Every number a message quotes is the text the user wrote, with the number it reads as where that
# is another one: the strict parser hands the library (and CLI11) the shortest text of the double,
# and the messages said "got 5e-324" for 3e-324, "1e+39" for 1e39, "1" for 0.99999999999999999.
# One case per number option with a message about its value (every FLOAT option; --num-heads, --runs, --threads).
NUMBERS_AS_WRITTEN = [
    (["sdpa", "--scale", "3e-324"], "sdpa: --scale: must be 0 or a normal float32 (|scale| >= 2^-126 ≈ 1.1754944e-38 "
                                    "there) but got 3e-324 (reads as 5e-324), which rounds to 0"),
    (["sdpa", "--scale", "-1.0E39"], "sdpa: --scale: must be finite in float32 (|scale| <= 3.4028235e38) but got -1.0E39"),
    (["sdpa", "--softcap", "-5e-1"], "sdpa: --softcap: " + SOFTCAP_RANGE + "-5e-1"),
    # Just below float32's smallest normal: it was printed with six digits, as the bound itself.
    (["sdpa", "--softcap", "1.1754943e-38"], "sdpa: --softcap: " + SOFTCAP_RANGE + "1.1754943e-38"),
    (["sdpa", "--dropout", "0.99999999999999999", "--seed", "1"],
     "sdpa: --dropout: must be in [0, 1) but got 0.99999999999999999 (reads as 1)"),
    (["sdpa", "--dropout-p", "2.50", "--seed", "1"], "sdpa: --dropout: must be in [0, 1) but got 2.50"),
    (["sdpa", "--dropout", "3e-324"], "sdpa: --seed: --dropout = 3e-324 (reads as 5e-324) needs a seed (--seed N)" + WHY_A_SEED),
    (["ring", "--scale", "3e-324"], "ring_attention: --scale: must be 0 or a normal float32 (|scale| >= 2^-126 ≈ "
                                    "1.1754944e-38 there) but got 3e-324 (reads as 5e-324), which rounds to 0"),
    (["ring", "--softcap", "+1e39"], "ring_attention: --softcap: " + SOFTCAP_RANGE + "+1e39"),
    (["mha", "--softcap", "-0.50"], "MultiHeadAttention: --softcap: " + SOFTCAP_RANGE + "-0.50"),
    (["mha", "--num-heads", "-00"], "MultiHeadAttention: --num-heads: must be >= 1 but got -00"),
    (["mha", "--dropout-p", "1.0000000000000001", "--grad-out", "nope_do.npy", "--grads", "g.safetensors"],
     "MultiHeadAttention: --dropout-p: must be in [0, 1) but got 1.0000000000000001 (reads as 1)"),
    (["mha", "--dropout-p", "3e-324", "--grad-out", "nope_do.npy", "--grads", "g.safetensors"],
     "MultiHeadAttention: --dropout-seed: --dropout-p = 3e-324 (reads as 5e-324) needs a seed (--dropout-seed N)"
     + WHY_A_SEED),
    (["bench", "--max-seconds", "-3e-324"], "--max-seconds: expected a positive number of seconds but got -3e-324 "
                                           "(reads as -5e-324)"),
    (["bench", "--reference-max-gflop", "-1.0e-3"], "--reference-max-gflop: must be >= 0 (0: never) but got -1.0e-3"),
    # 0 with an exponent no long holds is 0 (the message's comparison of the texts said "stol").
    (["bench", "--max-seconds", "0e99999999999999999999"], "--max-seconds: expected a positive number of seconds "
                                                          "but got 0e99999999999999999999"),
    (["heatmap", "--vmax", "1e300"], "--vmax: expected a number > 0 and < 1e300 but got 1e300"),
    # Integers: the same rule, spelt as given ("+", leading zeros).
    (["bench", "--runs", "000"], "--runs: expected 1 to 2147483647 but got 000"),
    (["sdpa", "--threads", "+5000"], "--threads: expected a thread count from 1 to 4096 (0: the default) but got +5000"),
]


@pytest.mark.parametrize("extra,message", NUMBERS_AS_WRITTEN)
def test_numbers_are_quoted_as_written(work, extra, message):
    command, extra = extra[0], extra[1:]
    missing = work / "nope.npy"
    if command in ("sdpa", "ring"):
        args = [command, "--q", missing, "--k", missing, "--v", missing, "--out", work / "o.npy"]
    elif command == "mha":
        args = ["mha", "--params", work / "nope.safetensors", "--query", missing, "--out", work / "o.npy"]
        args += [] if "--num-heads" in extra else ["--num-heads", "2"]
    elif command == "heatmap":
        np.save(work / "w.npy", np.full((1, 2, 2), 0.5, np.float32))
        args = ["heatmap", work / "w.npy", "--out", work / "h.png"]
    else:
        args = ["bench", "--list"]
    args += [work / a if a.startswith("nope_") else a for a in extra]
    if command == "ring" and b"built without MPI" in run(args).stderr:
        pytest.skip("attn was built without MPI (no attn ring)")
    err = expect_error(work, args)
    assert err.rstrip("\n") == "attn: error: " + message, err


def numeric_options():
    """Every (command, option, type) the CLI's help lists as INT, UINT or FLOAT: a new option is
    covered without editing this file."""
    found = []
    for command in ("sdpa", "mha", "heatmap", "bench", "ring", "demo"):
        r = run([command, "--help"])
        for line in r.stdout.decode().splitlines():
            m = re.match(r"^\s+((?:-\S+,\s*)*--?[\w-]+)\s+(INT|UINT|FLOAT)\b", line)
            if m:
                # "--seed,--dropout-seed": errors name the first (the option's own) name
                found.append((command, m.group(1).split(",")[0].strip(), m.group(2)))
    return found


def test_every_numeric_option_is_strict(work):
    options = numeric_options()
    names = {o for _, o, _ in options}
    assert {"--window-left", "--seed", "--scale", "--num-heads", "--head", "--runs"} <= names, options
    for command, option, kind in options:
        if kind == "FLOAT":
            bad = ["", "1e999", "-1e999", "nan", "inf", "1,5", "x"]
        else:
            bad = ["", BIG, "-" + BIG, "1.5", "1,5", "nan", "0x10"] + (["-1"] if kind == "UINT" else [])
        for value in bad:
            args = command_args(work, command) if command in ("sdpa", "mha", "heatmap", "bench") else [command]
            args = args + [option, value]
            r = run(args)
            err = r.stderr.decode()
            assert r.returncode == 2 and err.startswith("attn: error: ") and len(err.splitlines()) == 1, (command, option, value, err)
            assert option in err, (command, option, value, err)


def test_valid_edge_numbers_are_accepted(work):
    """The largest seed, a '+' sign and a leading zero (decimal, not octal) are values."""
    for extra in (["--dropout", "0.25", "--seed", "18446744073709551615"],
                  ["--causal", "top-left", "--window-left", "+3"],
                  ["--scale", "+0.125"]):
        r = run(sdpa(work, *extra))
        assert r.returncode == 0, (extra, r.stderr)
    # "010" is ten (decimal), not eight (octal): a window of 10 keys differs from one of 8 on L = 20
    rng = np.random.default_rng(5)
    for n, dd in (("q", DK), ("k", DK), ("v", DV)):
        np.save(work / f"{n}20.npy", rng.standard_normal((1, 1, 20, dd)).astype(np.float32))
    outs = {}
    for v in ("010", "10", "8"):
        r = run(["sdpa", "--q", work / "q20.npy", "--k", work / "k20.npy", "--v", work / "v20.npy",
                 "--causal", "top-left", "--window-left", v, "--out", work / f"o{v}.npy"])
        assert r.returncode == 0, r.stderr
        outs[v] = np.load(work / f"o{v}.npy")
    assert not np.array_equal(outs["10"], outs["8"])  # the check below can fail
    assert np.array_equal(outs["010"], outs["10"])


# ---- found by a review of the CLI (2026-12-03) ----------------------------------------------------

def header_only_npy(path, shape):
    """A .npy of about 100 bytes that declares `shape` and holds no data (a zero dim)."""
    h = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }\n" % (shape,)
    path.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode())


def test_inputs_are_checked_before_outputs_sized_from_them_are_allocated(work):
    # K and V of batch 0 but length 10^15: O and the weights were allocated (142 PiB) before sdpa
    # said K's batch is 0.
    header_only_npy(work / "k0.npy", (0, 1, 10**15, DK))
    header_only_npy(work / "v0.npy", (0, 1, 10**15, DV))
    expect_error(work, ["sdpa", "--q", work / "q.npy", "--k", work / "k0.npy", "--v", work / "v0.npy",
                        "--out", work / "o.npy", "--weights", work / "w2.npy"], "sdpa: --k: batch must be >= 1 but got 0")
    header_only_npy(work / "q0.npy", (10**6, 10**6, 10**6, 0))
    expect_error(work, ["sdpa", "--q", work / "q0.npy", "--k", work / "k.npy", "--v", work / "v.npy", "--out", work / "o.npy"],
                 "sdpa: --q: head dim must be >= 1 but got 0")
    # The packed path: q (10^6, 10^6, 0) asked for an 18 TiB out.
    header_only_npy(work / "pq0.npy", (10**6, 10**6, 0))
    np.save(work / "pk.npy", np.ones((7, 2, DK), np.float32))
    np.save(work / "pv.npy", np.ones((7, 2, DV), np.float32))
    np.save(work / "cq.npy", np.array([0, 3], np.int64))
    np.save(work / "ck.npy", np.array([0, 7], np.int64))
    expect_error(work, ["sdpa", "--q", work / "pq0.npy", "--k", work / "pk.npy", "--v", work / "pv.npy",
                        "--cu-seqlens-q", work / "cq.npy", "--cu-seqlens-k", work / "ck.npy", "--out", work / "o.npy"],
                 "sdpa_varlen: --q: head dim must be >= 1 but got 0")


def test_an_output_naming_an_input_is_refused(work):
    q_before = (work / "q.npy").read_bytes()
    expect_error(work, sdpa(work, out=work / "q.npy"), "--out: path", "names the same file as the input --q",
                 "which it would replace")
    expect_error(work, sdpa(work, "--lse", work / "." / "k.npy"), "--lse:", "the input --k")
    os.link(work / "v.npy", work / "v_link.npy")  # another name of the same file
    expect_error(work, sdpa(work, "--weights", work / "v_link.npy"), "--weights:", "the input --v")
    assert (work / "q.npy").read_bytes() == q_before
    (work / "w_as.svg").write_bytes((work / "w.npy").read_bytes())  # a .npy under an image's name
    expect_error(work, ["heatmap", work / "w_as.svg", "--out", work / "w_as.svg"], "--out:", "the input weights")


def test_a_safetensors_tensor_name_may_hold_a_colon(work):
    data = np.arange(B * HQ * LQ * DK, dtype=np.float32).reshape(B, HQ, LQ, DK) / 100
    header = json.dumps({"dense/kernel:0": {"dtype": "F32", "shape": list(data.shape),
                                            "data_offsets": [0, data.nbytes]}}).encode()
    (work / "colon.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + data.tobytes())
    np.save(work / "q_same.npy", data)
    r = run(["sdpa", "--q", f"{work / 'colon.safetensors'}:dense/kernel:0", "--k", work / "k.npy", "--v",
             work / "v.npy", "--out", work / "o1.npy"])
    assert r.returncode == 0, r.stderr
    r = run(["sdpa", "--q", work / "q_same.npy", "--k", work / "k.npy", "--v", work / "v.npy", "--out", work / "o2.npy"])
    assert r.returncode == 0, r.stderr
    assert np.array_equal(np.load(work / "o1.npy"), np.load(work / "o2.npy"))


def test_a_tensor_argument_naming_an_existing_file_is_that_file_whatever_its_name(work):
    """One rule: an argument that names an existing file is that file; any other is split after
    its first '.safetensors:'. A .npy called 'run.safetensors:v2.npy' was read as the tensor
    'v2.npy' of a file 'run.safetensors', and refused as a file that does not exist."""
    weird = work / "run.safetensors:v2.npy"
    shutil.copy(work / "q.npy", weird)
    args = sdpa(work, out="o_weird.npy")
    args[args.index("--q") + 1] = weird
    r = run(args)
    assert r.returncode == 0, r.stderr
    assert run(sdpa(work, out="o_plain.npy")).returncode == 0
    assert np.array_equal(np.load(work / "o_weird.npy"), np.load(work / "o_plain.npy"))
    # The same rule tells which file an input is, so an output over it is refused.
    args[args.index("--out") + 1] = weird
    expect_error(work, args, f"--out: path '{weird}' names the same file as the input --q")
    # Neither reading finds a file: the error says both.
    args = sdpa(work)
    args[args.index("--q") + 1] = work / "gone.safetensors:q.npy"
    expect_error(work, args, f"--q: '{work}/gone.safetensors:q.npy': no file of that name, nor a file "
                             f"'{work}/gone.safetensors' to read the tensor 'q.npy' from (No such file or directory)")


def write_layer(d, e=8):
    """d/p.safetensors: an nn.MultiheadAttention(e, ...) state_dict of float32 tensors."""
    tensors = {"in_proj_weight": np.ones((3 * e, e), np.float32), "in_proj_bias": np.zeros(3 * e, np.float32),
               "out_proj.weight": np.eye(e, dtype=np.float32), "out_proj.bias": np.zeros(e, np.float32)}
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
        blobs.append(a.tobytes())
    h = json.dumps(header).encode()
    (d / "p.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    return d / "p.safetensors"


def test_mha_params_errors_name_the_option_and_a_bfloat16_npy_is_refused_first(work):
    np.save(work / "x.npy", np.ones((3, 2, 8), np.float32))
    expect_error(work, ["mha", "--params", work / "q.npy", "--num-heads", "2", "--query", work / "x.npy",
                        "--out", work / "mo.npy"], "--params: ", "is a .npy file, not a safetensors file")
    write_layer(work)
    # A query of the wrong width: the bfloat16-into-.npy error must come first (it came after the layer ran).
    np.save(work / "x7.npy", np.ones((3, 2, 7), np.float32))
    expect_error(work, ["mha", "--params", work / "p.safetensors", "--num-heads", "2", "--query", work / "x7.npy",
                        "--out", work / "mo.npy", "--out-dtype", "bfloat16"], "--out:", "bfloat16")


@pytest.mark.parametrize("command, outputs, suggested", [
    ("sdpa", ["--out", "o.npy"], "--out-dtype float16, float32 or float64"),
    ("sdpa", ["--out", "o.safetensors", "--grad-out", "q.npy", "--dq", "dq.npy", "--dk", "dk.safetensors",
              "--dv", "dv.safetensors"], "--out-dtype float16, float32 or float64"),
    ("mha", ["--out", "mo.npy"], "--out-dtype float16 or float32"),
])
def test_a_bfloat16_npy_output_is_told_what_a_npy_can_hold(work, command, outputs, suggested):
    """The hint lists the --out-dtype values a .npy output takes: float64 too where the command
    writes it (it said "float16 or float32" everywhere)."""
    if command == "sdpa":
        args = ["sdpa", "--q", work / "q.npy", "--k", work / "k.npy", "--v", work / "v.npy"]
    else:  # the layer and the query are read first (the default dtype is the query's)
        np.save(work / "x.npy", np.ones((3, 2, 8), np.float32))
        args = ["mha", "--params", write_layer(work), "--num-heads", "2", "--query", work / "x.npy"]
    flag, path = next((f, p) for f, p in zip(outputs[::2], outputs[1::2]) if p.endswith(".npy") and f != "--grad-out")
    outputs = [work / o if o.endswith((".npy", ".safetensors")) else o for o in outputs]
    err = expect_error(work, args + outputs + ["--out-dtype", "bfloat16"], f"{flag}: '{work / path}' would hold bfloat16")
    assert err.rstrip().endswith("which .npy cannot store: give a path ending in .safetensors, or " + suggested), err


def test_a_token_that_is_no_label_is_named_by_its_option_and_line(work):
    # The library names key_tokens[i]; the CLI user gave a file (or a list) and a line.
    (work / "tok.txt").write_bytes(b"a\nb\xff\xfe\nc\nd\n")  # w.npy is (3, 4): 4 key tokens
    expect_error(work, ["heatmap", work / "w.npy", "--out", work / "h.png", "--tokens-file", work / "tok.txt"],
                 "--tokens-file:", "line 2 is not valid UTF-8 text")
    (work / "tok0.txt").write_bytes(b"a\nb\nc\x00\nd\n")
    expect_error(work, ["heatmap", work / "w.npy", "--out", work / "h.png", "--tokens-file", work / "tok0.txt"],
                 "--tokens-file:", "line 3 is not valid UTF-8 text (or holds a NUL byte)")
