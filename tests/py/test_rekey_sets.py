"""rekey INDEX|DIR -o OUTDIR on Hugging Face shard sets, and the output-directory policy
(issue 14; include/ckpt/output_dir.h, formats.md §11).

The sets come from the real writers (huggingface_hub.save_torch_state_dict, transformers
save_pretrained: hf_fixtures.py) and the results are judged by the real loaders
(transformers from_pretrained, safetensors, torch.load), never by ckptool alone.
Every refused command must leave every input byte-identical, OUTDIR as it was, and no
staging directory or temporary file (`.NAME.ckptool-*`) anywhere.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

import hf_fixtures
from conftest import CKPTOOL, TIME_SCALE, run_ckptool, sha256

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

TEMP_RE = re.compile(r"^\..*\.ckptool-")
LIMIT = 30 * TIME_SCALE


def temps(root: Path) -> list[str]:
    return sorted(str(p) for p in Path(root).rglob(".*") if TEMP_RE.match(p.name))


def ck(*args, rc: int = 0, env=None, timeout: float = LIMIT) -> tuple[str, str]:
    got, so, se = run_ckptool(*args, env=env, timeout=timeout)
    assert got == rc, f"ckptool {' '.join(map(str, args))}: exit {got}, expected {rc}\nstderr: {se}"
    if rc >= 2:
        assert se.count("\n") == 1 and se.startswith("ckptool: "), f"not one line: {se!r}"
    return so, se


def snapshot(root: Path) -> dict[str, str]:
    """Every file below root (not following directory symlinks) -> its hash or link target."""
    out = {}
    for p in sorted(Path(root).rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file():
            out[rel] = sha256(p)
        elif p.is_dir():
            out[rel] = "dir"
    return out


def compiled(sd: dict) -> dict:
    """The keys a torch.compile'd model's state_dict() gives: `_orig_mod.` in front."""
    return {"_orig_mod." + k: v for k, v in sd.items()}


def untied_state_dict(model) -> dict:
    """model.state_dict() without the keys whose tensor shares another key's storage (the
    tied lm_head of GPT-2), which save_torch_state_dict refuses in safetensors and
    from_pretrained ties again itself."""
    seen, out = set(), {}
    for k, v in model.state_dict().items():
        ptr = v.untyped_storage().data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        out[k] = v.contiguous()
    return out


def hub_save(sd: dict, directory: Path, safe: bool, size: str = hf_fixtures.SHARD_SIZE) -> Path:
    from huggingface_hub import save_torch_state_dict
    directory.mkdir(parents=True, exist_ok=True)
    save_torch_state_dict(sd, directory, max_shard_size=size, safe_serialization=safe)
    return hf_fixtures._index_in(directory)


def shards_of(index: Path) -> list[str]:
    return sorted(set(json.loads(index.read_text())["weight_map"].values()))


def load_set(directory: Path) -> dict:
    """The set's tensors as the reference readers give them."""
    index = hf_fixtures._index_in(directory)
    out = {}
    for name in shards_of(index):
        if name.endswith(".safetensors"):
            from safetensors.torch import load_file
            out.update(load_file(directory / name))
        else:
            out.update(torch.load(directory / name, weights_only=True))
    return out


MODELS = {"gpt2": hf_fixtures.gpt2_model, "llama": hf_fixtures.llama_model}


@pytest.fixture(scope="module")
def models():
    return {n: f() for n, f in MODELS.items()}


@pytest.fixture(scope="module")
def compiled_sets(models, tmp_path_factory):
    """name -> (model, directory) for sets saved with the keys of a compiled model."""
    root = tmp_path_factory.mktemp("compiled")
    sets = {}
    for mname, model in models.items():
        for safe in (True, False):
            d = root / f"{mname}_{'st' if safe else 'bin'}"
            hub_save(compiled(untied_state_dict(model)), d, safe)
            model.config.save_pretrained(d)  # from_pretrained wants config.json beside
            assert len(shards_of(hf_fixtures._index_in(d))) >= 3
            sets[d.name] = (model, d)
    return sets


# --------------------------------------------------------------------------- the loaders' view


@pytest.mark.parametrize("name", ["gpt2_st", "gpt2_bin", "llama_st", "llama_bin"])
def test_from_pretrained_loads_the_stripped_set(compiled_sets, tmp_path, name):
    """A set saved from a compiled model does not load (every key unexpected); after
    rekey --strip-compiled, from_pretrained loads it with no missing or unexpected keys
    and the model's own tensors. Fails on old code: the set was refused (exit 3)."""
    import transformers
    model, src = compiled_sets[name]
    cls = getattr(transformers, type(model).__name__)
    before = snapshot(src)

    _, info = cls.from_pretrained(src, output_loading_info=True)
    assert info["unexpected_keys"], "the compiled keys should not load as they are"

    out = tmp_path / "out"
    _, err = ck("rekey", src, "-o", out, "--strip-compiled")
    assert snapshot(src) == before
    assert temps(tmp_path) == [] and temps(src) == []
    # The set only: config.json is not part of it (formats.md §11.2), and rekey says so.
    assert sorted(p.name for p in out.iterdir()) == sorted(
        shards_of(hf_fixtures._index_in(src)) + [hf_fixtures._index_in(src).name])
    assert (src / "config.json").exists()
    assert re.search(r"rekey writes the shard set only; beside the index, not written: .*config\.json", err), err
    model.config.save_pretrained(out)

    loaded, info = cls.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    want = model.state_dict()
    got = loaded.state_dict()
    assert set(got) == set(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k


@pytest.mark.parametrize("layout", ["save_pretrained", "hub_st", "hub_bin"])
def test_index_round_trip_is_byte_identical(models, tmp_path, layout):
    """--add-prefix then --strip-prefix gives back the writer's own index, byte for byte:
    transformers' sort_keys + newline and huggingface_hub's order and no newline are
    both reproduced; `metadata` is kept. The tensors are the originals."""
    src = tmp_path / "src"
    if layout == "save_pretrained":
        models["gpt2"].save_pretrained(src, max_shard_size=hf_fixtures.SHARD_SIZE)
        index = hf_fixtures._index_in(src)
    else:
        index = hub_save(untied_state_dict(models["llama"]), src, layout == "hub_st")
    ck("rekey", src, "-o", tmp_path / "a", "--add-prefix", "_orig_mod.")
    a_index = tmp_path / "a" / index.name
    a = json.loads(a_index.read_text())
    orig = json.loads(index.read_text())
    assert a["metadata"] == orig["metadata"]
    assert list(a["weight_map"].items()) == [("_orig_mod." + k, v) for k, v in orig["weight_map"].items()] or \
        layout == "save_pretrained"
    if layout == "save_pretrained":  # what transformers writes
        assert a_index.read_text() == json.dumps(a, indent=2, sort_keys=True) + "\n"
    ck("rekey", tmp_path / "a" / index.name, "-o", tmp_path / "b", "--strip-prefix", "_orig_mod.")
    assert (tmp_path / "b" / index.name).read_bytes() == index.read_bytes()
    want, got = load_set(src), load_set(tmp_path / "b")
    assert set(want) == set(got)
    for k in want:
        assert torch.equal(want[k], got[k]), k


def test_collision_across_shards_writes_nothing(tmp_path):
    """`_orig_mod.w` in one shard and `w` in another: --strip-compiled would give both one
    name. Refused (exit 1) naming the key, before anything is written."""
    sd = {"_orig_mod.w": torch.zeros(3000), "b": torch.ones(3000), "w": torch.arange(3000.0)}
    src = tmp_path / "src"
    index = hub_save(sd, src, True, size="13KB")
    wm = json.loads(index.read_text())["weight_map"]
    assert wm["_orig_mod.w"] != wm["w"], "the two keys must lie in different shards"
    _, err = ck("rekey", src, "-o", tmp_path / "out", "--strip-compiled", rc=1)
    assert "'w'" in err and "across the shards" in err
    assert not (tmp_path / "out").exists() and temps(tmp_path) == []


def test_dry_run_json_and_save_map(compiled_sets, tmp_path):
    _, src = compiled_sets["gpt2_st"]
    before = snapshot(src)
    so, _ = ck("rekey", src, "--dry-run", "--json", "--strip-compiled")
    doc = json.loads(so)
    assert doc["dry_run"] and doc["output"] is None and doc["layout"] == "hf_index"
    index = json.loads(hf_fixtures._index_in(src).read_text())
    assert doc["changed"] == len(index["weight_map"])
    mapping = {p["old"]: p["new"] for p in doc["mapping"]}
    assert all(mapping[k] == k[len("_orig_mod."):] for k in index["weight_map"])
    assert snapshot(src) == before and list(tmp_path.iterdir()) == []

    out, m = tmp_path / "out", tmp_path / "map.json"
    ck("rekey", src, "-o", out, "--strip-compiled", "--save-map", m)
    saved = json.loads(m.read_text())
    assert saved["mapping"] == mapping
    # --save-map onto a file of the input set, or into OUTDIR: refused, nothing written.
    before = snapshot(src)
    out_before = snapshot(out)
    for o, target in ((tmp_path / "o2", src / shards_of(hf_fixtures._index_in(src))[0]),
                      (tmp_path / "o2", hf_fixtures._index_in(src)), (out, out / "m.json")):
        _, err = ck("rekey", src, "-o", o, "--strip-compiled", "--save-map", target, rc=2)
        assert snapshot(src) == before and not (tmp_path / "o2").exists() and temps(tmp_path) == []
        assert snapshot(out) == out_before
    # Replayed with --map on the original set: the same result.
    ck("rekey", src, "-o", tmp_path / "again", "--map", m)
    assert snapshot(out) == snapshot(tmp_path / "again")


# --------------------------------------------------------------------------- the policy


@pytest.fixture()
def small_set(tmp_path):
    """A 3-shard safetensors set with compiled keys, in tmp_path/in."""
    model = hf_fixtures.gpt2_model()
    src = tmp_path / "in"
    hub_save(compiled(untied_state_dict(model)), src, True)
    return src


def _refusal_cases(tmp_path: Path, src: Path):
    """(label, OUTDIR, extra args, setup) for every case the policy refuses with exit 2."""
    def nothing():
        pass

    def symlink_to_in():
        (tmp_path / "link").symlink_to(src)

    def existing_sub():
        (src / "sub").mkdir()

    def a_file():
        (tmp_path / "f").write_bytes(b"not a directory")

    def unrelated():
        (tmp_path / "o").mkdir()
        (tmp_path / "o" / "notes.txt").write_text("mine")

    def shard_named_file():
        (tmp_path / "o").mkdir()
        (tmp_path / "o" / shards_of(hf_fixtures._index_in(src))[0]).write_text("mine, not of a set")

    def dcp_there():
        (tmp_path / "o").mkdir()
        (tmp_path / "o" / ".metadata").write_bytes(b"x")

    def two_indexes():
        (tmp_path / "o").mkdir()
        for n in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
            (tmp_path / "o" / n).write_text('{"weight_map": {"a": "x.bin"}}')

    def bad_index():
        (tmp_path / "o").mkdir()
        (tmp_path / "o" / "model.safetensors.index.json").write_text("{not json")

    def planted_index():
        # An index ckptool did not write, naming the user's files: they are no shards.
        (tmp_path / "o").mkdir()
        (tmp_path / "o" / "notes.txt").write_text("mine")
        (tmp_path / "o" / "config.json").write_text("{}")
        (tmp_path / "o" / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {"a": "config.json", "b": "notes.txt"}}))

    def hard_linked_input():
        (tmp_path / "o").mkdir()
        first = shards_of(hf_fixtures._index_in(src))[0]
        (tmp_path / "o" / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {"k": first}}))
        os.link(src / first, tmp_path / "o" / first)

    return [
        ("is the input directory", src, [], nothing),
        ("is the input directory", str(src) + "/", [], nothing),
        ("is the input directory", src / ".." / "in", ["--force"], nothing),
        ("is the input directory", tmp_path / "link", ["--force"], symlink_to_in),
        ("lies inside the input directory", src / "out", ["--force"], nothing),
        ("lies inside the input directory", src / "sub", ["--force"], existing_sub),
        ("contains the input directory", tmp_path, ["--force"], nothing),
        ("is a regular file", tmp_path / "f", ["--force"], a_file),
        ("is a device", "/dev/null", ["--force"], nothing),
        ("pass --force", tmp_path / "o", [], unrelated),
        ("that is not of a previous set", tmp_path / "o", ["--force"], shard_named_file),
        ("holds a torch.distributed.checkpoint", tmp_path / "o", ["--force"], dcp_there),
        ("holds 2 shard indexes", tmp_path / "o", ["--force"], two_indexes),
        ("cannot be read", tmp_path / "o", ["--force"], bad_index),
        ("which is not a safetensors or torch file", tmp_path / "o", [], planted_index),
        ("which is not a safetensors or torch file", tmp_path / "o", ["--force"], planted_index),
        ("is the input", tmp_path / "o", ["--force"], hard_linked_input),
    ]


def test_refusals(tmp_path, small_set):
    """Each refusal: exit 2, one line saying why, inputs and OUTDIR unchanged, nothing left
    behind; IN given as the directory and as its index. Fails on old code: a directory IN
    was refused as a directory, an index IN as an unrecognized format (exit 3)."""
    src = small_set
    cases = _refusal_cases(tmp_path, src)
    for why, out, extra, setup in cases + [(w, o, e + ["IN=index"], s) for w, o, e, s in cases]:
        setup()
        before = snapshot(tmp_path)
        given = hf_fixtures._index_in(src) if "IN=index" in extra else src
        extra = [a for a in extra if a != "IN=index"]
        label = f"{why} ({out}, IN={given.name})"
        got, so, se = run_ckptool("rekey", given, "-o", out, "--strip-compiled", *extra, timeout=LIMIT)
        assert got == 2, f"{label}: exit {got}: {se}"
        assert se.count("\n") == 1 and se.startswith("ckptool: usage"), f"{label}: {se!r}"
        assert why in se, f"{label}: {se!r}"
        assert snapshot(tmp_path) == before, label
        assert temps(tmp_path) == [], label
        # Undo the setup for the next case.
        for p in ("link", "f", "o"):
            q = tmp_path / p
            if q.is_symlink() or q.is_file():
                q.unlink()
            elif q.is_dir():
                shutil.rmtree(q)
        if (src / "sub").exists():
            (src / "sub").rmdir()


def test_previous_set_replaced_other_files_kept(tmp_path, small_set):
    """OUTDIR holding only a previous set is replaced without --force; with another file
    beside it, --force is needed, and that file is left as it was. The previous set's
    files that the new set does not have (another layout's names) are removed."""
    src = small_set
    out = tmp_path / "out"
    ck("rekey", src, "-o", out, "--strip-compiled")
    ck("rekey", src, "-o", out, "--strip-compiled", "--add-prefix", "m.")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert all(k.startswith("m.") for k in index["weight_map"])
    assert set(load_set(out)) == set(index["weight_map"])

    (out / "notes.txt").write_text("keep me")
    os.chmod(out / "notes.txt", 0o600)
    _, err = ck("rekey", src, "-o", out, "--strip-compiled", rc=2)
    assert "notes.txt" in err and "--force" in err

    # A previous .bin set (other index, other shard names) replaced by a safetensors set.
    bin_src = tmp_path / "bin_in"
    hub_save(compiled(untied_state_dict(hf_fixtures.gpt2_model())), bin_src, False)
    ck("rekey", bin_src, "-o", out, "--strip-compiled", "--force")
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["notes.txt", "pytorch_model.bin.index.json"] + shards_of(out / "pytorch_model.bin.index.json"))
    assert (out / "notes.txt").read_text() == "keep me"
    assert oct(os.stat(out / "notes.txt").st_mode & 0o777) == oct(0o600)
    assert temps(tmp_path) == []

    # A previous set of legacy (torch < 1.6) .bin shards is a set too: replaced.
    legacy = tmp_path / "legacy_out"
    legacy.mkdir()
    torch.save({"w": torch.ones(3)}, legacy / "pytorch_model-00001-of-00001.bin", _use_new_zipfile_serialization=False)
    (legacy / "pytorch_model.bin.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {"w": "pytorch_model-00001-of-00001.bin"}}))
    ck("rekey", src, "-o", legacy, "--strip-compiled")
    assert "pytorch_model-00001-of-00001.bin" not in {p.name for p in legacy.iterdir()}


def test_outputs_keep_the_input_modes(tmp_path, small_set):
    src = small_set
    for p in src.iterdir():
        os.chmod(p, 0o600)
    os.chmod(src, 0o750)
    ck("rekey", src, "-o", tmp_path / "out", "--strip-compiled")
    assert {oct(os.stat(p).st_mode & 0o777) for p in (tmp_path / "out").iterdir()} == {oct(0o600)}
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(tmp_path / "out").st_mode & 0o777 == 0o750 & ~umask


def test_write_failure_leaves_nothing(tmp_path, small_set):
    """A full disk at each write in turn (CKPTOOL_FAULT_INJECT): exit 4, no OUTDIR, no
    staging directory, the input unchanged; past the last write the run completes."""
    out = tmp_path / "out"
    before = snapshot(small_set)
    failed = 0
    for nth in range(1, 40):
        got, _, se = run_ckptool("rekey", small_set, "-o", out, "--strip-compiled",
                                 env={"CKPTOOL_FAULT_INJECT": f"write:{nth}:ENOSPC"}, timeout=LIMIT)
        assert temps(tmp_path) == [], nth
        assert snapshot(small_set) == before
        if got == 0:
            break
        assert got == 4, f"write {nth}: exit {got}: {se}"
        assert "No space left" in se
        assert not out.exists(), nth
        failed += 1
    assert failed >= 6 and out.exists()  # every shard and the index failed once


def test_commit_failure_never_mixes_sets(tmp_path, small_set):
    """A rename failing at each step of a commit into an OUTDIR holding a previous set:
    OUTDIR then holds exactly the previous set or exactly the new one, never a mix, and
    no staging directory."""
    src = small_set
    out = tmp_path / "out"
    ck("rekey", src, "-o", out, "--strip-compiled")
    (out / "notes.txt").write_text("keep me")
    old = snapshot(out)
    new_dir = tmp_path / "expected"
    ck("rekey", src, "-o", new_dir, "--strip-compiled", "--add-prefix", "m.")
    new = snapshot(new_dir)
    new["notes.txt"] = old["notes.txt"]
    failures = 0
    for nth in range(1, 16):
        got, _, se = run_ckptool("rekey", src, "-o", out, "--strip-compiled", "--add-prefix", "m.", "--force",
                                 env={"CKPTOOL_FAULT_INJECT": f"rename:{nth}:EIO"}, timeout=LIMIT)
        now = snapshot(out)
        assert temps(tmp_path) == [], nth
        if got == 4:
            failures += 1
            assert now == old, f"rename {nth}: OUTDIR changed by a failed run"
        else:
            assert got == 0, se
            assert now == new, f"rename {nth}"
            break
    assert failures >= 6  # the shards' own renames, then the commit's


def test_corrupt_shard_writes_nothing(tmp_path, small_set):
    last = small_set / shards_of(hf_fixtures._index_in(small_set))[-1]
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 2])
    got, _, se = run_ckptool("rekey", small_set, "-o", tmp_path / "out", "--strip-compiled", timeout=LIMIT)
    assert got == 3, se
    assert not (tmp_path / "out").exists() and temps(tmp_path) == []


@pytest.fixture()
def big_set(tmp_path):
    """Three 24 MB shards, so a signal can arrive while they are written."""
    g = torch.Generator().manual_seed(0)
    sd = {f"_orig_mod.t{i}": torch.rand(6 << 20, generator=g) for i in range(3)}
    return tmp_path / "in", hub_save(sd, tmp_path / "in", True, size="30MB")


def _no_core():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_signal_mid_write_leaves_nothing(tmp_path, big_set, name):
    sig = getattr(signal, name)
    src, _ = big_set
    out = tmp_path / "out"
    p = subprocess.Popen([str(CKPTOOL), "rekey", str(src), "-o", str(out), "--strip-compiled"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_no_core)
    deadline = time.perf_counter() + LIMIT
    staging = []
    # Stopped once a shard is complete in the staging directory.
    while p.poll() is None and time.perf_counter() < deadline:
        staging = [Path(t) for t in temps(tmp_path) if Path(t).is_dir()]
        if staging and any(not q.name.startswith(".") for q in staging[0].iterdir()):
            break
        time.sleep(0.0002)
    p.send_signal(signal.SIGSTOP)
    assert staging, "no staging directory seen"
    p.send_signal(sig)
    p.send_signal(signal.SIGCONT)
    _, err = p.communicate(timeout=LIMIT)
    assert p.returncode == -sig, f"exit {p.returncode}: {err}"
    assert temps(tmp_path) == [] and not out.exists()


def test_file_size_limit_mid_set_leaves_nothing(tmp_path):
    """SIGXFSZ on the second shard, after the first is complete in the staging directory."""
    sd = {"_orig_mod.a": torch.zeros(50_000), "_orig_mod.big": torch.ones(750_000), "_orig_mod.b": torch.ones(50_000)}
    src = tmp_path / "in"
    index = hub_save(sd, src, True, size="300KB")
    assert len(shards_of(index)) == 3

    def limit():
        _no_core()
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    p = subprocess.run([str(CKPTOOL), "rekey", str(src), "-o", str(tmp_path / "out"), "--strip-compiled"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=limit, timeout=LIMIT)
    assert p.returncode == -signal.SIGXFSZ, p.stderr
    assert temps(tmp_path) == [] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("safe", [True, False])
def test_shards_without_a_renamed_key_are_copied_byte_for_byte(models, tmp_path, safe):
    """Only the shard holding the renamed key is rewritten; the others are the writer's
    own bytes (copied, not re-serialized: for these writers a rewrite happens to give the
    same bytes too, checked by disabling the copy; the copy also keeps other writers'
    header formatting). Fails on old code: the set was refused."""
    src = tmp_path / "src"
    index = hub_save(untied_state_dict(models["llama"]), src, safe)
    wm = json.loads(index.read_text())["weight_map"]
    key = "model.embed_tokens.weight"
    ck("rekey", src, "-o", tmp_path / "out", "--rename", r"^model\.embed_tokens\.=emb.")
    out = tmp_path / "out"
    for shard in shards_of(index):
        same = (out / shard).read_bytes() == (src / shard).read_bytes()
        assert same == (shard != wm[key]), shard
    got, want = load_set(out), load_set(src)
    assert torch.equal(got["emb.weight"], want[key])
    assert set(got) == {("emb.weight" if k == key else k) for k in want}


def _run_on_a_terminal(args) -> tuple[int, bytes]:
    import pty
    master, slave = pty.openpty()
    try:
        p = subprocess.run([str(CKPTOOL), *map(str, args)], stdout=subprocess.DEVNULL, stderr=slave, timeout=LIMIT)
    finally:
        os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the other side is closed and drained
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    return p.returncode, seen


def test_progress_bar_over_the_set_only_on_a_terminal(tmp_path):
    sd = {f"_orig_mod.t{i}": torch.arange(1 << 20, dtype=torch.float32) + i for i in range(3)}
    src = tmp_path / "in"
    hub_save(sd, src, True, size="5MB")
    rc, err = _run_on_a_terminal(["rekey", src, "-o", tmp_path / "tty", "--strip-compiled"])
    assert rc == 0, err
    assert b"rekey [" in err and b"100%" in err, err
    assert err.rstrip(b"\r\n").endswith(b"\x1b[K"), err  # the bar is erased at the end
    rc, so, se = run_ckptool("rekey", src, "-o", tmp_path / "pipe", "--strip-compiled")
    assert rc == 0 and se == "", se
    assert snapshot(tmp_path / "tty") == snapshot(tmp_path / "pipe")


def test_outdir_empty_or_a_symlink_to_a_directory(tmp_path, small_set):
    """An existing empty OUTDIR takes the set without --force; a symlink to a directory is
    kept and the set written into the directory it leads to."""
    empty = tmp_path / "empty"
    empty.mkdir()
    ck("rekey", small_set, "-o", empty, "--strip-compiled")
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    ck("rekey", small_set, "-o", tmp_path / "link", "--strip-compiled")
    assert (tmp_path / "link").is_symlink()
    assert snapshot(real) == snapshot(empty)
    assert temps(tmp_path) == []


def _in_a_tiny_tmpfs(size: int, script: str) -> subprocess.CompletedProcess:
    """Runs `script` (sh) in a private mount namespace with a tmpfs of `size` bytes at $T:
    nothing is mounted outside it, whatever happens to the test."""
    if not shutil.which("unshare"):
        pytest.skip("no unshare(1)")
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {probe.stderr.decode().strip()}")
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                           f"mkdir -p /tmp/ckptool-tiny-$$ && T=/tmp/ckptool-tiny-$$ && "
                           f"mount -t tmpfs -o size={size} tmpfs $T && {{ {script} ; }}; "
                           f"rc=$?; umount $T; rmdir $T; exit $rc"],
                          capture_output=True, timeout=LIMIT, env=dict(os.environ, CK=str(CKPTOOL)))


def test_full_disk_leaves_nothing(tmp_path, small_set):
    """A real ENOSPC (a tmpfs too small for the set): exit 4 and nothing left in it, for a
    new OUTDIR and for one holding a previous set, which stays as it was."""
    total = sum(p.stat().st_size for p in small_set.iterdir())
    half = (total // 2 // 4096 + 1) * 4096
    p = _in_a_tiny_tmpfs(half, f'"$CK" rekey {small_set} -o $T/out --strip-compiled; echo "rc=$?"; '
                               f'ls -A $T; echo end')
    out = p.stdout.decode()
    assert "rc=4" in out, (out, p.stderr)
    assert out.split("rc=4\n")[1] == "end\n", out  # the tmpfs is empty
    # A previous set (the plain keys, shorter) fills most of the room; the new one cannot fit beside.
    room = ((total + half) // 4096 + 2) * 4096
    p = _in_a_tiny_tmpfs(room, f'"$CK" rekey {small_set} -o $T/out --strip-compiled >/dev/null && '
                               f'cd $T/out && sha256sum * > ../before && '
                               f'"$CK" rekey {small_set} -o $T/out --strip-compiled --add-prefix m. ; echo "rc=$?"; '
                               f'sha256sum * | diff - ../before && echo same; ls -A $T/out | grep ckptool; echo end')
    out = p.stdout.decode()
    assert "rc=4" in out and "same\nend\n" in out, (out, p.stderr)


def test_match_aligns_the_whole_set_to_a_checkpoint(compiled_sets, tmp_path):
    """--match a plain torch.save(model.state_dict()): the edit is solved over every
    shard's tensors together, and the set then loads into the model strictly."""
    model, src = compiled_sets["llama_st"]
    target = tmp_path / "plain.pt"
    torch.save(model.state_dict(), target)
    ck("rekey", src, "-o", tmp_path / "out", "--match", target)
    got = load_set(tmp_path / "out")
    want = model.state_dict()
    assert set(got) == set(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k


def test_an_input_shard_symlinked_into_outdir_is_named(tmp_path, small_set):
    """The shard lives in OUTDIR and IN holds a symlink to it: OUTDIR is where an input
    is, so refused, and the one line says which input file leads there (the user named
    no such directory)."""
    first = shards_of(hf_fixtures._index_in(small_set))[0]
    out = tmp_path / "o"
    out.mkdir()
    shutil.move(small_set / first, out / first)
    (small_set / first).symlink_to(out / first)
    before = snapshot(tmp_path)
    rc, so, se = run_ckptool("rekey", small_set, "-o", out, "--strip-compiled", "--force", timeout=LIMIT)
    assert rc == 2 and so == "" and se.count("\n") == 1, se
    assert se.startswith(f"ckptool: usage: {out}: the input file '{small_set / first}' is a symlink to "
                         f"'{out / first}', so the output directory is the input directory '{out}'"), se
    assert snapshot(tmp_path) == before
