"""ckptool benchmark driver (issue 6). Run it through bench/run.sh.

Order: fixtures (real PyTorch, bench/gen_fixtures.py) -> S0 calibration -> S1..S5. Every
sample is a fresh process (ckptool, a Python peer from bench/peer.py, or cp), repeated and
interleaved between tools (A B C A B C ...). For every sample the parent records:

  wall       fork to exit, measured here (time.perf_counter around spawn and waitid)
  CPU        user + system from wait4's rusage
  peaks      RssAnon / RssFile / VmHWM sampled from /proc/PID/status every 1 ms for the
             first 50 ms, then every 4 ms; ru_maxrss from wait4
  I/O        /proc/PID/io (rchar, read_bytes, wchar, write_bytes) read from the zombie,
             after waitid(WNOWAIT) and before the reap, so nothing the process did is missed
  residency  the fixture's resident share (mincore through ctypes) before and after

Cache: warm = the fixture read once and checked 100% resident before each sample; cold =
posix_fadvise(DONTNEED) on the fixture before each sample, checked (mincore) to be under 1%
resident; the check's figure is in the raw data and a failed check is reported.

The time compared ("t") is the work itself without each tool's fixed startup:
  Python peers   their own timed region (after `import torch` and, on CUDA, after the
                 context exists; see bench/peer.py);
  ckptool materialize
                 process wall minus the median wall of the same command on a one-tensor
                 checkpoint (LibTorch loading, CUDA context), measured in S0 in the same run;
  other ckptool verbs, cp
                 process wall, startup included (a few ms).
The process wall of every tool is reported next to it.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

HERE = Path(__file__).resolve().parent
PAGE = os.sysconf("SC_PAGE_SIZE")
NPROC = os.cpu_count() or 1
MiB = 1 << 20
GiB = 1 << 30


def log(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------- page cache helpers

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_libc.memcpy.restype = ctypes.c_void_p
_libc.memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
_libc.memset.restype = ctypes.c_void_p
_libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def files_of(path) -> list:
    """A fixture's files: itself, or a sharded checkpoint directory's regular files."""
    if os.path.isdir(path):
        return sorted(os.path.join(path, n) for n in os.listdir(path) if os.path.isfile(os.path.join(path, n)))
    return [path]


def resident_fraction(path) -> float:
    """Share of the fixture's pages in the page cache, over all its files."""
    files = files_of(path)
    if len(files) == 1 and files[0] == path:
        return _resident_fraction(path)
    sizes = [os.path.getsize(f) for f in files]
    total = sum(sizes)
    return sum(_resident_fraction(f) * n for f, n in zip(files, sizes)) / total if total else 1.0


def _resident_fraction(path) -> float:
    """Share of the file's pages in the page cache (mincore on a PROT_READ mapping, which
    faults nothing in)."""
    size = os.path.getsize(path)
    if size == 0:
        return 1.0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if addr in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), "mmap")
        try:
            pages = (size + PAGE - 1) // PAGE
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
            data = bytes(vec)
            return (pages - data.count(0)) / pages
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def drop_cache(path) -> None:
    for f in files_of(path):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_file(path, threads: int = 1, chunk: int = 16 * MiB) -> tuple[int, float]:
    """Read the whole file with pread into a reused buffer per thread; (bytes, seconds)."""
    size = os.path.getsize(path)
    nchunks = (size + chunk - 1) // chunk
    fd = os.open(path, os.O_RDONLY)
    errors = []

    def work(t):
        buf = bytearray(chunk)
        mv = memoryview(buf)
        try:
            for i in range(t, nchunks, threads):
                off = i * chunk
                n = min(chunk, size - off)
                got = os.preadv(fd, [mv[:n]], off)
                if got != n:
                    raise OSError(f"short read at {off}")
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    try:
        t0 = time.perf_counter()
        if threads == 1:
            work(0)
        else:
            ths = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
            for th in ths:
                th.start()
            for th in ths:
                th.join()
        dt = time.perf_counter() - t0
    finally:
        os.close(fd)
    if errors:
        raise errors[0]
    return size, dt


def make_warm(path, tries: int = 3) -> float:
    r = resident_fraction(path)
    for _ in range(tries):
        if r >= 0.999:
            break
        for f in files_of(path):
            read_file(f)
        r = resident_fraction(path)
    return r


def settle_cache(path) -> None:
    """Drops the fixture's pages (written back first) and reads them in once, sequentially.

    A file's cached pages keep the shape of how they came there: pages left by its writer
    (small folios, for a writer of small chunks) take longer to map than pages read in by
    readahead (large folios). Two fixtures compared in one block, each as its writer left
    it, differed by 13% in the same load (S11's .pt2 against its .pt); settled, by none."""
    for f in files_of(path):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        read_file(f)


def make_cold(path, tries: int = 3) -> float:
    r = 1.0
    for _ in range(tries):
        drop_cache(path)
        r = resident_fraction(path)
        if r <= 0.01:
            break
        os.sync()
    return r


# ---------------------------------------------------------------- one sample

def _read_kv(path: str) -> dict:
    out = {}
    try:
        with open(path) as f:
            for line in f:
                k, _, v = line.partition(":")
                out[k.strip()] = v.strip()
    except (OSError, ValueError):
        pass
    return out


def _kb(s: Optional[str]) -> int:
    if not s:
        return 0
    return int(s.split()[0]) * 1024


@dataclass
class Sample:
    rc: int
    wall: float
    cpu: float
    maxrss: int
    majflt: int
    peak_anon: int
    peak_file: int
    peak_hwm: int
    io: dict
    stdout: str
    stderr: str
    res_before: Optional[float] = None
    res_after: Optional[float] = None
    parsed: dict = field(default_factory=dict)
    t: Optional[float] = None
    extra: dict = field(default_factory=dict)


def run_sample(argv: list, env: Optional[dict] = None, timeout: float = 900) -> Sample:
    fout = tempfile.TemporaryFile()
    ferr = tempfile.TemporaryFile()
    peaks = {"anon": 0, "file": 0, "hwm": 0}
    last_io: dict = {}
    stop = threading.Event()
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=fout, stderr=ferr, env=env, stdin=subprocess.DEVNULL)
    pid = p.pid

    def sampler():
        start = time.perf_counter()
        while not stop.is_set():
            st = _read_kv(f"/proc/{pid}/status")
            if st.get("RssAnon"):
                peaks["anon"] = max(peaks["anon"], _kb(st.get("RssAnon")))
                peaks["file"] = max(peaks["file"], _kb(st.get("RssFile")))
                peaks["hwm"] = max(peaks["hwm"], _kb(st.get("VmHWM")))
            io = _read_kv(f"/proc/{pid}/io")
            if io:
                last_io.update(io)
            stop.wait(0.001 if time.perf_counter() - start < 0.05 else 0.004)

    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    deadline_timer = threading.Timer(timeout, lambda: p.kill())
    deadline_timer.start()
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        wall = time.perf_counter() - t0
        stop.set()
        io = _read_kv(f"/proc/{pid}/io") or last_io  # the zombie still has its counters
        _, status, ru = os.wait4(pid, 0)
    finally:
        deadline_timer.cancel()
        stop.set()
    th.join()
    p.returncode = os.waitstatus_to_exitcode(status)
    fout.seek(0)
    ferr.seek(0)
    return Sample(rc=p.returncode, wall=wall, cpu=ru.ru_utime + ru.ru_stime, maxrss=ru.ru_maxrss * 1024,
                  majflt=ru.ru_majflt, peak_anon=peaks["anon"], peak_file=peaks["file"], peak_hwm=peaks["hwm"],
                  io={k: int(v) for k, v in io.items() if v.isdigit()},
                  stdout=fout.read().decode("utf-8", "replace"), stderr=ferr.read().decode("utf-8", "replace"))


def slim(doc: dict) -> dict:
    """The scalar fields of a tool's JSON report (and ckptool's io counters); the per-tensor
    lists are dropped."""
    out = {k: v for k, v in doc.items() if isinstance(v, (int, float, str, bool)) or v is None}
    if isinstance(doc.get("io"), dict):
        out["io"] = doc["io"]
    return out


def last_json(text: str) -> dict:
    text = text.strip()
    if not text:
        return {}
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return {}


# ---------------------------------------------------------------- tools and cases

@dataclass
class Tool:
    label: str
    kind: str  # "ck" (ckptool), "py" (peer.py), "cmd" (plain command)
    argv: Callable[[dict, "Ctx"], list]
    startup: Optional[str] = None  # ckptool: key of the startup baseline subtracted from wall
    writes: bool = False  # produces ctx.out_path() output that is removed after the sample
    note: str = ""
    loads: bool = True  # moves the tensor bytes (GB/s and % of ceiling apply)
    out_ext: str = ""  # writes: the output's suffix when it is not the fixture's format
    # ckptool: t is its own clock, open + load (JSON open_seconds + seconds), not wall minus
    # startup: for work far below the spread of the startup (a zero-copy load).
    own_clock: bool = False


@dataclass
class Case:
    scen: str
    fixture: str  # manifest key
    cache: str  # warm / cold
    tool: Tool
    role: str = "peer"  # "ck" (the ckptool row that peers compare with), "peer", "info"
    group: str = ""  # rows compared with each other
    samples: list = field(default_factory=list)


class Ctx:
    def __init__(self, args, manifest, scratch: Path):
        self.args = args
        self.manifest = manifest
        self.scratch = scratch
        self.ckptool = args.ckptool
        self.python = args.python
        self.startup: dict = {}  # key -> median wall
        self.startup_spread: dict = {}  # key -> max - min of the startup walls
        self.blocks: list = []  # per run_cases block: what other processes took meanwhile
        self.calib: dict = {}
        self.env = dict(os.environ)
        self.env.setdefault("OMP_NUM_THREADS", str(NPROC))

    def out_path(self, fx: dict, tool: Optional[Tool] = None) -> str:
        return str(self.scratch / ("out." + (tool.out_ext if tool and tool.out_ext else fx["format"])))


def ck(*a) -> Callable:
    return lambda fx, ctx: [ctx.ckptool, *[x if x != "{f}" else fx["path"] for x in a]]


def py(op: str, *a, out_ext: str = "", shards: bool = False) -> Callable:
    """A peer.py sample; out_ext: it writes ctx.out_path with that suffix; shards: it writes a
    shard set split at shard_bytes."""
    def build(fx, ctx):
        argv = [ctx.python, str(HERE / "peer.py"), op, fx["path"]]
        if op.startswith("rekey") or op == "dcp_to_torch_save_load":
            argv.append(ctx.out_path(fx))
        if out_ext:
            argv.append(str(ctx.scratch / ("out." + out_ext)))
        return argv + list(a) + (["--max-shard-size", str(shard_bytes(fx))] if shards else [])
    return build


def shard_bytes(fx: dict) -> int:
    """S7's --max-shard-size: a quarter of the payload (hf_big's split), so that `hf` outputs
    are real sets of several shards with an index."""
    return max(1, fx["payload"] // 4)


def ck_convert(to: str, out_ext: str) -> Callable:
    def build(fx, ctx):
        argv = [ctx.ckptool, "convert", fx["path"], "-o", str(ctx.scratch / ("out." + out_ext)), "--to", to]
        return argv + (["--max-shard-size", str(shard_bytes(fx))] if to == "hf" else [])
    return build


def free_port() -> int:
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ck_convert_ranks(n: int) -> Callable:
    """S10: ck_convert("hf") as n ranks of one parallel command (docs/distributed.md), rank 0
    hosting the rendezvous store on a free port of 127.0.0.1; fails if any rank fails."""
    def build(fx, ctx):
        script = ('p=$1 n=$2; shift 2; pids=(); for ((i = 0; i < n; i++)); do '
                  'RANK=$i WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$p "$@" & pids+=($!); done; '
                  'rc=0; for q in "${pids[@]}"; do wait "$q" || rc=$?; done; exit $rc')
        return ["bash", "-c", script, "bash", str(free_port()), str(n)] + ck_convert("hf", "hf")(fx, ctx)
    return build


def twin(fx: dict) -> str:
    """The .safetensors file of a .pt fixture's state dict (gen_fixtures.py writes both)."""
    return str(Path(fx["path"]).with_suffix(".safetensors"))


def warm_twin(fx: dict) -> list:
    """Warms the twin before a two-file sample (run_cases warms the fixture itself)."""
    make_warm(twin(fx))
    return []


T = {
    # Exit 1 is a result, not a failure: the twin lacks the .pt's tied lm_head.weight.
    "ck_diff": Tool("ckptool diff FILE TWIN.safetensors", "cmd",
                    lambda fx, ctx: warm_twin(fx) + ["sh", "-c", '"$0" diff --json "$1" "$2" > /dev/null; [ $? -le 1 ]',
                                                     str(ctx.ckptool), fx["path"], twin(fx)],
                    loads=False, note="reads both files; its peer is cat of both (the page-cache read rate)"),
    "cat_both": Tool("cat FILE TWIN.safetensors > /dev/null", "cmd",
                     lambda fx, ctx: warm_twin(fx) + ["sh", "-c", 'cat "$1" "$2" > /dev/null', "sh", fx["path"],
                                                     twin(fx)], loads=False),
    "ck_mat_cpu": Tool("ckptool materialize --device cpu", "ck", ck("materialize", "--json", "--device", "cpu", "{f}"),
                       startup="materialize_cpu"),
    "ck_mat_mmap": Tool("ckptool materialize --mmap", "ck", ck("materialize", "--json", "--mmap", "{f}"),
                        startup="materialize_cpu", own_clock=True,
                        note="zero-copy: every page mapped before it returns; t = its own clock, open + load"),
    "ck_mat_cuda": Tool("ckptool materialize --device cuda", "ck", ck("materialize", "--json", "--device", "cuda", "{f}"),
                        startup="materialize_cuda"),
    # S9 (issue 17): rank 1 of 4 under the Llama column/row-parallel preset (docs/formats.md §16).
    "ck_mat_slice": Tool("ckptool materialize --plan llama-tp --rank 1 --world 4", "ck",
                         ck("materialize", "--json", "--device", "cpu", "--plan", "llama-tp", "--rank", "1", "--world",
                            "4", "{f}"), startup="materialize_cpu", loads=False,
                         note="reads only rank 1's slices; its peer is the whole load"),
    "ck_inspect": Tool("ckptool inspect --json", "ck", ck("inspect", "--json", "{f}"), loads=False),
    "ck_rekey": Tool("ckptool rekey --strip-compiled", "ck",
                     lambda fx, ctx: [ctx.ckptool, "rekey", "--json", "--strip-compiled", fx["path"], "-o", ctx.out_path(fx)],
                     writes=True, loads=False),
    "cp": Tool("cp", "cmd", lambda fx, ctx: ["cp", fx["path"], ctx.out_path(fx)], writes=True, loads=False),
    "cp_sync": Tool("cp + sync FILE (fsync)", "cmd",
                    lambda fx, ctx: ["sh", "-c", 'cp "$1" "$2" && sync "$2"', "sh", fx["path"], ctx.out_path(fx)],
                    writes=True, note="ckptool fsyncs its output; cp does not", loads=False),
    "torch_load": Tool("torch.load(weights_only=True)", "py", py("torch_load")),
    "torch_load_mmap": Tool("torch.load(mmap=True) + touch", "py", py("torch_load_mmap", "--read-all")),
    "jit_load": Tool("torch.jit.load", "py", py("jit_load")),
    "st_load_file": Tool("safetensors load_file + touch", "py", py("st_load_file", "--read-all")),
    "torch_load_cuda": Tool("torch.load(map_location=cuda)", "py", py("torch_load", "--device", "cuda")),
    "torch_load_mmap_to_cuda": Tool("torch.load(mmap=True) + .to(cuda)", "py", py("torch_load_mmap", "--device", "cuda")),
    "torch_load_mmap_cuda": Tool("torch.load(mmap=True, map_location=cuda)", "py",
                                 py("torch_load_mmap_cuda", "--device", "cuda")),
    "meta_assign_cuda": Tool("meta model + load_state_dict(assign) (cuda)", "py",
                             py("meta_model_assign", "--device", "cuda")),
    "jit_load_cuda": Tool("torch.jit.load(map_location=cuda)", "py", py("jit_load", "--device", "cuda")),
    "st_load_file_cuda": Tool("safetensors load_file(device=cuda)", "py", py("st_load_file", "--device", "cuda")),
    "st_safe_open_cuda": Tool("safetensors safe_open(cuda) get_tensor loop", "py",
                              py("st_safe_open_loop", "--device", "cuda")),
    "list_mmap": Tool("torch.load(mmap=True) keys/shapes/dtypes", "py", py("list_mmap"), loads=False),
    "list_meta": Tool('torch.load(map_location="meta")', "py", py("list_meta"), loads=False),
    "list_jit": Tool("torch.jit.load + state_dict shapes", "py", py("list_jit"), loads=False),
    "list_safe_open": Tool("safetensors safe_open header", "py", py("list_safe_open"), loads=False),
    "list_raw_header": Tool("raw 8-byte + JSON header parse (Python)", "py", py("list_raw_header"), loads=False),
    "rekey_torch": Tool("torch.load -> rename -> torch.save", "py", py("rekey_torch"), writes=True, loads=False),
    "rekey_torch_fsync": Tool("torch.load -> rename -> torch.save + fsync", "py", py("rekey_torch", "--fsync"),
                              writes=True, loads=False, note="as durable as ckptool's output"),
    "rekey_torch_mmap": Tool("torch.load(mmap) -> rename -> torch.save", "py", py("rekey_torch_mmap"), writes=True,
                             loads=False),
    "rekey_st": Tool("load_file -> rename -> save_file", "py", py("rekey_st"), writes=True, loads=False),
    "list_dcp_metadata": Tool("dcp FileSystemReader.read_metadata()", "py", py("list_dcp_metadata"), loads=False),
    "list_hf_safe_open": Tool("safe_open over every shard", "py", py("list_hf_safe_open"), loads=False),
    "hf_load_shards": Tool("safetensors load_file per shard, merged + touch", "py", py("hf_load_shards"),
                           note="lazy (mmap), then every page touched"),
    "hf_from_pretrained_sd": Tool("transformers from_pretrained state-dict load + touch", "py",
                                  py("hf_from_pretrained_sd"),
                                  note="transformers' own code: safe_open(mmap) + get_slice + [...] on its thread "
                                       "pool; lazy, then every page touched"),
    "dcp_load_full": Tool("dcp.load(no_dist) into empty full tensors", "py", py("dcp_load_full")),
    "dcp_to_torch_save_load": Tool("dcp_to_torch_save + torch.load", "py", py("dcp_to_torch_save_load"), writes=True),
    # S7 (issue 15): every writer's output is fsynced inside its time, as ckptool's output set is.
    "ck_conv_st": Tool("ckptool convert --to safetensors", "cmd", ck_convert("safetensors", "safetensors"),
                       writes=True, loads=False, out_ext="safetensors"),
    "ck_conv_hf": Tool("ckptool convert --to hf", "cmd", ck_convert("hf", "hf"), writes=True, loads=False,
                       out_ext="hf"),
    "conv_st_py": Tool("torch.load + save_file + fsync", "py", py("convert_st", "--fsync", out_ext="safetensors"),
                       writes=True, loads=False, out_ext="safetensors"),
    "conv_hf_py": Tool("torch.load + save_torch_state_dict + fsync", "py",
                       py("convert_hf", "--fsync", out_ext="hf", shards=True), writes=True, loads=False, out_ext="hf"),
    "dcp_resave_hf": Tool("dcp_to_torch_save + torch.load + save_torch_state_dict + fsync", "py",
                          py("dcp_resave_hf", "--fsync", out_ext="hf", shards=True), writes=True, loads=False,
                          out_ext="hf"),
    "dcp_consolidate_hf": Tool("consolidate_safetensors_files + fsync", "py",
                               py("dcp_consolidate_hf", "--fsync", out_ext="hf", shards=True), writes=True,
                               loads=False, out_ext="hf",
                               note="input: dcp_big's tensors saved by 4 ranks through HuggingFaceStorageWriter, "
                                    "the only DCP form it reads"),
    "cp_dir_sync": Tool("cp -r + sync (fsync)", "cmd",
                        lambda fx, ctx: ["sh", "-c", 'cp -r "$1" "$2" && find "$2" -exec sync {} +', "sh", fx["path"],
                                         ctx.out_path(fx)], writes=True, loads=False),
    # S10 (issue 17): convert --to hf by N processes given the launcher's variables by hand
    # (as torchrun gives them, without torchrun's own Python startup in the time).
    "ck_conv_hf_par2": Tool("2 ranks: ckptool convert --to hf", "cmd", ck_convert_ranks(2), writes=True, loads=False,
                            out_ext="hf", note="every rank loads LibTorch for the rendezvous (c10d): in the time"),
    "ck_conv_hf_par4": Tool("4 ranks: ckptool convert --to hf", "cmd", ck_convert_ranks(4), writes=True, loads=False,
                            out_ext="hf"),
    # S11 (issue 16): torch.export archives.
    "list_export_load": Tool("torch.export.load + keys/shapes/dtypes", "py", py("list_export_load"), loads=False),
    "export_load": Tool("torch.export.load (weights read)", "py", py("export_load")),
    "startup_py": Tool("python: import torch, safetensors", "py", py("startup"), loads=False),
    "startup_py_cuda": Tool("python: import torch + CUDA context", "py", py("startup", "--device", "cuda"), loads=False),
}


def t_of(case: Case, s: Sample, ctx: Ctx) -> Optional[float]:
    if s.rc != 0:
        return None
    tool = case.tool
    if tool.kind == "py":
        return s.parsed.get("op_s")
    if tool.own_clock:
        opened, loaded = s.parsed.get("open_seconds"), s.parsed.get("seconds")
        return None if opened is None or loaded is None else opened + loaded
    key = startup_key(tool, ctx.manifest[case.fixture])
    if tool.startup and key in ctx.startup:
        return max(s.wall - ctx.startup[key], 1e-6)
    return s.wall


# A sharded fixture's startup is that of the format of its files (safetensors shards; DCP
# chunks are torch.save archives): the one-tensor calibration files have no set forms. A
# .pt2 is a zip like a torch.save archive, read by the same startup (LibTorch loaded).
SET_FILE_FORMAT = {"hf-set": "safetensors", "dcp": "pt", "pt2": "pt"}


def startup_key(tool, fx: dict) -> str:
    return f"{tool.startup}:{SET_FILE_FORMAT.get(fx['format'], fx['format'])}"


def meminfo() -> dict:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":")
            out[k] = int(v.split()[0]) * 1024
    return out


def cpu_busy() -> tuple:
    """(machine busy CPU seconds from /proc/stat, CPU seconds of this process and its reaped
    children, wall): the difference over a block is what other processes took."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    busy = (sum(v[:8]) - v[3] - v[4]) / tick  # all but idle and iowait
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return busy, a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime, time.perf_counter()


def interference(start: tuple, end: tuple) -> dict:
    wall = max(end[2] - start[2], 1e-9)
    others = max(0.0, (end[0] - start[0]) - (end[1] - start[1]))
    return {"others_cpu_s": others, "others_share": others / (wall * NPROC), "wall": wall}


def run_cases(cases: list, repeats: int, ctx: Ctx, title: str) -> None:
    """Interleaved: for each repeat, every case once, in order (A B C A B C ...)."""
    log(f"== {title}: {len(cases)} cases x {repeats} repeats")
    # Page cache hygiene: drop every fixture this block does not use, so that memory is free
    # and no sample pays direct reclaim of other blocks' cached fixtures (which made the
    # first samples of a block slower than the last, depending on order).
    used = {c.fixture for c in cases}
    for key, fx in ctx.manifest.items():
        if key not in used and os.path.exists(fx["path"]):
            drop_cache(fx["path"])
    # Every warm input's pages cached the same way (settle_cache), whoever wrote it.
    for key in sorted({c.fixture for c in cases if c.cache == "warm"}):
        settle_cache(ctx.manifest[key]["path"])
    mem0 = meminfo()
    t_start = time.perf_counter()
    c0, load0 = cpu_busy(), load_now()
    for r in range(repeats):
        for case in cases:
            fx = ctx.manifest[case.fixture]
            path = fx["path"]
            if case.tool.writes:
                os.sync()
            before = make_cold(path) if case.cache == "cold" else make_warm(path)
            argv = case.tool.argv(fx, ctx)
            s = run_sample(argv, env=ctx.env)
            s.res_before = before
            s.res_after = resident_fraction(path)
            s.parsed = slim(last_json(s.stdout))
            s.stdout = s.stdout[-2000:]  # inspect --json of 100,000 tensors is tens of MB
            if case.tool.writes:
                out = ctx.out_path(fx, case.tool)
                try:
                    s.extra["out_size"] = sum(os.path.getsize(f) for f in files_of(out))
                except OSError:
                    pass
                if r == 0 and s.rc == 0 and ctx.args.mode == "full":
                    s.extra["valid"] = check_output(case, fx, out, ctx)
                if os.path.isdir(out):
                    shutil.rmtree(out, ignore_errors=True)
                for p in (out, out + ".tmp", out + ".dcp.pt"):
                    try:
                        os.unlink(p)
                    except OSError:
                        pass
            s.t = t_of(case, s, ctx)
            if s.rc != 0:
                log(f"   ! {case.tool.label} on {case.fixture} exited {s.rc}: {s.stderr.strip()[-400:]}")
            case.samples.append(s)
            if ctx.args.verbose:
                log(f"   {r} {case.scen} {case.fixture} {case.cache} {case.tool.label}: wall {s.wall:.3f}s "
                    f"t {s.t if s.t is None else round(s.t, 4)} res {before:.3f}->{s.res_after:.3f}")
        log(f"   repeat {r + 1}/{repeats} done ({time.perf_counter() - t_start:.0f} s)")
    i = interference(c0, cpu_busy())
    i.update(title=title, load_start=load0, load_end=load_now(), mem_free=mem0.get("MemFree"),
             mem_available=mem0.get("MemAvailable"))
    ctx.blocks.append(i)
    log(f"   other processes took {100 * i['others_share']:.0f}% of the {NPROC} CPUs meanwhile "
        f"(load {load0} -> {i['load_end']})")


# Loads a fixture (argv[1], format argv[2]) by its own reader into `src`.
LOAD_SOURCE = r"""
import sys, torch
import torch.distributed.checkpoint as dcp
def load_source(path, fmt):
    if fmt == "pt":
        return torch.load(path, weights_only=True, mmap=True)
    if fmt == "dcp":
        reader = dcp.FileSystemReader(path)
    else:
        reader = dcp.HuggingFaceStorageReader(path)
    md = reader.read_metadata()
    sd = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype) for k, v in md.state_dict_metadata.items()
          if isinstance(v, dcp.metadata.TensorStorageMetadata)}
    dcp.load(sd, storage_reader=reader, no_dist=True)
    return sd
"""


def check_output(case: Case, fx: dict, out: str, ctx: Ctx) -> Optional[bool]:
    """Outside the timed region: the rekeyed output holds the same tensors under the new names
    (by torch.load / safetensors, never by ckptool)."""
    if case.scen in ("S7", "S10") and case.tool.out_ext:
        return check_converted(fx, out, ctx)
    if case.tool.kind == "cmd" or case.scen != "S5":
        return None
    code = r"""
import sys, torch
src, out, fmt = sys.argv[1], sys.argv[2], sys.argv[3]
if fmt == "safetensors":
    from safetensors.torch import load_file
    a, b = load_file(src), load_file(out)
else:
    a, b = torch.load(src, weights_only=True, mmap=True), torch.load(out, weights_only=True, mmap=True)
a = {k.replace("_orig_mod.", ""): v for k, v in a.items()}
ok = set(a) == set(b) and all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]) for k in a)
print("OK" if ok else "DIFFERENT")
"""
    p = subprocess.run([ctx.python, "-c", code, fx["path"], out, fx["format"]], capture_output=True, text=True)
    return p.stdout.strip() == "OK"


def check_converted(fx: dict, out: str, ctx: Ctx) -> bool:
    """S7: the output (one safetensors file, or a shard set read shard by shard with
    safetensors) holds every tensor of the source bit for bit, as the source's own reader loads
    it; a source key may be missing only as an exact alias of a kept one (a tied weight)."""
    code = LOAD_SOURCE + r"""
import os
from safetensors.torch import load_file
src = load_source(sys.argv[1], sys.argv[2])
out = sys.argv[3]
got = {}
for f in ([os.path.join(out, n) for n in sorted(os.listdir(out)) if n.endswith(".safetensors")]
          if os.path.isdir(out) else [out]):
    got.update(load_file(f))
def alias(v):
    return (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape), tuple(v.stride()))
kept = {alias(src[k]) for k in got if k in src}
ok = all(k in src and got[k].dtype == src[k].dtype and got[k].shape == src[k].shape
         and torch.equal(got[k], src[k]) for k in got)
ok = ok and all(alias(v) in kept for k, v in src.items() if k not in got)
print("OK" if ok else "DIFFERENT")
"""
    p = subprocess.run([ctx.python, "-c", code, fx["path"], fx["format"], out], capture_output=True, text=True)
    return p.stdout.strip() == "OK"


def largest_tensor(fx: dict, ctx: Ctx) -> Optional[int]:
    """Bytes of the fixture's largest tensor (its own reader's metadata), for S7's memory bound."""
    code = LOAD_SOURCE + r"""
path, fmt = sys.argv[1], sys.argv[2]
if fmt == "pt":
    sizes = [v.numel() * v.element_size() for v in load_source(path, fmt).values()]
else:
    md = dcp.FileSystemReader(path).read_metadata()
    sizes = [torch.Size(v.size).numel() * v.properties.dtype.itemsize for v in md.state_dict_metadata.values()
             if isinstance(v, dcp.metadata.TensorStorageMetadata)]
print(max(sizes))
"""
    p = subprocess.run([ctx.python, "-c", code, fx["path"], fx["format"]], capture_output=True, text=True)
    return int(p.stdout.strip()) if p.returncode == 0 and p.stdout.strip().isdigit() else None


# ---------------------------------------------------------------- statistics

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(case: Case, ctx: Ctx) -> dict:
    ok = [s for s in case.samples if s.rc == 0]
    fx = ctx.manifest[case.fixture]
    ts = [s.t for s in ok if s.t is not None]
    d = {
        "scen": case.scen, "fixture": case.fixture, "cache": case.cache, "tool": case.tool.label,
        "role": case.role, "group": case.group, "n": len(case.samples), "failed": len(case.samples) - len(ok),
        "t": med(ts), "t_min": min(ts) if ts else None, "t_max": max(ts) if ts else None,
        "wall": med([s.wall for s in ok]), "cpu": med([s.cpu for s in ok]),
        "anon": med([s.peak_anon for s in ok]), "anon_max": max([s.peak_anon for s in ok], default=None),
        "file": med([s.peak_file for s in ok]), "maxrss": med([s.maxrss for s in ok]),
        "majflt": med([s.majflt for s in ok]),
        "rchar": med([s.io.get("rchar") for s in ok]), "read_bytes": med([s.io.get("read_bytes") for s in ok]),
        "wchar": med([s.io.get("wchar") for s in ok]), "write_bytes": med([s.io.get("write_bytes") for s in ok]),
        "res_before": med([s.res_before for s in ok]), "res_before_max": max([s.res_before for s in ok], default=None),
        "res_before_min": min([s.res_before for s in ok], default=None),
        "res_after": med([s.res_after for s in ok]),
        "file_size": fx["file_size"], "payload": fx["payload"], "tensors": fx["tensors"],
        "largest": fx.get("largest"), "note": case.tool.note,
    }
    if case.tool.kind == "py":
        d["op_rchar"] = med([s.parsed.get("rchar") for s in ok])
        d["op_cpu"] = med([s.parsed.get("cpu_s") for s in ok])
        d["lazy"] = med([s.parsed.get("lazy_s") for s in ok])
        d["read_all"] = med([s.parsed.get("read_all_s") for s in ok])
        d["import_s"] = med([s.parsed.get("import_s") for s in ok])
    if case.tool.kind == "ck":
        d["self_seconds"] = med([s.parsed.get("seconds") for s in ok])
        d["self_bytes_read"] = med([(s.parsed.get("io") or {}).get("bytes_read") for s in ok])
    valid = [s.extra.get("valid") for s in case.samples if "valid" in s.extra]
    if valid:
        d["valid"] = all(v for v in valid if v is not None) if any(v is not None for v in valid) else None
    d["loads"] = case.tool.loads
    key = startup_key(case.tool, fx)
    if case.tool.startup and key in ctx.startup_spread and not case.tool.own_clock:
        d["startup_noise"] = ctx.startup_spread[key]
        d["startup"] = ctx.startup[key]
    if d["t"] and case.tool.loads:
        d["gbps"] = fx["payload"] / d["t"] / 1e9
    return d


# ---------------------------------------------------------------- S0 calibration

def calibrate(ctx: Ctx, big: str, gpu: bool, quick: bool) -> None:
    c = ctx.calib
    log("== S0 calibration")
    path = ctx.manifest[big]["path"]
    make_warm(path)
    for th in (1, NPROC):
        best = 0.0
        for _ in range(3):
            n, dt = read_file(path, threads=th)
            best = max(best, n / dt / 1e9)
        c[f"pagecache_read_{th}t"] = best
    if not quick:
        for th in (1, NPROC):
            r = make_cold(path)
            n, dt = read_file(path, threads=th)
            c[f"cold_read_{th}t"] = n / dt / 1e9
            c[f"cold_read_{th}t_resident_before"] = r
        make_warm(path)
    # memcpy: one buffer pair per thread, pages touched first
    size = (64 if quick else 256) * MiB
    for th in (1, NPROC):
        bufs = []
        for _ in range(th):
            src = (ctypes.c_char * size)()
            dst = (ctypes.c_char * size)()
            _libc.memset(src, 1, size)
            _libc.memset(dst, 2, size)
            bufs.append((src, dst))
        best = 0.0
        for _ in range(5):
            t0 = time.perf_counter()
            ths = [threading.Thread(target=_libc.memcpy, args=(d, s, size)) for s, d in bufs]
            for t in ths:
                t.start()
            for t in ths:
                t.join()
            best = max(best, th * size / (time.perf_counter() - t0) / 1e9)
        c[f"memcpy_{th}t"] = best
        del bufs
    # fixed startup of every tool, interleaved: ckptool materialize per format (LibTorch is
    # loaded for all; TorchScript also builds its module), inspect; Python's startup is read off
    # every Python sample instead (wall - timed region).
    fmts = [f for f in ("pt", "safetensors", "ts") if f"startup.{f}" in ctx.manifest]
    if ctx.args.tiny:
        fmts = ["pt"]
    cases = [Case("S0", f"startup.{f}", "warm", T["ck_mat_cpu"], group="startup") for f in fmts]
    cases.append(Case("S0", "startup.pt", "warm", T["ck_inspect"], group="startup"))
    if gpu:
        cases += [Case("S0", f"startup.{f}", "warm", T["ck_mat_cuda"], group="startup") for f in fmts]
        cases.append(Case("S0", "startup.pt", "warm", T["startup_py_cuda"], group="startup"))
    saved = dict(ctx.startup)
    ctx.startup = {}  # raw walls here
    reps = ctx.args.repeats + (3 if ctx.args.mode == "full" else 0)
    run_cases(cases, reps, ctx, "S0 startup (one-tensor checkpoints)")
    ctx.startup = saved
    for case in cases:
        ok = [s for s in case.samples if s.rc == 0]
        if not ok:
            continue
        fmt = ctx.manifest[case.fixture]["format"]
        wall = med([s.wall for s in ok])
        name = f"{case.tool.label} ({fmt})" if case.tool.startup else case.tool.label
        c["startup_" + name] = wall
        c["startup_anon_" + name] = med([s.peak_anon for s in ok])
        if case.tool.startup:
            key = f"{case.tool.startup}:{fmt}"
            ctx.startup[key] = wall
            walls = [s.wall for s in ok]
            ctx.startup_spread[key] = max(walls) - min(walls)
        if case.tool.kind == "py" and gpu:
            c["cuda_init_s"] = med([s.parsed.get("cuda_init_s") for s in ok])
    ctx.startup_cases = cases
    broken = [case for case in cases if case.tool.kind == "ck" and not any(s.rc == 0 for s in case.samples)]
    if broken:
        raise SystemExit(f"ckptool fails on the one-tensor checkpoint ({broken[0].tool.label}): "
                         f"{broken[0].samples[-1].stderr.strip()[-500:]}")
    if gpu:
        s = run_sample([ctx.python, str(HERE / "peer.py"), "calib_h2d", "--device", "cuda"], env=ctx.env)
        j = last_json(s.stdout)
        if s.rc != 0 or not j:
            log(f"   ! GPU calibration failed: {s.stderr.strip()[-800:]}")
        c.update({k: v for k, v in j.items() if k not in ("op", "file")})
    for k, v in c.items():
        log(f"   {k}: {v:.3f}" if isinstance(v, float) else f"   {k}: {v}")


# ---------------------------------------------------------------- scenarios

def build_scenarios(ctx: Ctx, mode: str, gpu: bool, want: set, counts: list) -> list:
    """(title, cases) per scenario block. The same cases in every mode, except that --quick and
    the tiny smoke run leave some peers out to save time (each Python sample pays the
    interpreter and `import torch`): a case's level says from which mode on it runs. Never
    tuned to pass."""
    rank = {"tiny": 0, "quick": 1, "full": 2}[mode]
    level = {"core": 0, "quick": 1, "full": 2}
    blocks = []

    def block(title, spec):
        cs = [Case(scen, fx, cache, T[tool], role, group) for (lv, scen, fx, cache, tool, role, group) in spec
              if level[lv] <= rank]
        if cs:
            blocks.append((title, cs))

    if "s1" in want:
        block("S1 materialize to CPU, warm", [
            ("core", "S1", "llm_bf16.pt", "warm", "ck_mat_cpu", "ck", "S1 pt"),
            ("core", "S1", "llm_bf16.pt", "warm", "torch_load_mmap", "peer", "S1 pt"),
            ("full", "S1", "llm_bf16.pt", "warm", "torch_load", "peer", "S1 pt"),
            ("full", "S1", "llm_bf16.pt", "warm", "ck_mat_mmap", "info", "S1 pt"),
            ("quick", "S1", "llm_bf16.safetensors", "warm", "ck_mat_cpu", "ck", "S1 st"),
            ("quick", "S1", "llm_bf16.safetensors", "warm", "st_load_file", "peer", "S1 st"),
            ("full", "S1", "llm_bf16.ts", "warm", "ck_mat_cpu", "ck", "S1 ts"),
            ("full", "S1", "llm_bf16.ts", "warm", "jit_load", "peer", "S1 ts"),
            ("full", "S1", "llm_fp32.pt", "warm", "ck_mat_cpu", "ck", "S1 fp32"),
            ("full", "S1", "llm_fp32.pt", "warm", "torch_load_mmap", "peer", "S1 fp32"),
        ])
        block("S1 materialize to CPU, cold", [
            ("full", "S1", "llm_bf16.pt", "cold", "ck_mat_cpu", "ck", "S1 pt cold"),
            ("full", "S1", "llm_bf16.pt", "cold", "torch_load", "peer", "S1 pt cold"),
            ("full", "S1", "llm_bf16.safetensors", "cold", "ck_mat_cpu", "ck", "S1 st cold"),
            ("full", "S1", "llm_bf16.safetensors", "cold", "st_load_file", "peer", "S1 st cold"),
        ])
    if "s2" in want and gpu:
        block("S2 materialize to CUDA, warm", [
            ("core", "S2", "llm_bf16.pt", "warm", "ck_mat_cuda", "ck", "S2 pt"),
            ("core", "S2", "llm_bf16.pt", "warm", "torch_load_cuda", "peer", "S2 pt"),
            ("quick", "S2", "llm_bf16.pt", "warm", "torch_load_mmap_to_cuda", "peer", "S2 pt"),
            ("full", "S2", "llm_bf16.pt", "warm", "torch_load_mmap_cuda", "peer", "S2 pt"),
            ("full", "S2", "llm_bf16.pt", "warm", "meta_assign_cuda", "peer", "S2 pt"),
            ("core", "S2", "llm_bf16.safetensors", "warm", "ck_mat_cuda", "ck", "S2 st"),
            ("core", "S2", "llm_bf16.safetensors", "warm", "st_load_file_cuda", "peer", "S2 st"),
            ("full", "S2", "llm_bf16.safetensors", "warm", "st_safe_open_cuda", "peer", "S2 st"),
            ("quick", "S2", "llm_bf16.ts", "warm", "ck_mat_cuda", "ck", "S2 ts"),
            ("quick", "S2", "llm_bf16.ts", "warm", "jit_load_cuda", "peer", "S2 ts"),
            ("full", "S2", "llm_fp32.pt", "warm", "ck_mat_cuda", "ck", "S2 fp32"),
            ("full", "S2", "llm_fp32.pt", "warm", "torch_load_cuda", "peer", "S2 fp32"),
            ("full", "S2", "llm_fp32.safetensors", "warm", "ck_mat_cuda", "ck", "S2 fp32 st"),
            ("full", "S2", "llm_fp32.safetensors", "warm", "st_load_file_cuda", "peer", "S2 fp32 st"),
        ])
    if "s3" in want:
        spec = []
        for n in counts:
            g = f"S3 {n}"
            spec += [("core", "S3", f"s3_{n}.pt", "warm", "ck_mat_cpu", "ck", g),
                     ("quick", "S3", f"s3_{n}.pt", "warm", "ck_inspect", "info", g),
                     ]
            if n in (counts[0], 20000):  # .safetensors at both ends: ckptool's and the peer's per-tensor cost
                spec += [("full", "S3", f"s3_{n}.safetensors", "warm", "ck_mat_cpu", "ck", g + " st"),
                         ("full", "S3", f"s3_{n}.safetensors", "warm", "st_load_file", "peer", g + " st")]
            if gpu:
                spec += [("quick", "S3", f"s3_{n}.pt", "warm", "ck_mat_cuda", "info", g)]
        block("S3 tensor count, warm", spec)
    if "s4" in want:
        mid = [n for n in counts if n >= 2000]
        nm = 20000 if 20000 in counts else (mid[0] if mid else counts[-1])
        block("S4 metadata-only inspect, cold", [
            ("core", "S4", "llm_bf16.pt", "cold", "ck_inspect", "ck", "S4 pt"),
            ("core", "S4", "llm_bf16.pt", "cold", "list_mmap", "peer", "S4 pt"),
            ("full", "S4", "llm_bf16.pt", "cold", "list_meta", "peer", "S4 pt"),
            ("core", "S4", "llm_bf16.safetensors", "cold", "ck_inspect", "ck", "S4 st"),
            ("quick", "S4", "llm_bf16.safetensors", "cold", "list_safe_open", "peer", "S4 st"),
            ("core", "S4", "llm_bf16.safetensors", "cold", "list_raw_header", "peer", "S4 st"),
            ("full", "S4", "llm_bf16.ts", "cold", "ck_inspect", "ck", "S4 ts"),
            ("full", "S4", "llm_bf16.ts", "cold", "list_jit", "peer", "S4 ts"),
            ("core", "S4", f"s3_{nm}.pt", "cold", "ck_inspect", "ck", f"S4 {nm} pt"),
            ("full", "S4", f"s3_{nm}.pt", "cold", "list_mmap", "peer", f"S4 {nm} pt"),
            ("quick", "S4", f"s3_{nm}.safetensors", "cold", "ck_inspect", "ck", f"S4 {nm} st"),
            ("full", "S4", f"s3_{nm}.safetensors", "cold", "list_safe_open", "peer", f"S4 {nm} st"),
        ])
        block("S4 metadata-only inspect, warm", [
            ("quick", "S4", "llm_bf16.pt", "warm", "ck_inspect", "ck", "S4 pt warm"),
            ("core", "S4", f"s3_{nm}.pt", "warm", "ck_inspect", "ck", f"S4 {nm} pt warm"),
            ("quick", "S4", f"s3_{nm}.safetensors", "warm", "ck_inspect", "ck", f"S4 {nm} st warm"),
        ])
    if "s5" in want:
        block("S5 rekey, source warm", [
            ("core", "S5", "compiled_bf16.pt", "warm", "ck_rekey", "ck", "S5 pt"),
            ("core", "S5", "compiled_bf16.pt", "warm", "cp", "peer", "S5 pt"),
            ("quick", "S5", "compiled_bf16.pt", "warm", "cp_sync", "peer", "S5 pt"),
            ("quick", "S5", "compiled_bf16.pt", "warm", "rekey_torch", "peer", "S5 pt"),
            ("full", "S5", "compiled_bf16.pt", "warm", "rekey_torch_fsync", "peer", "S5 pt"),
            ("core", "S5", "compiled_bf16.safetensors", "warm", "ck_rekey", "ck", "S5 st"),
            ("core", "S5", "compiled_bf16.safetensors", "warm", "cp", "peer", "S5 st"),
            ("quick", "S5", "compiled_bf16.safetensors", "warm", "rekey_st", "peer", "S5 st"),
        ])
        block("S5 rekey, source cold", [
            ("full", "S5", "compiled_bf16.pt", "cold", "ck_rekey", "ck", "S5 pt cold"),
            ("full", "S5", "compiled_bf16.pt", "cold", "cp", "peer", "S5 pt cold"),
            ("full", "S5", "compiled_bf16.pt", "cold", "cp_sync", "peer", "S5 pt cold"),
        ])
    if "s6" in want:
        nm = 20000 if 20000 in counts else max(counts)
        block("S6 sharded checkpoints: metadata-only inspect, warm", [
            ("core", "S6", "dcp_many", "warm", "ck_inspect", "ck", "S6 dcp inspect"),
            ("core", "S6", "dcp_many", "warm", "list_dcp_metadata", "peer", "S6 dcp inspect"),
            ("core", "S6", "hf_many", "warm", "ck_inspect", "ck", "S6 hf inspect"),
            ("core", "S6", "hf_many", "warm", "list_hf_safe_open", "peer", "S6 hf inspect"),
        ])
        block("S6 sharded checkpoints: materialize to CPU, warm", [
            ("core", "S6", "llm_bf16.safetensors", "warm", "ck_mat_cpu", "info", "S6 single"),
            ("core", "S6", "hf_big", "warm", "ck_mat_cpu", "ck", "S6 hf"),
            # transformers' load stays lazy: its like is ckptool --mmap, every page mapped by both
            ("core", "S6", "hf_big", "warm", "ck_mat_mmap", "ck", "S6 hf mapped"),
            ("core", "S6", "hf_big", "warm", "hf_from_pretrained_sd", "peer", "S6 hf mapped"),
            ("quick", "S6", "hf_big", "warm", "hf_load_shards", "peer", "S6 hf mapped"),
            ("core", "S6", "dcp_big", "warm", "ck_mat_cpu", "ck", "S6 dcp"),
            ("core", "S6", "dcp_big", "warm", "dcp_load_full", "peer", "S6 dcp"),
            ("quick", "S6", "dcp_big", "warm", "dcp_to_torch_save_load", "peer", "S6 dcp"),
        ])
    if "s7" in want:
        # Issue 15: convert at >= 5x the Python ways, within 1.5x of cp (both fsynced), memory
        # <= the largest tensor x 2 + 64 MiB. hf outputs are split at shard_bytes (4 shards).
        block("S7 convert, source warm, every output fsynced", [
            ("core", "S7", "llm_bf16.pt", "warm", "ck_conv_st", "ck", "S7 pt to st"),
            ("core", "S7", "llm_bf16.pt", "warm", "conv_st_py", "peer", "S7 pt to st"),
            ("core", "S7", "llm_bf16.pt", "warm", "cp_sync", "peer", "S7 pt to st"),
            ("quick", "S7", "llm_bf16.pt", "warm", "cp", "peer", "S7 pt to st"),
            ("core", "S7", "llm_bf16.pt", "warm", "ck_conv_hf", "ck", "S7 pt to hf"),
            ("core", "S7", "llm_bf16.pt", "warm", "conv_hf_py", "peer", "S7 pt to hf"),
            ("core", "S7", "dcp_big", "warm", "ck_conv_hf", "ck", "S7 dcp to hf"),
            ("core", "S7", "dcp_big", "warm", "dcp_resave_hf", "peer", "S7 dcp to hf"),
            ("core", "S7", "dcp_hf_big", "warm", "dcp_consolidate_hf", "peer", "S7 dcp to hf"),
            ("quick", "S7", "dcp_big", "warm", "cp_dir_sync", "peer", "S7 dcp to hf"),
        ])
    if "s10" in want:
        # Issue 17: parallel convert, 2 ranks >= 1.6x one process on a warm cache; cold reported;
        # 4 ranks on 2 cores for the scaling model.
        block("S10 parallel convert --to hf (DCP of 4 ranks), every output fsynced", [
            ("core", "S10", "dcp_big", "warm", "ck_conv_hf", "ck", "S10 warm"),
            ("core", "S10", "dcp_big", "warm", "ck_conv_hf_par2", "peer", "S10 warm"),
            ("quick", "S10", "dcp_big", "warm", "ck_conv_hf_par4", "peer", "S10 warm"),
            ("core", "S10", "dcp_big", "cold", "ck_conv_hf", "ck", "S10 cold"),
            ("core", "S10", "dcp_big", "cold", "ck_conv_hf_par2", "peer", "S10 cold"),
        ])
    if "s11" in want:
        # Issue 16: inspect of a .pt2 of ~300 weights >= 50x torch.export.load + listing,
        # reading < 1% of its bytes; materialize of the .pt2 to CPU at the GB/s of the same
        # weights in a torch.save zip.
        block("S11 torch.export archive: metadata-only inspect", [
            ("core", "S11", "s11.pt2", "warm", "ck_inspect", "ck", "S11 inspect"),
            ("core", "S11", "s11.pt2", "warm", "list_export_load", "peer", "S11 inspect"),
            ("core", "S11", "s11.pt2", "cold", "ck_inspect", "ck", "S11 inspect cold"),
        ])
        block("S11 torch.export archive: materialize to CPU, warm", [
            ("core", "S11", "s11.pt2", "warm", "ck_mat_cpu", "ck", "S11 materialize"),
            ("core", "S11", "s11.pt", "warm", "ck_mat_cpu", "peer", "S11 materialize"),
            ("quick", "S11", "s11.pt2", "warm", "export_load", "info", "S11 materialize"),
        ])
    if "s8" in want:
        # Issue 15: diff of two 2 GiB checkpoints at >= 70% of the page-cache read rate.
        block("S8 diff of a .pt and its safetensors twin, both warm", [
            ("core", "S8", "llm_bf16.pt", "warm", "ck_diff", "ck", "S8 diff"),
            ("core", "S8", "llm_bf16.pt", "warm", "cat_both", "peer", "S8 diff"),
        ])
    if "s9" in want:
        # Issue 17: a rank of W = 4 reads <= 1/4 + 1% of the bytes, in <= 0.35x the whole load's time.
        block("S9 tensor-parallel slices: rank 1 of 4 vs the whole checkpoint, warm", [
            ("core", "S9", "llm_bf16.safetensors", "warm", "ck_mat_slice", "ck", "S9 st"),
            ("core", "S9", "llm_bf16.safetensors", "warm", "ck_mat_cpu", "peer", "S9 st"),
            ("core", "S9", "dcp_big", "warm", "ck_mat_slice", "ck", "S9 dcp"),
            ("core", "S9", "dcp_big", "warm", "ck_mat_cpu", "peer", "S9 dcp"),
        ])
    return blocks


# ---------------------------------------------------------------- report

def fmt_t(x):
    if x is None:
        return "—"
    if x < 0.1:
        return f"{x * 1000:.1f} ms"
    return f"{x:.3f} s"


def fmt_mib(x):
    return "—" if x is None else f"{x / MiB:.0f}"


def fmt_bytes(x):
    if x is None:
        return "—"
    if x < 10 * MiB:
        return f"{x / 1024:.0f} KiB"
    return f"{x / MiB:.0f} MiB"


def ceiling_of(d: dict, calib: dict) -> Optional[tuple]:
    """(name, GB/s) of the ceiling for a load row."""
    if d["scen"] in ("S1", "S3"):
        if d["cache"] == "cold":
            v = max(calib.get(f"cold_read_{NPROC}t", 0), calib.get("cold_read_1t", 0))
            return ("cold read", v) if v else None
        v = calib.get(f"pagecache_read_{NPROC}t")
        return ("page-cache read", v) if v else None
    if d["scen"] == "S2":
        v = calib.get("h2d_pinned_best")
        return ("pinned H2D", v) if v else None
    return None


def make_rows(summaries: list, calib: dict) -> list:
    groups: dict = {}
    for d in summaries:
        groups.setdefault(d["group"], []).append(d)
    rows = []
    for d in summaries:
        ref = next((x for x in groups[d["group"]] if x["role"] == "ck" and x["fixture"] == d["fixture"]), None) \
            or next((x for x in groups[d["group"]] if x["role"] == "ck"), None)
        ratio = speed = ceil = ""
        if d["role"] == "peer" and ref and ref["t"] and d["t"]:
            ratio = f"{ref['t'] / d['t']:.2f}"
            speed = f"{d['t'] / ref['t']:.2f}×"
            if ref.get("startup_noise") is not None and ref["t"] < ref["startup_noise"]:
                ratio, speed = "n/m", "n/m"
        c = ceiling_of(d, calib)
        if c and d.get("gbps") and d["scen"] in ("S1", "S2", "S3") and "lazy" not in d["tool"]:
            ceil = f"{100 * d['gbps'] / c[1]:.0f}% of {c[0]}"
        if d["scen"] in ("S4", "S6", "S11") and not d["loads"]:
            if d["cache"] == "cold" and d["res_after"] is not None:
                ceil = f"{100 * d['res_after']:.2f}% of file read"
            if d.get("self_bytes_read"):
                ceil += f" (ckptool counts {d['self_bytes_read'] / d['file_size'] * 100:.3f}%)"
        if d["scen"] == "S5":
            cp = next((x for x in groups[d["group"]] if x["tool"] == "cp"), None)
            if cp and cp["t"] and d["t"] and d["tool"] != "cp":
                ceil = f"{100 * cp['t'] / d['t']:.0f}% of cp"
        if d["scen"] == "S7":  # against cp + fsync of the same input, as durable as every S7 output
            cp = next((x for x in summaries if x["scen"] == "S7" and x["fixture"] == d["fixture"]
                       and x["tool"] in (T["cp_sync"].label, T["cp_dir_sync"].label)), None)
            if cp and cp["t"] and d["t"] and d is not cp and d["tool"] != "cp":
                ceil = f"{100 * cp['t'] / d['t']:.0f}% of cp + fsync"
        if d["scen"] in ("S4", "S5", "S7") or d["cache"] == "cold":
            read = fmt_bytes(d.get("read_bytes")) + " disk"
            if d["scen"] in ("S4", "S11") and d["cache"] == "cold" and d["res_after"] is not None:
                read = fmt_bytes(d["res_after"] * d["file_size"]) + " paged in"
        else:
            read = fmt_bytes(d.get("op_rchar") if d.get("op_rchar") is not None else d.get("rchar"))
        flag = ""
        if d["failed"]:
            flag += f" ({d['failed']}/{d['n']} failed)"
        if d.get("valid") is False:
            flag += " (OUTPUT DIFFERS)"
        if d["cache"] == "cold" and d["res_before_max"] is not None and d["res_before_max"] > 0.01:
            flag += f" (cold check: up to {100 * d['res_before_max']:.0f}% resident)"
        if d["cache"] == "warm" and d["res_before_min"] is not None and d["res_before_min"] < 0.99:
            flag += f" (warm check: {100 * d['res_before_min']:.0f}% resident)"
        lazy = f"; lazy {fmt_t(d['lazy'])}" if d.get("lazy") is not None and d["role"] != "ck" else ""
        if d.get("read_all") is not None:
            lazy += f"; every byte read after: +{fmt_t(d['read_all'])}"
        if d.get("self_seconds") is not None:
            lazy += f"; own {fmt_t(d['self_seconds'])}"
        noise = d.get("startup_noise")
        if noise is not None and d["t"] is not None and d["t"] < noise:
            lazy += f" (within startup noise {fmt_t(noise)})"
            ratio = speed = ceil = ""
            d = dict(d, gbps=None)
        rows.append([
            d["scen"], f"{d['fixture']} ({d['payload'] / MiB:.0f} MiB, {d['tensors']} t)", d["cache"],
            ("**" + d["tool"] + "**" if d["role"] == "ck" else d["tool"]) + flag,
            fmt_t(d["t"]) + lazy, f"{fmt_t(d['t_min'])}–{fmt_t(d['t_max'])}", fmt_t(d["wall"]),
            "—" if d["cpu"] is None else f"{d['cpu']:.2f}",
            fmt_mib(d["anon"]), fmt_mib(d["file"]), read,
            "—" if not d.get("gbps") or d["scen"] in ("S4", "S5") else f"{d['gbps']:.2f}",
            ratio, speed, ceil])
    return rows


HEADER = ["scen", "fixture", "cache", "tool", "t median", "t min–max", "proc wall", "CPU s",
          "anon MiB", "file MiB", "read", "GB/s", "ckptool/peer", "speedup", "% of ceiling"]


def md_table(header, rows) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(x).replace("|", "\\|") for x in r) + " |")
    return "\n".join(out)


def find(summaries, scen, fixture, tool_key, cache="warm"):
    label = T[tool_key].label
    for d in summaries:
        if d["scen"] == scen and d["fixture"] == fixture and d["tool"] == label and d["cache"] == cache:
            return d
    return None


def targets(summaries: list, calib: dict, counts: list) -> list:
    """(MET/MISSED/n/a, text) per target of issue 6."""
    out = []

    def add(cond, text, *rows):
        noisy = [r for r in rows if r and r.get("startup_noise") is not None and r["t"] is not None
                 and r["t"] < r["startup_noise"]]
        if noisy:
            out.append(("n/m", text + f" — not measurable here: ckptool's work ({fmt_t(noisy[0]['t'])}) is within "
                                      f"the spread of its startup ({fmt_t(noisy[0]['startup_noise'])})"))
            return
        out.append(("n/a" if cond is None else ("MET" if cond else "MISSED"), text))

    def info(text, *rows):
        add(None, text, *rows)
        if out[-1][0] == "n/a":
            out[-1] = ("info", text)

    # S4
    d = find(summaries, "S4", "llm_bf16.pt", "ck_inspect", "cold")
    if d and d["res_after"] is not None:
        share = d["res_after"]
        own = d.get("self_bytes_read")
        add(share < 0.01, f"S4 inspect reads < 1% of the file (.pt {d['file_size'] / MiB:.0f} MiB, cold): "
            f"{100 * share:.3f}% paged in ({fmt_bytes(share * d['file_size'])}, readahead included); "
            f"ckptool counts {fmt_bytes(own)} read")
    p = find(summaries, "S4", "llm_bf16.pt", "list_mmap", "cold")
    if d and p and d["t"] and p["t"]:
        add(p["t"] / d["t"] >= 10, f"S4 inspect ≥ 10× faster than torch.load(mmap=True) (.pt, cold): "
            f"{p['t'] / d['t']:.1f}× ({fmt_t(d['t'])} vs {fmt_t(p['t'])}; process walls {fmt_t(d['wall'])} vs "
            f"{fmt_t(p['wall'])})")
    nmid = 20000 if 20000 in counts else max(counts)
    d = find(summaries, "S4", f"s3_{nmid}.pt", "ck_inspect", "warm")
    if d and d["t"]:
        add(d["t"] < 0.1 if nmid >= 20000 else None,
            f"S4 {nmid} tensors inspected in < 100 ms warm (whole process): {fmt_t(d['t'])}"
            + ("" if nmid >= 20000 else " (fewer than 20,000 tensors in this mode: not judged)"))
    # S6
    for fx, peer in (("dcp_many", "list_dcp_metadata"), ("hf_many", "list_hf_safe_open")):
        d, p = find(summaries, "S6", fx, "ck_inspect"), find(summaries, "S6", fx, peer)
        if d and p and d["t"] and p["t"]:
            add(p["t"] / d["t"] >= 20, f"S6 inspect of {fx} ({d['tensors']} keys) ≥ 20× faster than {p['tool']}: "
                f"{p['t'] / d['t']:.1f}× ({fmt_t(d['t'])} vs {fmt_t(p['t'])}; process walls {fmt_t(d['wall'])} vs "
                f"{fmt_t(p['wall'])})")
        if d and d.get("self_bytes_read") is not None:
            share = d["self_bytes_read"] / d["file_size"]
            add(share < 0.01, f"S6 inspect of {fx} reads < 1% of its bytes: {100 * share:.3f}% "
                f"({fmt_bytes(d['self_bytes_read'])} of {fmt_bytes(d['file_size'])}, ckptool's count)")
    single = find(summaries, "S6", "llm_bf16.safetensors", "ck_mat_cpu")
    for fx, peers in (("hf_big", ()), ("dcp_big", ("dcp_load_full", "dcp_to_torch_save_load"))):
        d = find(summaries, "S6", fx, "ck_mat_cpu")
        if not d or not d["t"]:
            continue
        if single and single["t"]:
            add(d["t"] <= 1.15 * single["t"] * d["payload"] / single["payload"],
                f"S6 materialize {fx} within 1.15× of the single file per byte (llm_bf16.safetensors): "
                f"{d['t'] / single['t'] * single['payload'] / d['payload']:.2f}× ({fmt_t(d['t'])} for "
                f"{fmt_mib(d['payload'])} MiB vs {fmt_t(single['t'])} for {fmt_mib(single['payload'])} MiB; "
                f"own {fmt_t(d.get('self_seconds'))} vs {fmt_t(single.get('self_seconds'))}; CPU s "
                f"{d['cpu']:.2f} vs {single['cpu']:.2f})", d, single)
        # Copying loads both: dcp.load fills full tensors it allocated, as ckptool does.
        for key in peers:
            p = find(summaries, "S6", fx, key)
            if p and p["t"]:
                add(p["t"] / d["t"] >= 3, f"S6 materialize {fx} ≥ 3× {p['tool']}: {p['t'] / d['t']:.2f}× "
                    f"({fmt_t(d['t'])} vs {fmt_t(p['t'])})", d)
        if d["anon_max"] is not None:
            add(d["anon_max"] <= 1.05 * d["payload"], f"S6 materialize {fx}: peak anonymous memory ≤ 1.05× the "
                f"tensor bytes: {d['anon_max'] / d['payload']:.3f}× ({fmt_mib(d['anon_max'])} MiB for "
                f"{fmt_mib(d['payload'])} MiB, ckptool's startup with LibTorch included)")
    # transformers' state-dict load leaves views of the mapped shards: like for like is
    # ckptool --mmap, both timed by their own clocks from before the first open to the last
    # page mapped (the peer touches one byte per page; ckptool populates every page).
    mm = find(summaries, "S6", "hf_big", "ck_mat_mmap")
    for key in ("hf_from_pretrained_sd", "hf_load_shards"):
        p = find(summaries, "S6", "hf_big", key)
        if not (mm and p and mm["t"] and p["t"]):
            continue
        text = (f"S6 materialize hf_big ≥ 3× {p['tool']}, both zero-copy with every page mapped (ckptool --mmap): "
                f"{p['t'] / mm['t']:.2f}× ({fmt_t(mm['t'])} vs {fmt_t(p['t'])}; process walls {fmt_t(mm['wall'])} vs "
                f"{fmt_t(p['wall'])}; CPU s {mm['cpu']:.2f} vs {p['cpu']:.2f})")
        if key == "hf_from_pretrained_sd":
            add(p["t"] / mm["t"] >= 3, text, mm)
        else:
            info(text.replace(" ≥ 3× ", " vs "), mm)
    # S7 (issue 15)
    cps = find(summaries, "S7", "llm_bf16.pt", "cp_sync")
    for fx, ck_key, peers in (("llm_bf16.pt", "ck_conv_st", ("conv_st_py",)),
                              ("llm_bf16.pt", "ck_conv_hf", ("conv_hf_py",)),
                              ("dcp_big", "ck_conv_hf", ("dcp_resave_hf", "dcp_consolidate_hf"))):
        d = find(summaries, "S7", fx, ck_key)
        if not d or not d["t"]:
            continue
        what = f"S7 {fx} → {ck_key[len('ck_conv_'):].replace('st', 'safetensors')}"
        for key in peers:
            p = next((x for x in summaries if x["scen"] == "S7" and x["tool"] == T[key].label), None)
            if p and p["t"]:
                add(p["t"] / d["t"] >= 5, f"{what} ≥ 5× faster than {p['tool']}"
                    f"{' (on ' + p['fixture'] + ')' if p['fixture'] != fx else ''}: {p['t'] / d['t']:.2f}× "
                    f"({fmt_t(d['t'])} vs {fmt_t(p['t'])}; process walls {fmt_t(d['wall'])} vs {fmt_t(p['wall'])})")
        if fx == "llm_bf16.pt" and cps and cps["t"]:
            add(d["t"] <= 1.5 * cps["t"], f"{what} within 1.5× of cp + fsync of the same file: "
                f"{d['t'] / cps['t']:.2f}× ({fmt_t(d['t'])} vs {fmt_t(cps['t'])})")
        if d["anon_max"] is not None and d.get("largest"):
            bound = 2 * d["largest"] + 64 * MiB
            add(d["anon_max"] <= bound, f"{what}: peak anonymous memory ≤ largest tensor × 2 + 64 MiB: "
                f"{fmt_mib(d['anon_max'])} MiB ≤ {fmt_mib(bound)} MiB (largest tensor {fmt_mib(d['largest'])} MiB; "
                f"max of samples)")
        elif d["anon_max"] is not None:
            add(None, f"{what}: peak anonymous memory {fmt_mib(d['anon_max'])} MiB (largest tensor unknown)")
    # S10 (issue 17): the speedup of 2 ranks over 1, same fixture, same cache state.
    for cache in ("warm", "cold"):
        one = find(summaries, "S10", "dcp_big", "ck_conv_hf", cache)
        for key, n in (("ck_conv_hf_par2", 2), ("ck_conv_hf_par4", 4)):
            par = find(summaries, "S10", "dcp_big", key, cache)
            if not (one and par and one["t"] and par["t"]):
                continue
            text = (f"S10 convert dcp_big → hf, {n} ranks vs 1, {cache}: {one['t'] / par['t']:.2f}× "
                    f"({fmt_t(par['t'])} vs {fmt_t(one['t'])})")
            if n == 2 and cache == "warm":
                add(one["t"] / par["t"] >= 1.6, "≥ 1.6×: " + text)
            else:
                info(text)
    # S11 (issue 16)
    d = find(summaries, "S11", "s11.pt2", "ck_inspect", "warm")
    p = find(summaries, "S11", "s11.pt2", "list_export_load", "warm")
    if d and p and d["t"] and p["t"]:
        add(p["t"] / d["t"] >= 50, f"S11 inspect of a .pt2 ({d['tensors']} weights) ≥ 50× faster than {p['tool']} "
            f"(warm): {p['t'] / d['t']:.1f}× ({fmt_t(d['t'])} vs {fmt_t(p['t'])}; process walls {fmt_t(d['wall'])} vs "
            f"{fmt_t(p['wall'])})")
    d = find(summaries, "S11", "s11.pt2", "ck_inspect", "cold")
    if d and d.get("self_bytes_read") is not None:
        share = d["self_bytes_read"] / d["file_size"]
        paged = f"; {100 * d['res_after']:.3f}% paged in, readahead included" if d.get("res_after") is not None else ""
        add(share < 0.01, f"S11 inspect of a .pt2 reads < 1% of its bytes (cold): {100 * share:.3f}% "
            f"({fmt_bytes(d['self_bytes_read'])} of {fmt_bytes(d['file_size'])}, ckptool's count{paged})")
    d = find(summaries, "S11", "s11.pt2", "ck_mat_cpu")
    z = find(summaries, "S11", "s11.pt", "ck_mat_cpu")
    if d and z and d.get("gbps") and z.get("gbps"):
        add(d["gbps"] >= 0.9 * z["gbps"], f"S11 materialize of a .pt2 to CPU at the GB/s of a torch.save zip of the "
            f"same weights (within 10%, warm): {d['gbps']:.2f} vs {z['gbps']:.2f} GB/s ({d['gbps'] / z['gbps']:.2f}×; "
            f"{fmt_t(d['t'])} vs {fmt_t(z['t'])} for {fmt_mib(d['payload'])} MiB)", d, z)
    e = find(summaries, "S11", "s11.pt2", "export_load")
    if d and e and d["t"] and e["t"]:
        info(f"S11 materialize of a .pt2: ckptool {fmt_t(d['t'])} vs {e['tool']} {fmt_t(e['t'])} "
             f"({e['t'] / d['t']:.2f}× speedup)", d)
    # S8 (issue 15): diff reads both files; cat of both is the page-cache read rate for them.
    d = find(summaries, "S8", "llm_bf16.pt", "ck_diff")
    c = find(summaries, "S8", "llm_bf16.pt", "cat_both")
    if d and c and d["t"] and c["t"]:
        add(c["t"] / d["t"] >= 0.7, f"S8 diff of a .pt and its safetensors twin at ≥ 70% of the page-cache read rate (cat of both, "
            f"same run): {100 * c['t'] / d['t']:.0f}% ({fmt_t(d['t'])} vs {fmt_t(c['t'])})")
    # S9 (issue 17): bytes from ckptool's own counter (io.bytes_read), times as every ck row's.
    for fx in ("llm_bf16.safetensors", "dcp_big"):
        d = find(summaries, "S9", fx, "ck_mat_slice")
        w = find(summaries, "S9", fx, "ck_mat_cpu")
        if not d or not d["t"]:
            continue
        if d.get("self_bytes_read") is not None:
            frac = d["self_bytes_read"] / d["payload"]
            add(frac <= 0.26, f"S9 {fx}: rank 1 of 4 reads ≤ 1/4 + 1% of the checkpoint's bytes: {100 * frac:.2f}% "
                f"({fmt_mib(d['self_bytes_read'])} of {fmt_mib(d['payload'])} MiB)")
        if w and w["t"]:
            add(d["t"] <= 0.35 * w["t"], f"S9 {fx}: rank 1 of 4 in ≤ 0.35× the whole load's time: "
                f"{d['t'] / w['t']:.2f}× ({fmt_t(d['t'])} vs {fmt_t(w['t'])})", d, w)
    # S5
    d = find(summaries, "S5", "compiled_bf16.pt", "ck_rekey")
    cp = find(summaries, "S5", "compiled_bf16.pt", "cp")
    cps = find(summaries, "S5", "compiled_bf16.pt", "cp_sync")
    rt = find(summaries, "S5", "compiled_bf16.pt", "rekey_torch")
    if d and cp and d["t"] and cp["t"]:
        extra = f"; vs cp + fsync {d['t'] / cps['t']:.2f}×" if cps and cps["t"] else ""
        add(d["t"] <= 1.25 * cp["t"], f"S5 rekey ≤ 1.25× cp (.pt, warm): {d['t'] / cp['t']:.2f}× "
            f"({fmt_t(d['t'])} vs {fmt_t(cp['t'])}){extra}")
    rtf = find(summaries, "S5", "compiled_bf16.pt", "rekey_torch_fsync")
    if d and rt and d["t"] and rt["t"]:
        extra = f"; vs the same + fsync {rtf['t'] / d['t']:.1f}×" if rtf and rtf["t"] else ""
        add(rt["t"] / d["t"] >= 5, f"S5 rekey ≥ 5× faster than torch.load → rename → torch.save (.pt, warm): "
            f"{rt['t'] / d['t']:.1f}× (process walls: {rt['wall'] / d['wall']:.1f}×){extra}")
    if d and d["anon_max"] is not None:
        add(d["anon_max"] <= 64 * MiB, f"S5 rekey ≤ 64 MiB anonymous memory (.pt): peak RssAnon "
            f"{d['anon_max'] / MiB:.1f} MiB (max of samples)")
    ds = find(summaries, "S5", "compiled_bf16.safetensors", "ck_rekey")
    cps2 = find(summaries, "S5", "compiled_bf16.safetensors", "cp")
    if ds and cps2 and ds["t"] and cps2["t"]:
        add(ds["t"] <= 1.25 * cps2["t"], f"S5 rekey ≤ 1.25× cp (.safetensors, warm): {ds['t'] / cps2['t']:.2f}×")
    # S1
    d = find(summaries, "S1", "llm_bf16.pt", "ck_mat_cpu")
    mm = find(summaries, "S1", "llm_bf16.pt", "torch_load_mmap")
    tl = find(summaries, "S1", "llm_bf16.pt", "torch_load")
    if d and mm and d["t"] and mm["t"]:
        add(d["t"] <= mm["t"], f"S1 ≥ torch.load(mmap=True) + touch (.pt, warm), copying load into private memory: ckptool {fmt_t(d['t'])} vs "
            f"{fmt_t(mm['t'])} ({mm['t'] / d['t']:.2f}×); process walls {fmt_t(d['wall'])} vs {fmt_t(mm['wall'])}", d)
    dm = find(summaries, "S1", "llm_bf16.pt", "ck_mat_mmap")
    if dm and mm and dm["t"] is not None and mm["t"]:
        # Like for like: both leave tensors backed by page-cache pages, every page mapped.
        own = f", own {fmt_t(dm['self_seconds'])}" if dm.get("self_seconds") is not None else ""
        add(max(dm["t"], 0) <= mm["t"], f"S1 ≥ torch.load(mmap=True) + touch (.pt, warm), ckptool --mmap (zero-copy, "
            f"populated): {fmt_t(max(dm['t'], 0))}{own} vs {fmt_t(mm['t'])}; process walls {fmt_t(dm['wall'])} vs "
            f"{fmt_t(mm['wall'])}", dm)
    if d and tl and d["t"] and tl["t"]:
        add(tl["t"] / d["t"] >= 2, f"S1 ≥ 2× torch.load (.pt, warm): {tl['t'] / d['t']:.2f}× "
            f"({fmt_t(d['t'])} vs {fmt_t(tl['t'])})", d)
    if d and d["anon_max"] is not None:
        base = calib.get("startup_anon_" + T["ck_mat_cpu"].label + " (pt)")
        add(d["anon_max"] <= 1.05 * d["payload"], f"S1 anonymous memory ≤ 1.05× checkpoint (.pt): "
            f"{d['anon_max'] / d['payload']:.3f}× ({fmt_mib(d['anon_max'])} MiB for {fmt_mib(d['payload'])} MiB; "
            f"{fmt_mib(base)} MiB of it is ckptool's startup, LibTorch loaded"
            + (f"; {(d['anon_max'] - base) / d['payload']:.3f}× without it)" if base else ")"))
    for fx, key in (("llm_bf16.safetensors", "st_load_file"), ("llm_bf16.ts", "jit_load"),
                    ("llm_fp32.pt", "torch_load_mmap")):
        d2, p2 = find(summaries, "S1", fx, "ck_mat_cpu"), find(summaries, "S1", fx, key)
        if d2 and p2 and d2["t"] and p2["t"]:
            info(f"S1 {fx}: ckptool {fmt_t(d2['t'])} vs {T[key].label} {fmt_t(p2['t'])} "
                 f"({p2['t'] / d2['t']:.2f}× speedup)", d2)
    # S2
    d = find(summaries, "S2", "llm_bf16.pt", "ck_mat_cuda")
    pin = calib.get("h2d_pinned_best")
    if d and d.get("gbps") and pin:
        add(d["gbps"] >= 0.75 * pin, f"S2 ≥ 75% of pinned H2D (.pt bf16): {d['gbps']:.2f} GB/s = "
            f"{100 * d['gbps'] / pin:.0f}% of {pin:.1f} GB/s (process wall {fmt_t(d['wall'])}, ckptool's own "
            f"load time {fmt_t(d.get('self_seconds'))})", d)
    tlc = find(summaries, "S2", "llm_bf16.pt", "torch_load_cuda")
    if d and tlc and d["t"] and tlc["t"]:
        add(tlc["t"] / d["t"] >= 2, f"S2 ≥ 2× torch.load(map_location=cuda): {tlc['t'] / d['t']:.2f}× "
            f"({fmt_t(d['t'])} vs {fmt_t(tlc['t'])})", d)
    ds = find(summaries, "S2", "llm_bf16.safetensors", "ck_mat_cuda")
    stc = find(summaries, "S2", "llm_bf16.safetensors", "st_load_file_cuda")
    if ds and stc and ds["t"] and stc["t"]:
        add(stc["t"] / ds["t"] >= 2, f"S2 ≥ 2× safetensors load_file(device=cuda): {stc['t'] / ds['t']:.2f}× "
            f"({fmt_t(ds['t'])} vs {fmt_t(stc['t'])})", ds)
    # S3
    big, few = max(counts), min(counts)
    d8 = find(summaries, "S3", f"s3_{few}.pt", "ck_mat_cpu")
    for n in counts:
        if n in (few,):
            continue
        dn = find(summaries, "S3", f"s3_{n}.pt", "ck_mat_cpu")
        if d8 and dn and d8["t"] and dn["t"]:
            r = dn["t"] / d8["t"]
            per = (dn["t"] - d8["t"]) / n * 1e6
            judged = n == 20000
            add(r <= 1.5 if judged else None,
                f"S3 {n} tensors within 1.5× of {few} (.pt, same bytes, ckptool materialize cpu): {r:.2f}× "
                f"({fmt_t(dn['t'])} vs {fmt_t(d8['t'])}; {per:.1f} µs per extra tensor)"
                + ("" if judged else " (reported, not a target)"), d8, dn)
        sn = find(summaries, "S3", f"s3_{n}.safetensors", "ck_mat_cpu")
        s8 = find(summaries, "S3", f"s3_{few}.safetensors", "ck_mat_cpu")
        if n == 20000 and sn and s8 and sn["t"] and s8["t"]:
            info(f"S3 20000 vs {few} tensors, .safetensors, ckptool: {sn['t'] / s8['t']:.2f}× "
                 f"({fmt_t(sn['t'])} vs {fmt_t(s8['t'])})", sn, s8)
    return out


def memory_agents() -> str:
    """What else moves this VM's memory while samples run: free page reporting
    (virtio_balloon: pages a process frees go back to the host, and the next process that
    allocates them waits for the host to back them again) and a DAMON scheme paging out
    page-cache pages left unread for a while. Suspected, not shown, of the part of a copying
    load's wall outside its own clock that varies between samples and runs (S6 hf_big
    1.01x and 1.29x of the single file in two runs with equal own load times)."""
    out = []
    try:
        order = Path("/sys/module/page_reporting/parameters/page_reporting_order").read_text().strip()
        if Path("/sys/bus/virtio/drivers/virtio_balloon").exists():
            out.append(f"virtio_balloon free page reporting (order {order}, {(PAGE << int(order)) // MiB} MiB blocks)")
    except (OSError, ValueError):
        pass
    root = Path("/sys/kernel/mm/damon/admin/kdamonds")
    try:
        for k in sorted(p for p in root.iterdir() if p.name.isdigit()):
            if (k / "state").read_text().strip() != "on":
                continue
            for scheme in k.glob("contexts/[0-9]*/schemes/[0-9]*"):
                action = (scheme / "action").read_text().strip()
                age = (scheme / "access_pattern/age/min").read_text().strip()
                quota = int((scheme / "quotas/bytes").read_text().strip() or 0)
                out.append(f"DAMON {action} (regions idle for {age} aggregation intervals"
                           + (f", up to {quota // MiB} MiB per quota interval" if quota else "") + ")")
    except (OSError, ValueError):
        pass
    return "; ".join(out) or "none found"


def machine_info(ctx: Ctx) -> dict:
    info = {}
    info["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    info["nproc"] = NPROC
    info["free_g"] = subprocess.run(["free", "-g"], capture_output=True, text=True).stdout.strip()
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info["cpu"] = cpu
    info["kernel"] = platform.release()
    info["memory_agents"] = memory_agents()
    # stat -f names ext4 "ext2/ext3" (one magic number for all three); the mount table knows.
    fs = subprocess.run(["findmnt", "-n", "-o", "FSTYPE,SOURCE", "--target", str(ctx.scratch)],
                        capture_output=True, text=True).stdout.strip()
    info["fs"] = fs or subprocess.run(["stat", "-f", "-c", "%T", str(ctx.scratch)], capture_output=True,
                                      text=True).stdout.strip()
    v = subprocess.run([ctx.python, "-c", "import torch, safetensors, sys; print(torch.__version__, "
                        "safetensors.__version__, sys.version.split()[0])"], capture_output=True, text=True)
    parts = v.stdout.split()
    info["torch"], info["safetensors"], info["python"] = (parts + ["?", "?", "?"])[:3]
    info["ckptool"] = subprocess.run([ctx.ckptool, "--version"], capture_output=True, text=True).stdout.strip()
    src = ctx.args.ckptool_source or ctx.ckptool
    try:
        built = datetime.datetime.fromtimestamp(os.path.getmtime(ctx.ckptool), datetime.timezone.utc)
        info["ckptool"] += f", binary {src} built {built.strftime('%Y-%m-%d %H:%M UTC')}"
    except OSError:
        pass
    try:
        info["ckptool_commit"] = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"],
                                                capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(HERE.parent), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        if dirty:
            info["ckptool_commit"] += " (+ uncommitted changes)"
    except OSError:
        pass
    return info


def load_now() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def busy_others() -> str:
    """The processes using the most CPU right now (not ours), for the report."""
    p = subprocess.run(["ps", "-eo", "pcpu,comm", "--sort=-pcpu", "--no-headers"], capture_output=True, text=True)
    items = []
    for line in p.stdout.splitlines()[:6]:
        parts = line.split(None, 1)
        if len(parts) == 2 and float(parts[0]) >= 5 and parts[1] not in ("ps",):
            items.append(f"{parts[1]} {parts[0]}%")
    return ", ".join(items) or "none above 5%"


# ---------------------------------------------------------------- main

def auto_size(scratch: Path, gpu: bool) -> int:
    mem = 0
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            mem = int(line.split()[1]) * 1024
    free = shutil.disk_usage(scratch).free
    cap = (12 if gpu else 4) * GiB
    size = min(cap, mem // 10, free // 16)
    p = 64 * MiB
    while p * 2 <= size:
        p *= 2
    return p


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scratch", required=True)
    ap.add_argument("--ckptool", required=True)
    ap.add_argument("--ckptool-source", default="", help="where the ckptool snapshot was copied from")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--size", type=int, default=0, help="bytes of the llm_* fixtures (default: by machine)")
    ap.add_argument("--s3-size", type=int, default=0)
    ap.add_argument("--s5-size", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=0)
    ap.add_argument("--scenarios", default="s1,s2,s3,s4,s5")
    ap.add_argument("--out", default="", help="append the report to this markdown file")
    ap.add_argument("--raw", default="", help="write every sample as JSON here")
    ap.add_argument("--command", default="", help="the command line, for the report")
    ap.add_argument("--fixtures", default="", help="reuse fixtures already generated in this directory")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    mode = "tiny" if args.tiny else ("quick" if args.quick else "full")
    args.mode = mode
    scratch = Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    if not args.repeats:
        args.repeats = {"tiny": 2, "quick": 3, "full": 5}[mode]
    size = args.size or {"tiny": 8 * MiB, "quick": 64 * MiB}.get(mode) or auto_size(scratch, args.gpu)
    s3_size = args.s3_size or min(size, {"tiny": 8 * MiB, "quick": 64 * MiB}.get(mode, GiB))
    s5_size = args.s5_size or min(size, GiB)
    counts = {"tiny": [8, 300, 2000], "quick": [8, 300, 20000]}.get(mode, [8, 300, 20000, 100000])
    want = set(x.strip().lower() for x in args.scenarios.split(",") if x.strip())
    t_run = time.perf_counter()
    load_start, others_start = load_now(), busy_others()
    log(f"ckptool bench: mode {mode}, fixtures {size / MiB:.0f} MiB (S3 {s3_size / MiB:.0f} MiB, "
        f"S5 {s5_size / MiB:.0f} MiB), "
        f"repeats {args.repeats}, scenarios {sorted(want)}, gpu {args.gpu}; load {load_start}")

    # fixtures
    fxdir = Path(args.fixtures) if args.fixtures else scratch / "fixtures"
    manifest_path = fxdir / "manifest.json"
    what = ["llm_bf16"]
    if want & {"s1", "s2"}:
        what.append("llm_fp32")
    if "s5" in want:
        what.append("compiled_bf16")
    if want & {"s3", "s4"}:
        what.append("s3")
    if want & {"s6", "s7", "s9", "s10"}:
        what.append("s6")
    if "s7" in want:
        what.append("s7")
    if "s11" in want:
        what.append("s11")
    need = 3 * size + (2 * size if "llm_fp32" in what else 0) + (3 * s5_size if "compiled_bf16" in what else 0) \
        + (10 * s3_size if "s3" in what else 0) + (4 * size if "s6" in what else 0) \
        + (3 * size if "s7" in what else 0) + (2 * size if "s11" in what else 0) + 256 * MiB  # S7: dcp_hf_big, a peer's output and its temporary
    free = shutil.disk_usage(scratch).free
    params_path = fxdir / "params.json"
    params = {"size": size, "s3_size": s3_size, "s5_size": s5_size, "counts": counts}
    gen_s = 0.0
    reuse = False
    if manifest_path.exists() and params_path.exists():
        old = json.loads(params_path.read_text())
        reuse = all(old.get(k) == v for k, v in params.items()) and set(what) <= set(old.get("what", []))
    if not reuse:
        if free < need:
            log(f"not enough free space in {scratch}: {free / GiB:.1f} GiB free, {need / GiB:.1f} GiB needed "
                f"(use --size-gib)")
            return 1
        if fxdir.exists() and not args.fixtures:
            shutil.rmtree(fxdir)
        log(f"== fixtures ({', '.join(what)}) in {fxdir}")
        t = time.perf_counter()
        p = subprocess.run([args.python, str(HERE / "gen_fixtures.py"), "--dir", str(fxdir), "--size", str(size),
                            "--s3-size", str(s3_size), "--s5-size", str(s5_size),
                            "--s3-counts", ",".join(map(str, counts)), "--s6-count", str(20000 if mode != "tiny" else 2000),
                            "--what", ",".join(what)])
        if p.returncode != 0:
            log("fixture generation failed")
            return 1
        gen_s = time.perf_counter() - t
        params_path.write_text(json.dumps(dict(params, what=what)))
    else:
        log(f"== reusing the fixtures in {fxdir}")
    manifest = json.loads(manifest_path.read_text())
    ctx = Ctx(args, manifest, scratch)
    if args.gpu:
        p = subprocess.run([args.python, "-c", "import torch; assert torch.cuda.is_available()"], capture_output=True)
        if p.returncode != 0:
            log("--gpu: torch sees no CUDA device on this machine")
            return 1
    info = machine_info(ctx)

    if "s7" in want:
        for key in ("llm_bf16.pt", "dcp_big"):
            if key in manifest:
                manifest[key]["largest"] = largest_tensor(manifest[key], ctx)
    calibrate(ctx, "llm_bf16.pt", args.gpu, mode != "full")
    blocks = build_scenarios(ctx, mode, args.gpu, want, counts)
    all_cases = list(getattr(ctx, "startup_cases", []))
    for title, cases in blocks:
        cases = [c for c in cases if c.fixture in manifest]
        run_cases(cases, args.repeats, ctx, title)
        all_cases += cases
    summaries = [summarize(c, ctx) for c in all_cases if c.scen != "S0"]
    load_end = load_now()
    total_s = time.perf_counter() - t_run

    # report
    rows = make_rows(summaries, ctx.calib)
    tg = targets(summaries, ctx.calib, counts)
    c = ctx.calib
    calib_rows = []

    def cr(name, key, unit="GB/s"):
        if key in c and c[key] is not None:
            v = c[key]
            calib_rows.append([name, f"{v:.2f} {unit}" if unit == "GB/s" else fmt_t(v)])
    cr("page-cache read, 1 thread (16 MiB preads)", "pagecache_read_1t")
    cr(f"page-cache read, {NPROC} threads", f"pagecache_read_{NPROC}t")
    cr("cold read, 1 thread (after fadvise DONTNEED)", "cold_read_1t")
    cr(f"cold read, {NPROC} threads", f"cold_read_{NPROC}t")
    cr("memcpy, 1 thread", "memcpy_1t")
    cr(f"memcpy, {NPROC} threads", f"memcpy_{NPROC}t")
    for k in sorted(c):
        if k.startswith("startup_") and not k.startswith("startup_anon_"):
            name = k[len("startup_"):]
            calib_rows.append([f"startup: {name} on a one-tensor file (process wall; peak anon)",
                               f"{fmt_t(c[k])}; {fmt_mib(c.get('startup_anon_' + name))} MiB"])
    py_rows = [d for d in summaries if d.get("import_s") is not None]
    if py_rows:
        calib_rows.append(["startup: Python peers, interpreter + import torch (+ safetensors), median over rows",
                           f"{fmt_t(med([d['import_s'] for d in py_rows]))} in-process; "
                           f"{fmt_t(med([d['wall'] - d['t'] for d in py_rows if d['t'] is not None]))} "
                           f"wall outside the timed region"])
    cr("CUDA context creation (torch)", "cuda_init_s", unit="s")
    cr("H2D pinned, 256 MiB, 1 stream (best)", "h2d_pinned_best")
    cr("H2D pinned, 256 MiB, 1 stream (median)", "h2d_pinned_median")
    cr("H2D pinned, 2 streams", "h2d_pinned_2streams_best")
    cr("H2D pageable, 256 MiB (best)", "h2d_pageable_best")
    cr("pinned allocation (cudaHostAlloc via torch)", "pin_alloc_gb_per_s")
    if "gpu" in c:
        calib_rows.append(["GPU", f"{c['gpu']} (CUDA {c.get('torch_cuda')})"])

    lines = []
    lines.append(f"## {info['date']} — {mode} run{' with GPU' if args.gpu else ''}")
    lines.append("")
    lines.append(f"- command: `{args.command or ' '.join(map(shlex.quote, sys.argv))}`")
    lines.append(f"- machine: {info['nproc']} CPUs ({info['cpu']}), kernel {info['kernel']}, scratch filesystem "
                 f"{info['fs']}; memory agents: {info.get('memory_agents', '?')}; `free -g`:")
    lines.append("")
    lines.append("```")
    lines.append(info["free_g"])
    lines.append("```")
    lines.append(f"- versions: {info['ckptool']} (commit {info.get('ckptool_commit', '?')}), torch {info['torch']}, "
                 f"safetensors {info['safetensors']}, Python {info['python']}")
    lines.append(f"- load average at start {load_start}, at end {load_end}; busiest other processes at start: "
                 f"{others_start}")
    lines.append(f"- fixtures: {size / MiB:.0f} MiB (S1/S2/S4), S5 {s5_size / MiB:.0f} MiB, S3 {s3_size / MiB:.0f} MiB as "
                 f"{', '.join(map(str, counts))} tensors; {args.repeats} repeats, interleaved; "
                 f"fixture generation {gen_s:.0f} s, whole run {total_s:.0f} s")
    if ctx.blocks:
        lines.append("- other processes' share of the CPUs while each block ran (from /proc/stat minus this "
                     "run's own CPU time): " + "; ".join(
                         f"{b['title']} {100 * b['others_share']:.0f}%" for b in ctx.blocks))
        lines.append("- free memory at each block's start, after the fixtures it does not use were dropped from the "
                     "page cache: " + "; ".join(f"{b['title'].split(',')[0]} {b['mem_free'] / GiB:.1f} GiB"
                                               for b in ctx.blocks if b.get("mem_free") is not None))
    lines.append("")
    lines.append("Calibration (S0):")
    lines.append("")
    lines.append(md_table(["ceiling", "measured"], calib_rows))
    lines.append("")
    lines.append(md_table(HEADER, rows))
    lines.append("")
    notes = dict.fromkeys(f"{d['tool']}: {d['note']}" for d in summaries if d["note"])
    if notes:
        lines.append("Notes on rows: " + "; ".join(notes))
        lines.append("")
    lines.append("Targets (issues 6 and 14):")
    lines.append("")
    for status, text in tg:
        lines.append(f"- **{status}** — {text}")
    lines.append("")
    report = "\n".join(lines)
    log("")
    log(report)
    if args.out:
        outp = Path(args.out)
        if not outp.exists():
            outp.write_text(RESULTS_HEADER)
        with open(outp, "a") as f:
            f.write("\n" + report + "\n")
        log(f"report appended to {outp}")
    if args.raw:
        raw = {"info": info, "calib": ctx.calib, "summaries": summaries, "targets": tg,
               "samples": [{"scen": c.scen, "fixture": c.fixture, "cache": c.cache, "tool": c.tool.label,
                            "samples": [{k: getattr(s, k) for k in ("rc", "wall", "t", "cpu", "maxrss", "majflt",
                                                                     "peak_anon", "peak_file", "peak_hwm", "io",
                                                                     "res_before", "res_after", "parsed", "extra")}
                                        for s in c.samples]} for c in all_cases]}
        Path(args.raw).write_text(json.dumps(raw, indent=1, default=str))
    failed = sum(d["failed"] for d in summaries)
    if failed:
        log(f"{failed} samples failed")
    return 0


RESULTS_HEADER = """# ckptool benchmark results

Produced by `bench/run.sh` (issue 6); every run appends a dated section, so earlier tables stay
for comparison. Each row is one tool on one fixture, run as a fresh process per sample, the
tools interleaved (A B C A B C ...), median over the repeats.

Columns:
- **t median / t min–max**: the work without each tool's fixed startup. Python peers: their
  own timed region, after `import torch` (and, on CUDA, after the context exists), ending when
  every page of every storage has been touched (CPU) or after `torch.cuda.synchronize()`.
  `ckptool materialize`: process wall minus the median wall of the same command on a
  one-tensor checkpoint (LibTorch loading, CUDA context; see "startup" in the calibration).
  Other ckptool verbs and `cp`: the whole process wall. "lazy" = the mmap-based load before
  its pages are touched; "every byte read after" = what reading every byte once more (an int64
  sum) costs after the timed region, not included in t; "own" = the load time ckptool itself
  reports (`seconds` in its JSON: storages read and tensors built, parse and LibTorch excluded).
  `ckptool materialize --mmap` (zero-copy, every page mapped before it returns): its own clock,
  open + load (`open_seconds + seconds` in its JSON), because that work is far below the
  spread of the startup that the wall would have to lose; a Python peer's timed region starts
  before it opens the file too. Lazy peers (mmap-based: safetensors, transformers,
  torch.load(mmap=True)) touch one byte per page inside their time, so every row has every
  page in its address space when t ends: a lazy peer is compared with ckptool --mmap, a
  copying peer (dcp.load into allocated tensors, torch.load) with ckptool --device cpu.
  S6 hf_big's named peer is transformers' own state-dict load of from_pretrained
  (safe_open with its mmap backend, get_slice, `[...]` on its thread pool; bench/peer.py).
- **proc wall**: fork to exit of the whole process, startup included (Python: interpreter and
  `import torch`).
- **CPU s**: user + system of the whole process (wait4).
- **anon MiB / file MiB**: peak RssAnon / RssFile of the process, sampled every 1–4 ms.
- **read**: warm rows: bytes through read() (rchar; Python peers: during the timed region
  only; mmap page faults are not counted there). Cold and S4/S5 rows: bytes read from the disk
  (read_bytes), or for cold S4 rows the fixture's pages brought into the page cache by the run
  (mincore after minus before, readahead included).
- **GB/s**: tensor payload (unique storage bytes) / t.
- **ckptool/peer, speedup**: the ckptool row of the same fixture over this row (< 1 and > 1×
  mean ckptool is faster).
- **% of ceiling**: GB/s over the calibrated ceiling (page-cache read with all threads for warm
  CPU loads, the cold read for cold ones, pinned host-to-device for CUDA); for S4 the share of
  the file read; for S5 cp's time over this row's.
- Cold rows: the fixture was dropped from the page cache with posix_fadvise(DONTNEED) and
  checked with mincore before each sample; warm rows: checked 100% resident. Before each block
  the fixtures it does not use are dropped from the page cache, so no sample pays for reclaiming
  them, and those its warm rows read are dropped and read back once, sequentially, so that
  every input's pages are cached alike (as its writer left them, S11's two inputs loaded 13%
  apart). Each run lists the share of the CPUs other processes took while each block ran.
- Neither cp, torch.save nor safetensors' save_file fsync their output; ckptool rekey does
  (atomic replace), hence the extra "cp + sync FILE" row.
"""


if __name__ == "__main__":
    sys.exit(main())
