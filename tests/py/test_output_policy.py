"""One output policy for every writer (issue 11, items 1-5, 9, 10 and the ENOSPC part of 18).

Each test names the issue item it covers. Every refused command must leave every input
byte-identical, every device node, FIFO and symlink of the same kind, and no temporary
file (`.NAME.ckptool-*`) anywhere; each hostile case is bounded in time.

Device nodes are made with mknod inside the test's own directory (skipped when that is
not allowed); the machine's /dev is only read (/dev/null, and /dev/full as a full stdout).
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import resource
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from conftest import CKPTOOL, TIME_SCALE, run_ckptool, sha256

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

TEMP_RE = re.compile(r"^\..*\.ckptool-")
LIMIT = 10 * TIME_SCALE  # seconds for any single hostile case (most take milliseconds)


# --------------------------------------------------------------------------- helpers


def temps(root: Path) -> list[str]:
    return sorted(str(p) for p in root.rglob(".*") if TEMP_RE.match(p.name))


def ck(*args, rc: int = 0, cwd=None, env=None, timeout: float = LIMIT) -> tuple[str, str]:
    """Runs ckptool, asserts the exit code and (for failures) a one-line stderr."""
    t0 = time.perf_counter()
    got, so, se = run_ckptool(*args, cwd=cwd, env=env, timeout=timeout)
    took = time.perf_counter() - t0
    assert got == rc, f"ckptool {' '.join(map(str, args))}: exit {got}, expected {rc}\nstderr: {se}"
    if rc >= 2:
        assert se.count("\n") == 1 and se.startswith("ckptool: "), f"not one line: {se!r}"
    assert took < timeout
    return so, se


def popen(*args, **kw) -> subprocess.Popen:
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=0")
    return subprocess.Popen([str(CKPTOOL), *map(str, args)], env=env, **kw)


def kind(path) -> int:
    return stat.S_IFMT(os.lstat(path).st_mode)


def mknod_or_skip(path: Path, mode: int, major: int, minor: int) -> Path:
    try:
        os.mknod(path, mode | 0o600, os.makedev(major, minor))
    except (PermissionError, OSError) as e:
        pytest.skip(f"cannot make device nodes here ({e}); needs root with CAP_MKNOD")
    return path


class Lin(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x)


@pytest.fixture
def small(tmp_path) -> Path:
    p = tmp_path / "in.pt"
    torch.save({"_orig_mod.w": torch.arange(12.0).reshape(3, 4), "_orig_mod.b": torch.ones(3)}, p)
    return p


@pytest.fixture
def model_pair(tmp_path) -> tuple[Path, Path]:
    """(scripted model, matching checkpoint)."""
    torch.manual_seed(0)
    m = Lin()
    model, ckpt = tmp_path / "model.pt", tmp_path / "weights.pt"
    torch.jit.script(m).save(str(model))
    torch.save(m.state_dict(), ckpt)
    return model, ckpt


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    """~100 MB, so a signal lands while the output is being written."""
    d = tmp_path_factory.mktemp("big")
    g = torch.Generator().manual_seed(1)
    sd = {f"_orig_mod.l{i}.weight": torch.randint(0, 1 << 30, (1 << 20,), dtype=torch.int32, generator=g)
          for i in range(25)}
    p = d / "big.pt"
    torch.save(sd, p)
    return p


def unchanged(paths_and_hashes: dict):
    for p, h in paths_and_hashes.items():
        assert sha256(p) == h, f"{p} changed"


# --------------------------------------------------------------------------- 1. inputs are never outputs


def test_item1_materialize_output_is_input_refused(small, model_pair, tmp_path):
    before = sha256(small)
    ck("materialize", small, "-o", small, rc=2)
    assert sha256(small) == before
    model, weights = model_pair
    hashes = {model: sha256(model), weights: sha256(weights)}
    ck("materialize", weights, "--model", model, "-o", model, rc=2)
    ck("materialize", weights, "--model", model, "-o", weights, rc=2)
    unchanged(hashes)
    assert temps(tmp_path) == []


def test_item1_rekey_save_map_onto_input_or_output_refused(small, tmp_path):
    before = sha256(small)
    out = tmp_path / "out.pt"
    ck("rekey", small, "-o", out, "--strip-compiled", "--save-map", small, rc=2)
    assert sha256(small) == before and not out.exists()
    # --save-map onto -o, spelled another way.
    ck("rekey", small, "-o", out, "--strip-compiled", "--save-map", tmp_path / "." / "out.pt", rc=2)
    assert not out.exists()
    # --save-map onto a --map input, and -o onto a --match target.
    m = tmp_path / "m.json"
    ck("rekey", small, "-o", tmp_path / "a.pt", "--strip-compiled", "--save-map", m)
    mh = sha256(m)
    ck("rekey", small, "-o", tmp_path / "b.pt", "--map", m, "--save-map", m, rc=2)
    target = tmp_path / "target.pt"
    torch.save({"w": torch.zeros(3, 4), "b": torch.zeros(3)}, target)
    th = sha256(target)
    ck("rekey", small, "-o", target, "--match", target, rc=2)
    unchanged({small: before, m: mh, target: th})
    assert not (tmp_path / "b.pt").exists()
    assert temps(tmp_path) == []


def _spellings(rng: random.Random, tmp: Path, name: str) -> str:
    """A random way to name tmp/name: relative or absolute, ./, x/../, //, a symlinked
    directory, a symlink, a hard link."""
    choices = [
        lambda: name,
        lambda: str(tmp / name),
        lambda: "./" + name,
        lambda: "sub/../" + name,
        lambda: "sub//..//" + name,
        lambda: str(tmp) + "//" + name,
        lambda: "dirlink/" + name,
        lambda: "dirlink/./sub/../" + name,
        lambda: "symlink",
        lambda: "hardlink",
        lambda: "sub/up/" + name,
        lambda: "sub/symlink-up",
        lambda: str(tmp / "dirlink" / "sub" / ".." / name),
    ]
    s = rng.choice(choices)()
    if rng.random() < 0.3 and not s.startswith("/"):
        s = "./" + s
    return s


def test_item1_property_random_spellings_of_the_input(small, tmp_path):
    """Any spelling of IN as -o or --save-map is refused and never touches IN."""
    name = small.name
    (tmp_path / "sub").mkdir()
    os.symlink(tmp_path, tmp_path / "dirlink")
    os.symlink(name, tmp_path / "symlink")
    os.link(small, tmp_path / "hardlink")
    os.symlink("..", tmp_path / "sub" / "up")
    os.symlink("../" + name, tmp_path / "sub" / "symlink-up")
    before = sha256(small)
    seed = int(os.environ.get("CKPTOOL_TEST_SEED", time.time_ns() % 100000))
    rng = random.Random(seed)
    for i in range(40):
        spelled = _spellings(rng, tmp_path, name)
        verb = rng.choice(["rekey-o", "rekey-map", "materialize"])
        if verb == "rekey-o":
            args = ["rekey", name, "-o", spelled, "--strip-compiled"]
        elif verb == "rekey-map":
            args = ["rekey", name, "-o", "fresh.pt", "--strip-compiled", "--save-map", spelled]
        else:
            args = ["materialize", name, "-o", spelled]
        # The input itself spelled randomly too.
        args[1] = _spellings(rng, tmp_path, name)
        got, so, se = run_ckptool(*args, cwd=tmp_path, timeout=LIMIT)
        assert got == 2, f"seed {seed} run {i}: {args}: exit {got}: {se}"
        assert sha256(small) == before, f"seed {seed} run {i}: {args} changed the input"
        assert (tmp_path / "symlink").is_symlink() and (tmp_path / "sub" / "symlink-up").is_symlink()
        assert not (tmp_path / "fresh.pt").exists()
        assert temps(tmp_path) == [], f"seed {seed} run {i}: {args}: temporary file left"


def test_item1_two_outputs_are_one_file_refused(small, tmp_path):
    (tmp_path / "sub").mkdir()
    ck("rekey", small, "-o", tmp_path / "x.pt", "--strip-compiled", "--save-map", tmp_path / "sub" / ".." / "x.pt", rc=2)
    assert not (tmp_path / "x.pt").exists() and temps(tmp_path) == []


# --------------------------------------------------------------------------- 2. outputs committed together, last


def test_item2_save_map_failure_restores_out(small, tmp_path):
    """The second rename (--save-map) fails: OUT, already swapped in, is put back."""
    out, m = tmp_path / "out.pt", tmp_path / "map.json"
    out.write_bytes(b"previous OUT\n")
    before = sha256(small)
    so, se = ck("rekey", small, "-o", out, "--strip-compiled", "--save-map", m, rc=4,
                env={"CKPTOOL_FAULT_INJECT": "rename:2:EIO"})
    assert out.read_bytes() == b"previous OUT\n", "OUT was replaced though the command failed"
    assert not m.exists() and sha256(small) == before
    assert temps(tmp_path) == []


@pytest.mark.parametrize("preexisting", [False, True], ids=["new-out", "out-existed"])
def test_item2_without_rename_exchange(small, tmp_path, preexisting):
    """A file system without renameat2 flags (EINVAL): the old OUT is kept as a hard link
    until the rename succeeded, and nothing is left behind."""
    out = tmp_path / "out.pt"
    if preexisting:
        out.write_bytes(b"previous OUT\n")
    ck("rekey", small, "-o", out, "--strip-compiled", env={"CKPTOOL_FAULT_INJECT": "rename:1:EINVAL"})
    assert sorted(torch.load(out, weights_only=True)) == ["b", "w"]
    assert temps(tmp_path) == []


def test_item2_dry_run_writes_nothing(small, tmp_path):
    m = tmp_path / "map.json"
    ck("rekey", small, "--dry-run", "--strip-compiled", "--save-map", m, rc=2)
    assert not m.exists() and temps(tmp_path) == []


def test_item2_check_finite_failure_writes_no_output(tmp_path):
    p = tmp_path / "nan.pt"
    torch.save({"w": torch.tensor([1.0, float("nan")])}, p)
    out = tmp_path / "out.pt"
    so, se = ck("materialize", p, "--check-finite", "-o", out, rc=1)
    assert not out.exists() and temps(tmp_path) == []
    assert "w" in so


def test_item2_signal_after_commit_is_not_a_failure(small, tmp_path):
    """SIGINT once OUT is in place (the process blocked writing its report into a full
    pipe): the command completed, so it exits 0 with OUT complete."""
    import fcntl

    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETFL, fcntl.fcntl(w, fcntl.F_GETFL) | os.O_NONBLOCK)
    try:
        while True:
            os.write(w, b"x" * 4096)
    except BlockingIOError:
        pass
    fcntl.fcntl(w, fcntl.F_SETFL, fcntl.fcntl(w, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    out = tmp_path / "out.pt"
    p = popen("rekey", small, "-o", out, "--strip-compiled", stdout=w, stderr=subprocess.PIPE)
    os.close(w)
    deadline = time.perf_counter() + LIMIT
    while not out.exists() and p.poll() is None and time.perf_counter() < deadline:
        time.sleep(0.001)
    time.sleep(0.05)  # now blocked in the report's write
    p.send_signal(signal.SIGINT)
    time.sleep(0.05)
    with os.fdopen(r, "rb") as f:
        f.read()
    _, err = p.communicate(timeout=LIMIT)
    assert p.returncode == 0, f"exit {p.returncode}: {err}"
    assert sorted(torch.load(out, weights_only=True)) == ["b", "w"]
    assert temps(tmp_path) == []


# --------------------------------------------------------------------------- 3. kinds of OUT


def test_item3_stdout_dash_streams_and_reports_on_stderr(small, model_pair, tmp_path):
    p = subprocess.run([str(CKPTOOL), "rekey", str(small), "-o", "-", "--strip-compiled"],
                       capture_output=True, cwd=tmp_path, timeout=LIMIT)
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "-").exists(), "wrote a file named '-'"
    sd = torch.load(io.BytesIO(p.stdout), weights_only=True)
    assert sorted(sd) == ["b", "w"]
    assert b"keys renamed" in p.stderr
    # materialize: a torch.save archive, and a TorchScript module saved to a stream.
    p = subprocess.run([str(CKPTOOL), "materialize", str(small), "-o", "-"], capture_output=True, cwd=tmp_path,
                       timeout=LIMIT * 3)
    assert p.returncode == 0, p.stderr
    assert sorted(torch.load(io.BytesIO(p.stdout), weights_only=True)) == ["_orig_mod.b", "_orig_mod.w"]
    assert b"materialized" in p.stderr
    model, weights = model_pair
    p = subprocess.run([str(CKPTOOL), "materialize", str(weights), "--model", str(model), "-o", "-"],
                       capture_output=True, cwd=tmp_path, timeout=LIMIT * 3)
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "-").exists(), "wrote a file named '-'"
    m = torch.jit.load(io.BytesIO(p.stdout))
    assert torch.equal(m.lin.weight, torch.load(weights, weights_only=True)["lin.weight"])
    assert temps(tmp_path) == []


def test_item3_stdout_terminal_refused(small, tmp_path):
    import pty

    master, slave = pty.openpty()
    try:
        p = subprocess.run([str(CKPTOOL), "rekey", str(small), "-o", "-", "--strip-compiled"],
                           stdout=slave, stderr=subprocess.PIPE, cwd=tmp_path, timeout=LIMIT)
    finally:
        os.close(slave)
        os.close(master)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count(b"\n") == 1 and b"terminal" in p.stderr


@pytest.mark.parametrize("out", [".", "..", "", "sub/", "sub"])
def test_item3_directory_or_empty_output_refused(small, tmp_path, out):
    (tmp_path / "sub").mkdir()
    before = sha256(small)
    for args in (["rekey", small, "-o", out, "--strip-compiled"], ["materialize", small, "-o", out]):
        ck(*args, rc=2, cwd=tmp_path)
    assert sha256(small) == before and temps(tmp_path) == []
    assert sorted(os.listdir(tmp_path)) == ["in.pt", "sub"]


def test_item3_symlink_output_keeps_the_link(small, tmp_path):
    target = tmp_path / "real.pt"
    target.write_bytes(b"old")
    link = tmp_path / "link.pt"
    os.symlink("real.pt", link)
    dangling = tmp_path / "dangling.pt"
    os.symlink("created.pt", dangling)
    ck("rekey", small, "-o", link, "--strip-compiled", rc=0)
    ck("rekey", small, "-o", dangling, "--strip-compiled", rc=0)
    assert link.is_symlink() and os.readlink(link) == "real.pt"
    assert dangling.is_symlink() and (tmp_path / "created.pt").is_file()
    for p in (target, tmp_path / "created.pt"):
        assert sorted(torch.load(p, weights_only=True)) == ["b", "w"]
    assert temps(tmp_path) == []


def _reader(path: Path, sink: list):
    with open(path, "rb") as f:
        sink.append(f.read())


def test_item3_fifo_output_streamed(small, tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got: list = []
    t = threading.Thread(target=_reader, args=(fifo, got), daemon=True)
    t.start()
    try:
        ck("rekey", small, "-o", fifo, "--strip-compiled", rc=0)
    finally:
        if t.is_alive():  # unblock the reader if ckptool never opened the FIFO
            with open(fifo, "wb"):
                pass
    t.join(LIMIT)
    assert kind(fifo) == stat.S_IFIFO, "the FIFO was replaced"
    assert sorted(torch.load(io.BytesIO(got[0]), weights_only=True)) == ["b", "w"]
    assert temps(tmp_path) == []


def test_item3_socket_output_streamed(small, tmp_path):
    path = tmp_path / "out.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)
    got: list = []

    def serve():
        c, _ = srv.accept()
        data = b""
        while chunk := c.recv(1 << 16):
            data += chunk
        got.append(data)
        c.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    ck("rekey", small, "-o", path, "--strip-compiled", rc=0)
    t.join(LIMIT)
    srv.close()
    assert kind(path) == stat.S_IFSOCK
    assert sorted(torch.load(io.BytesIO(got[0]), weights_only=True)) == ["b", "w"]


def test_item3_full_device_output(small, tmp_path):
    """A character device that is full (a /dev/full made here): streamed into, ENOSPC
    reported naming OUT, exit 4, the node still a character device."""
    full = mknod_or_skip(tmp_path / "full", stat.S_IFCHR, 1, 7)
    before = sha256(small)
    so, se = ck("rekey", small, "-o", full, "--strip-compiled", rc=4)
    assert "No space left on device" in se and str(full) in se, se
    assert kind(full) == stat.S_IFCHR and sha256(small) == before
    so, se = ck("materialize", small, "-o", full, rc=4, timeout=LIMIT * 3)
    assert "No space left on device" in se and str(full) in se, se
    assert kind(full) == stat.S_IFCHR and temps(tmp_path) == []


def test_item3_block_device_refused(small, tmp_path):
    blk = mknod_or_skip(tmp_path / "blk", stat.S_IFBLK, 7, 250)  # a loop device number, never opened
    ck("rekey", small, "-o", blk, "--strip-compiled", rc=2)
    ck("materialize", small, "-o", blk, rc=2)
    assert kind(blk) == stat.S_IFBLK and temps(tmp_path) == []


def test_item3_closed_pipe_is_exit_4_not_a_signal(big, tmp_path):
    p = popen("rekey", big, "-o", "-", "--strip-compiled", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
              cwd=tmp_path)
    p.stdout.read(10)
    p.stdout.close()
    _, err = p.communicate(timeout=LIMIT * 3)
    assert p.returncode == 4, f"exit {p.returncode}: {err}"
    assert b"Broken pipe" in err and err.count(b"\n") == 1, err


# --------------------------------------------------------------------------- 4. permissions, signals


def test_item4_outputs_keep_the_input_mode(small, tmp_path):
    os.chmod(small, 0o600)
    ck("materialize", small, "-o", tmp_path / "m.pt", rc=0, timeout=LIMIT * 3)
    ck("rekey", small, "-o", tmp_path / "r.pt", "--strip-compiled", "--save-map", tmp_path / "map.json", rc=0)
    for n in ("m.pt", "r.pt", "map.json"):
        assert stat.S_IMODE(os.stat(tmp_path / n).st_mode) == 0o600, n


SIGNALS = ["SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGVTALRM",
           "SIGPROF", "SIGXCPU"]


def _no_core():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


@pytest.mark.parametrize("name", SIGNALS)
def test_item4_signal_mid_write_removes_the_temporary(big, tmp_path, name):
    sig = getattr(signal, name)
    out = tmp_path / "out.pt"
    p = popen("rekey", big, "-o", out, "--strip-compiled", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
              preexec_fn=_no_core)
    deadline = time.perf_counter() + LIMIT
    while not temps(tmp_path) and p.poll() is None and time.perf_counter() < deadline:
        time.sleep(0.0002)
    # Stopped while the temporary file exists, so the signal surely arrives mid-write.
    p.send_signal(signal.SIGSTOP)
    assert temps(tmp_path), "no temporary file seen"
    p.send_signal(sig)
    p.send_signal(signal.SIGCONT)
    _, err = p.communicate(timeout=LIMIT)
    assert p.returncode == -sig, f"exit {p.returncode}: {err}"
    assert temps(tmp_path) == [], f"{name}: temporary file left"
    assert not out.exists()


def test_item4_file_size_limit_removes_the_temporary(big, tmp_path):
    def limit():
        _no_core()
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 << 20, 8 << 20))

    out = tmp_path / "out.pt"
    p = popen("rekey", big, "-o", out, "--strip-compiled", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
              preexec_fn=limit)
    _, err = p.communicate(timeout=LIMIT)
    assert p.returncode == -signal.SIGXFSZ, f"exit {p.returncode}: {err}"
    assert temps(tmp_path) == [] and not out.exists()


def test_item4_nohup_keeps_sighup_ignored(small, tmp_path):
    """A signal the caller ignores stays ignored (nohup): the run completes."""
    p = popen("rekey", small, "-o", tmp_path / "o.pt", "--strip-compiled", stdout=subprocess.DEVNULL,
              stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    p.send_signal(signal.SIGHUP)
    p.communicate(timeout=LIMIT)
    assert p.returncode == 0


# --------------------------------------------------------------------------- 5. reports reach their reader


def _full_stdout(*args) -> subprocess.CompletedProcess:
    with open("/dev/full", "wb") as full:
        return subprocess.run([str(CKPTOOL), *map(str, args)], stdout=full, stderr=subprocess.PIPE,
                              timeout=LIMIT * 3)


def test_item5_full_stdout_fails(small, tmp_path):
    for args in (["verify", small], ["verify", "--json", small],
                 ["rekey", small, "--dry-run", "--strip-compiled"],
                 ["rekey", small, "--dry-run", "--json", "--strip-compiled"],
                 ["rekey", small, "-o", tmp_path / "o.pt", "--strip-compiled"],
                 ["materialize", small, "--json"], ["inspect", small]):
        p = _full_stdout(*args)
        assert p.returncode == 4, f"{args}: exit {p.returncode}: {p.stderr}"
        assert b"cannot write to standard output" in p.stderr and p.stderr.count(b"\n") == 1, p.stderr


def test_item5_closed_stdout_pipe_fails(small):
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([str(CKPTOOL), "verify", str(small)], stdout=w, stderr=subprocess.PIPE, timeout=LIMIT)
    finally:
        os.close(w)
    assert p.returncode == 4, f"exit {p.returncode}: {p.stderr}"


# --------------------------------------------------------------------------- 9. inputs that change while read


def _stop_when_temp(p: subprocess.Popen, d: Path):
    deadline = time.perf_counter() + LIMIT * 3
    while not temps(d) and p.poll() is None and time.perf_counter() < deadline:
        time.sleep(0.0002)
    p.send_signal(signal.SIGSTOP)
    assert temps(d), "no temporary file seen"


def _modify_in_place(p: Path):
    """Same size, other bytes, in the last tensor record's data."""
    with open(p, "r+b") as f:
        f.seek(-4096, os.SEEK_END)
        b = f.read(16)
        f.seek(-4096, os.SEEK_END)
        f.write(bytes(x ^ 0xFF for x in b))


@pytest.mark.parametrize("verb", ["rekey", "materialize"])
def test_item9_input_changed_while_read(big, tmp_path, verb):
    src = tmp_path / "in.pt"
    shutil.copyfile(big, src)
    out = tmp_path / "out.pt"
    args = (["rekey", src, "-o", out, "--strip-compiled"] if verb == "rekey"
            else ["materialize", src, "--verify-crc", "-o", out])
    p = popen(*args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _stop_when_temp(p, tmp_path)
    _modify_in_place(src)
    p.send_signal(signal.SIGCONT)
    _, err = p.communicate(timeout=LIMIT * 3)
    assert p.returncode == 4, f"exit {p.returncode}: {err}"
    assert b"changed while being read" in err and str(src).encode() in err, err
    assert not out.exists() and temps(tmp_path) == []


def _rchar(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def test_item9_verify_sees_the_file_change(big, tmp_path):
    """verify stopped after reading half the file; bytes it already checked are changed:
    an OK now would be about a file that no longer exists."""
    src = tmp_path / "in.pt"
    shutil.copyfile(big, src)
    p = popen("verify", src, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.perf_counter() + LIMIT
    while p.poll() is None and _rchar(p.pid) < (50 << 20) and time.perf_counter() < deadline:
        time.sleep(0.0002)
    p.send_signal(signal.SIGSTOP)
    if p.poll() is not None:
        pytest.skip("verify finished before it could be stopped")
    with open(src, "r+b") as f:  # inside the first tensor record, checked already
        f.seek(1 << 20)
        f.write(b"\xff" * 16)
    p.send_signal(signal.SIGCONT)
    out, err = p.communicate(timeout=LIMIT)
    assert p.returncode == 4, f"exit {p.returncode}: {out} {err}"
    assert b"changed while being read" in err


# --------------------------------------------------------------------------- 10. non-regular inputs


def test_item10_fifo_inputs_refused_at_once(small, model_pair, tmp_path):
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    model, weights = model_pair
    m = tmp_path / "m.json"
    ck("rekey", small, "-o", tmp_path / "a.pt", "--strip-compiled", "--save-map", m)
    cases = [["inspect", fifo], ["verify", fifo], ["rekey", fifo, "-o", tmp_path / "o.pt", "--strip-compiled"],
             ["materialize", fifo], ["materialize", weights, "--model", fifo],
             ["rekey", small, "-o", tmp_path / "o.pt", "--match", fifo],
             ["rekey", small, "-o", tmp_path / "o.pt", "--map", fifo]]
    for args in cases:
        so, se = ck(*args, rc=2, timeout=5 * TIME_SCALE)
        assert "FIFO" in se, se
    assert kind(fifo) == stat.S_IFIFO and not (tmp_path / "o.pt").exists() and temps(tmp_path) == []


def test_item10_device_map_refused(small, tmp_path):
    zero = mknod_or_skip(tmp_path / "zero", stat.S_IFCHR, 1, 5)
    ck("rekey", small, "-o", tmp_path / "o.pt", "--map", zero, rc=2, timeout=5 * TIME_SCALE)
    assert not (tmp_path / "o.pt").exists()


def test_item10_map_size_limit(small, tmp_path):
    m = tmp_path / "huge.json"
    doc = json.dumps({"ckptool_key_map": 1, "mapping": {"_orig_mod.w": "w", "_orig_mod.b": "b"}})
    with open(m, "w") as f:
        f.write(doc[:-1] + " " * (65 << 20) + "}")
    so, se = ck("rekey", small, "-o", tmp_path / "o.pt", "--map", m, rc=3)
    assert "limit" in se and str(m) in se, se
    assert not (tmp_path / "o.pt").exists()


# --------------------------------------------------------------------------- 18. a full disk names OUT


def test_item18_enospc_names_the_output(small, tmp_path):
    out = tmp_path / "out.pt"
    so, se = ck("materialize", small, "-o", out, rc=4, timeout=LIMIT * 3,
                env={"CKPTOOL_FAULT_INJECT": "write:1:ENOSPC"})
    assert "No space left on device" in se and str(out) in se and str(small) not in se, se
    assert not out.exists() and temps(tmp_path) == []
