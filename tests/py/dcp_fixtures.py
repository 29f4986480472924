"""torch.distributed.checkpoint (DCP) directories written by the real writer.

Every scenario runs ``torch.distributed.checkpoint.save`` in 2 or 4 local processes (gloo
over 127.0.0.1 on a free port). The scenarios of one world size share one child process
(and one set of ranks), bounded in time and killed as a process group, so a hung collective
cannot hang the test suite. Nothing here looks at ckptool's output:
the tests compare ckptool with ``FileSystemReader(dir).read_metadata()`` and ``dcp.load``.

Library use:

    import dcp_fixtures
    built = dcp_fixtures.build(out_dir)              # {name: Path} of the scenarios that ran
    built = dcp_fixtures.build(out_dir, ["shard2"])  # only these

Command line:

    .venv/bin/python tests/py/dcp_fixtures.py OUTDIR [--only NAME ...] [--timeout S] [--list]

A scenario this torch cannot run (FSDP2 on CPU, the zstd extension without its Python
module) is skipped with a reason, not failed: ``skipped(out_dir)`` lists them.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> (world size, one-line description). The bodies are the functions scenario_<name>.
SCENARIOS = {
    "shard2": (2, "DTensor Shard(0) uneven (one over a megabyte), Shard(1), Replicate, zero-size chunk, "
                  "0-dim, plain tensors, nested optimizer-like state, non-tensor values"),
    "grid4": (4, "2x2 mesh: Shard(0)+Shard(1) grids (one over a megabyte), Replicate+Shard (HSDP), zero-size chunks"),
    "threads2": (2, "FileSystemWriter(thread_count=3): several .distcp files per rank"),
    "perfile2": (2, "FileSystemWriter(single_file_per_rank=False): one file per item"),
    "fsdp2": (2, "FSDP2 fully_shard on CPU with an Adam step, a torch.compile'd submodule "
                 "(_orig_mod. keys) and optimizer state"),
    "compiled2": (2, "a whole model torch.compile'd over FSDP2 (every key carries _orig_mod.), saved "
                     "with its state_dict() and FQN-keyed Adam state, as torchtitan #2622"),
    "zstd2": (2, "the zstd stream-transform extension (_extensions=[ZStandard()])"),
    "nocoll2": (2, "2.9+ use_collectives=False: a rank-local __{rank}.metadata per rank, "
                   "no global .metadata; DTensor Shard(0), Shard(1), Replicate, zero-size chunk, "
                   "plain tensors, non-tensor values; dcp.load's view saved beside it"),
    "nocolldiff2": (2, "use_collectives=False where a plain tensor of one name differs by rank "
                       "(each rank's dcp.load reads its own: no single value)"),
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- scenario bodies (run in every rank, after init_process_group) ----------------------

def _mesh(shape, names=None):
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cpu", shape, mesh_dim_names=names)


def scenario_shard2(out: Path, rank: int, world: int):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = _mesh((world,))
    sd = {
        "model": {
            "layer.weight": distribute_tensor(torch.arange(20, dtype=torch.float32).reshape(5, 4), mesh, [Shard(0)]),
            "layer2.weight": distribute_tensor(torch.arange(18, dtype=torch.bfloat16).reshape(3, 6), mesh, [Shard(1)]),
            "layer.bias": distribute_tensor(torch.ones(4, dtype=torch.float16), mesh, [Replicate()]),
            # One row on two ranks: rank 1 holds a zero-size chunk.
            "tiny": distribute_tensor(torch.tensor([[1.5, 2.5, 3.5]]), mesh, [Shard(0)]),
            "plain": torch.tensor([1, 2, 3], dtype=torch.int64),
            # Over a megabyte, so its tensor gets a mapping of its own (host_buffer.h);
            # rows of 4000 bytes put the second piece's first byte mid-page.
            "big": distribute_tensor(torch.randn(601, 1000, generator=torch.Generator().manual_seed(5)), mesh,
                                     [Shard(0)]),
            "flags": torch.tensor([True, False]),
        },
        "optim": {"state": {"step": torch.tensor(7.0),
                            "exp_avg": distribute_tensor(torch.full((5, 4), 0.25), mesh, [Shard(0)])},
                  "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "params": ["layer.weight"]}]},
        "step": 42,
        "name": "hello",
        "epochs": [1, 2, 3],
    }
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(out)))


def scenario_grid4(out: Path, rank: int, world: int):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = _mesh((2, 2), ("dp", "tp"))
    sd = {
        "w": distribute_tensor(torch.arange(12.0).reshape(3, 4), mesh, [Shard(0), Shard(1)]),
        "hsdp": distribute_tensor(torch.arange(5.0), mesh, [Replicate(), Shard(0)]),
        "tiny": distribute_tensor(torch.arange(1.0), mesh, [Shard(0), Replicate()]),
        "col": distribute_tensor(torch.arange(14, dtype=torch.int32).reshape(2, 7), mesh, [Replicate(), Shard(1)]),
        # Over a megabyte: strided pieces landed in a mapping of its own.
        "grid_big": distribute_tensor(torch.randn(301, 1003, generator=torch.Generator().manual_seed(6)), mesh,
                                      [Shard(0), Shard(1)]),
        "rank_count": world,
    }
    dcp.save(sd, checkpoint_id=str(out))


def scenario_threads2(out: Path, rank: int, world: int):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = _mesh((world,))
    sd = {f"layers.{i}.weight": distribute_tensor(torch.full((6, 3), float(i)), mesh, [Shard(0)]) for i in range(6)}
    sd["meta"] = {"note": "threads", "n": 6}
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(out), thread_count=3))


def scenario_perfile2(out: Path, rank: int, world: int):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = _mesh((world,))
    sd = {"a": distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0)]),
          "b": torch.arange(3, dtype=torch.int16), "c": 3.25}
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(out), single_file_per_rank=False))


def scenario_fsdp2(out: Path, rank: int, world: int):
    import torch
    import torch.distributed.checkpoint as dcp
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    # The compiled submodule keeps its parameters under `_orig_mod.` (torchtitan #2622).
    model[2] = torch.compile(model[2], backend="eager")
    mesh = _mesh((world,))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 5)).sum().backward()
    opt.step()
    dcp.save({"model": model.state_dict(), "optim": opt.state_dict()}, checkpoint_id=str(out))


def compiled2_model():
    """The uncompiled model of the compiled2 scenario (same seed, same shapes)."""
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))


def scenario_compiled2(out: Path, rank: int, world: int):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.fsdp import fully_shard
    model = compiled2_model()
    mesh = _mesh((world,))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    compiled = torch.compile(model, backend="eager")
    opt = torch.optim.Adam(compiled.parameters(), lr=1e-3)
    torch.manual_seed(1)
    compiled(torch.randn(4, 5)).sum().backward()
    opt.step()
    sd = compiled.state_dict()  # "_orig_mod.0.weight", ...: what DCP then stores
    osd = opt.state_dict()
    names = [n for n, _ in compiled.named_parameters()]
    # Optimizer state keyed by parameter FQN (as FSDP's optim_state_dict keys it); the
    # param_groups keep their integer ids, so no BYTE_IO value holds a key.
    optim = {"state": {names[i]: v for i, v in osd["state"].items()}, "param_groups": osd["param_groups"]}
    dcp.save({"model": sd, "optim": optim, "epoch": 3}, checkpoint_id=str(out))
    # What a test compares with: every tensor in full, bit for bit, on rank 0.
    full = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in sd.items()}
    full_optim = {n: {s: (t.full_tensor() if hasattr(t, "full_tensor") else t) for s, t in st.items()}
                  for n, st in optim["state"].items()}
    if rank == 0:
        torch.save({"model": full, "optim": full_optim}, str(out) + ".expected.pt")


def scenario_zstd2(out: Path, rank: int, world: int):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._extension import ZStandard
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = _mesh((world,))
    sd = {"w": distribute_tensor(torch.arange(40.0).reshape(10, 4), mesh, [Shard(0)]), "k": "zstd"}
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(out), _extensions=[ZStandard()]))


def scenario_nocoll2(out: Path, rank: int, world: int):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = _mesh((world,))

    def state():
        return {
            "model": {
                "w": distribute_tensor(torch.arange(20, dtype=torch.float32).reshape(5, 4), mesh, [Shard(0)]),
                "c": distribute_tensor(torch.arange(18, dtype=torch.bfloat16).reshape(3, 6), mesh, [Shard(1)]),
                "b": distribute_tensor(torch.ones(4, dtype=torch.float16), mesh, [Replicate()]),
                # One row on two ranks: rank 1 holds a zero-size chunk.
                "tiny": distribute_tensor(torch.tensor([[1.5, 2.5, 3.5]]), mesh, [Shard(0)]),
                "plain": torch.tensor([1, 2, 3], dtype=torch.int64),
            },
            "step": 42,
        }

    # Uncoordinated (experimental in 2.9-2.11): every rank writes __{rank}.metadata.
    dcp.save(state(), checkpoint_id=str(out), use_collectives=False)
    # What a test compares with: dcp.load itself (each rank reads its own __{rank}.metadata,
    # as it does when no .metadata exists) into zeroed tensors of the same layout, in full.
    sd = state()
    for k, v in sd["model"].items():
        v.zero_() if not hasattr(v, "to_local") else v.to_local().zero_()
    sd["step"] = 0
    dcp.load(sd, checkpoint_id=str(out))
    full = {"model." + k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in sd["model"].items()}
    if rank == 0:
        torch.save({"tensors": full, "step": sd["step"]}, str(out) + ".expected.pt")


def scenario_nocolldiff2(out: Path, rank: int, world: int):
    import torch
    import torch.distributed.checkpoint as dcp
    sd = {f"r{rank}.w": torch.arange(6.0).reshape(2, 3) + rank, "shared_name": torch.tensor([rank])}
    dcp.save(sd, checkpoint_id=str(out), use_collectives=False)


def metadata_files(d: Path) -> list[Path]:
    """The metadata files of a scenario's directory: .metadata, or the rank-local ones."""
    d = Path(d)
    return [d / ".metadata"] if (d / ".metadata").exists() else sorted(d.glob("__*.metadata"))


def skip_reason(name: str) -> str | None:
    """Why this torch cannot run a scenario, checked before spawning anything."""
    if name == "zstd2":
        try:
            from torch.distributed.checkpoint import _extension
        except ImportError:
            return "this torch has no torch.distributed.checkpoint._extension (before 2.7)"
        if getattr(_extension, "zstandard", None) is None and getattr(_extension, "pyzstd", None) is None:
            return "the zstd extension needs the Python module zstandard or pyzstd, not installed"
    if name in ("nocoll2", "nocolldiff2"):
        import inspect

        import torch.distributed.checkpoint as dcp
        if "use_collectives" not in inspect.signature(dcp.save).parameters:
            return "dcp.save has no use_collectives (before 2.9)"
    if name in ("fsdp2", "compiled2"):
        try:
            from torch.distributed.fsdp import fully_shard  # noqa: F401
        except ImportError:
            return "this torch has no torch.distributed.fsdp.fully_shard"
    return None


# --- running ----------------------------------------------------------------------------

def _rank_main(rank: int, world: int, jobs: list, port: int):
    import torch.distributed as dist
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for name, out in jobs:
            globals()["scenario_" + name](Path(out), rank, world)
            dist.barrier()
    finally:
        dist.destroy_process_group()


def _child(world: int, jobs: list):
    """Entry point of the bounded child process: spawns the ranks once for every scenario
    of this world size (importing torch once per rank, not once per scenario)."""
    import warnings

    import torch.multiprocessing as mp
    warnings.filterwarnings("ignore")
    mp.spawn(_rank_main, args=(world, jobs, free_port()), nprocs=world, join=True)


@contextlib.contextmanager
def _exclusive(out_dir: Path):
    """Holds out_dir's build lock: with CKPTOOL_DCP_FIXTURES several test files (run side by
    side by ctest -j) share one fixture directory, and two of them must not write, or one
    read while the other writes, the same scenario."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build(out_dir, names=None, timeout: float = 240.0) -> dict[str, Path]:
    """Writes the scenarios into out_dir/<name>/; returns those that ran. A scenario that
    fails, or a group that outlives `timeout` seconds per scenario, raises; one this torch
    cannot run is recorded in skipped.json."""
    with _exclusive(Path(out_dir)):
        return _build(Path(out_dir), names, timeout)


def _build(out_dir: Path, names, timeout: float) -> dict[str, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    built, skipped, groups = {}, {}, {}
    for name in names or SCENARIOS:
        if name not in SCENARIOS:
            raise ValueError(f"unknown DCP scenario {name!r}")
        target = out_dir / name
        if metadata_files(target):
            built[name] = target
            continue
        reason = skip_reason(name)
        if reason:
            skipped[name] = reason
            continue
        shutil.rmtree(target, ignore_errors=True)
        groups.setdefault(SCENARIOS[name][0], []).append((name, str(target)))
    for world, jobs in groups.items():
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
        names_here = ", ".join(n for n, _ in jobs)
        # A crash of the ranks is tried once more: the port free_port() found may be taken by
        # another test's ranks (ctest runs the DCP test files side by side) before gloo binds
        # it, and gloo then aborts. A timeout is not retried.
        for _ in range(2):
            # A new session, so a timeout kills every rank the child spawned, not just the child.
            p = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps([world, jobs])],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                log, _ = p.communicate(timeout=timeout * len(jobs))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.communicate()
                log = None
            failed = [n for n, t in jobs if log is None or p.returncode != 0 or not metadata_files(Path(t))]
            if failed:
                for _, t in jobs:
                    shutil.rmtree(t, ignore_errors=True)
            if not failed or log is None:
                break
        if failed:
            if log is None:
                raise RuntimeError(f"DCP scenarios {names_here} did not finish within {timeout * len(jobs)} s")
            raise RuntimeError(f"DCP scenarios {names_here} failed ({p.returncode}; missing: {', '.join(failed)}):\n"
                               + log.decode("utf-8", "replace")[-4000:])
        for n, t in jobs:
            built[n] = Path(t)
    if skipped:
        (out_dir / "skipped.json").write_text(json.dumps(skipped, indent=1))
    return built


def run_bounded(argv: list, timeout: float) -> tuple[int, str]:
    """Runs argv (a Python script that may spawn ranks) in a session of its own; returns
    (exit code, output). On a timeout the whole session is killed and TimeoutError raised,
    so no rank outlives the test."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    p = subprocess.Popen([sys.executable, *map(str, argv)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, start_new_session=True)
    try:
        log, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        p.communicate()
        raise TimeoutError(f"{Path(str(argv[0])).name} did not finish within {timeout} s") from None
    return p.returncode, log.decode("utf-8", "replace")


def build_lightning(out_dir, timeout: float = 300.0) -> Path:
    """Lightning's FSDP checkpoint directory (DCP + meta.pt), written by Lightning's own
    Fabric on CPU (lightning_fsdp_fixture.py says why it is ModelParallelStrategy), into
    out_dir/lightning2, with what fabric.load gave beside it (lightning2.expected.pt).
    Bounded like build(): the whole session is killed on a timeout."""
    with _exclusive(Path(out_dir)):
        return _build_lightning(Path(out_dir), timeout)


def _build_lightning(out_dir: Path, timeout: float) -> Path:
    target = Path(out_dir) / "lightning2"
    expected = Path(str(target) + ".expected.pt")
    if (target / ".metadata").exists() and expected.exists():
        return target
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        rc, log = run_bounded([HERE / "lightning_fsdp_fixture.py", target], timeout)
    except TimeoutError:
        shutil.rmtree(target, ignore_errors=True)
        raise RuntimeError(f"the Lightning FSDP fixture did not finish within {timeout} s") from None
    if rc != 0 or not expected.exists():
        shutil.rmtree(target, ignore_errors=True)
        raise RuntimeError(f"the Lightning FSDP fixture failed ({rc}):\n" + log[-4000:])
    return target


def skipped(out_dir) -> dict[str, str]:
    p = Path(out_dir) / "skipped.json"
    return json.loads(p.read_text()) if p.exists() else {}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?")
    ap.add_argument("--only", nargs="+", choices=sorted(SCENARIOS))
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per scenario")
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # JSON [world, [[name, dir], ...]]
    a = ap.parse_args(argv)
    if a.child:
        _child(*json.loads(a.child))
        return 0
    if a.list:
        for n, (w, d) in SCENARIOS.items():
            print(f"{n:10} {w} ranks  {d}   {skip_reason(n) or ''}")
        return 0
    if not a.out:
        ap.error("OUTDIR is required")
    built = build(a.out, a.only, a.timeout)
    for n, p in built.items():
        print(f"{n}: {p}")
    for n, why in skipped(a.out).items():
        print(f"{n}: skipped: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
