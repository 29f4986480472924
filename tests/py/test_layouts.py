"""Layouts decided before sniffing (issue 13 item 5): what a path names when it is a
directory or a shard index, and a DCP chunk read in place inside its .distcp file.

Every fixture is written by the real writer: torch.distributed.checkpoint.save,
huggingface_hub.save_torch_state_dict (the sharding transformers' save_pretrained uses),
safetensors.torch.save_file and torch.save. Shard sets and DCP directories are read as one
checkpoint (test_hf_sets.py, test_dcp_sets.py); directories that are neither are refused
as "not a regular file" (exit 2), naming what they hold.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest
import torch

from conftest import SOURCE_DIR, run_ckptool

BUILD_DIR = Path(os.environ.get("CKPTOOL_BUILD_DIR", SOURCE_DIR / "build"))
SLICE_INSPECT = BUILD_DIR / "tests" / "slice_inspect"


def state() -> dict:
    torch.manual_seed(0)
    return {"enc.weight": torch.randn(64, 32), "enc.bias": torch.randn(64, dtype=torch.float64),
            "head.weight": torch.randint(0, 100, (10, 64), dtype=torch.int32)}


def dcp_save(d: Path, sd: dict) -> None:
    import torch.distributed.checkpoint as dcp
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(sd, checkpoint_id=str(d))


def refused(args, message: str, kind: str = "unsupported", code: int = 3) -> None:
    rc, out, err = run_ckptool(*args)
    assert (rc, err) == (code, f"ckptool: {kind}: {message}\n"), (rc, out, err)


def test_dcp_directory_is_read_as_a_set(tmp_path):
    """Every verb reads a DCP directory (test_dcp_sets.py checks what they say; rekey writes
    a directory, test_dcp_rekey.py); rekey to a file path that exists is refused."""
    d = tmp_path / "run"
    dcp_save(d, state())
    assert (d / ".metadata").is_file()
    for verb in (["inspect"], ["verify"], ["materialize", "--device", "meta"]):
        rc, out, err = run_ckptool(*verb, d)
        assert rc == 0, (verb, out, err)
    rc, out, err = run_ckptool("rekey", d, "-o", tmp_path / "out", "--add-prefix", "m.")
    assert rc == 0, (out, err)
    assert (tmp_path / "out" / ".metadata").is_file()


def test_hugging_face_shard_set_is_opened_by_its_directory_or_index(tmp_path):
    from huggingface_hub import save_torch_state_dict
    d = tmp_path / "hf"
    d.mkdir()
    save_torch_state_dict(state(), d, max_shard_size=10_000)
    index = d / "model.safetensors.index.json"
    assert index.is_file() and len(set(json.loads(index.read_text())["weight_map"].values())) > 1
    rc_dir, out_dir, err_dir = run_ckptool("inspect", "--json", d)
    rc_index, out_index, err_index = run_ckptool("inspect", "--json", index)
    assert rc_dir == 0 and rc_index == 0, (err_dir, err_index)
    assert out_dir == out_index  # the same report, naming the index
    doc = json.loads(out_dir)
    assert (doc["layout"], doc["file"]) == ("hf-shard-set", str(index))
    assert {t["path"][-1] for t in doc["tensors"]} == set(state())
    # A shard named directly is an ordinary safetensors file.
    shard = sorted(d.glob("model-*.safetensors"))[0]
    rc, out, err = run_ckptool("inspect", "--json", shard)
    assert rc == 0, err
    assert json.loads(out)["layout"] == "file"


@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin"])
def test_directory_with_one_model_file_opens_it(tmp_path, name):
    d = tmp_path / "ckpt"
    d.mkdir()
    sd = state()
    if name.endswith(".safetensors"):
        from safetensors.torch import save_file
        save_file(sd, d / name)
    else:
        torch.save(sd, d / name)
    # A Trainer checkpoint directory also holds files that are not the model.
    (d / "config.json").write_text("{}")
    torch.save({"step": 3}, d / "optimizer.pt")
    torch.save({"lr": 0.1}, d / "training_args.bin")
    rc_dir, out_dir, err_dir = run_ckptool("inspect", "--json", d)
    rc_file, out_file, err_file = run_ckptool("inspect", "--json", d / name)
    assert rc_dir == 0 and rc_file == 0, (err_dir, err_file)
    assert out_dir == out_file  # the same report, naming the file
    doc = json.loads(out_dir)
    assert doc["file"] == str(d / name)
    assert {t["path"][-1] for t in doc["tensors"]} == set(sd)
    rc, out, err = run_ckptool("verify", d)
    assert rc == 0 and out.startswith(f"{d / name}: OK"), (rc, out, err)


@pytest.mark.parametrize("files,why", [
    (["model.safetensors", "pytorch_model.bin"], "not a regular file: a directory holding both model.safetensors and pytorch_model.bin: "
                                                 "name the file to read"),
    (["model.safetensors.index.json", "pytorch_model.bin.index.json"],
     "not a regular file: a directory holding 2 Hugging Face shard indexes (model.safetensors.index.json, pytorch_model.bin.index.json): "
     "name the one to read"),
    ([".metadata", "model.safetensors.index.json"],
     "not a regular file: a directory holding both a torch.distributed.checkpoint (.metadata) and a Hugging Face shard index "
     "(model.safetensors.index.json): name the file to read"),
    (["notes.txt"], "not a regular file: a directory without a checkpoint ckptool recognizes (.metadata, "
                    "*.index.json, shard-*-model-*-of-*.safetensors, model.safetensors or pytorch_model.bin)"),
])
def test_ambiguous_or_empty_directory_is_refused(tmp_path, files, why):
    """The user must name a file: a usage error (exit 2), as any directory was before."""
    d = tmp_path / "d"
    d.mkdir()
    for f in files:
        (d / f).write_bytes(b"{}")
    refused(["inspect", d], f"{d}: {why}", "usage", 2)


def chunks(d: Path):
    from torch.distributed.checkpoint import FileSystemReader
    md = FileSystemReader(str(d)).read_metadata()
    return [(idx.fqn, info.relative_path, info.offset, info.length) for idx, info in md.storage_data.items()]


def slice_inspect(path, offset, length):
    if not SLICE_INSPECT.exists():
        pytest.fail(f"{SLICE_INSPECT} not built")
    p = subprocess.run([str(SLICE_INSPECT), str(path), str(offset), str(length)], capture_output=True, timeout=60)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def test_dcp_chunks_read_in_place_through_slices(tmp_path):
    d = tmp_path / "run"
    sd = state()
    dcp_save(d, sd)
    for fqn, rel, off, length in chunks(d):
        distcp = d / rel
        blob = distcp.read_bytes()[off:off + length]
        ref = torch.load(io.BytesIO(blob), weights_only=True)  # the reference reading of the chunk
        rc, out, err = slice_inspect(distcp, off, length)
        assert rc == 0, err
        lines = out.splitlines()
        assert lines[0] == f"path {distcp}"
        assert lines[1] == "format torch-zip"
        dims = " ".join(str(x) for x in ref.shape)
        assert lines[2:] == [f"tensor  {str(ref.dtype).removeprefix('torch.')} {dims}".rstrip()], out
        assert torch.equal(ref, sd[fqn])


def test_corrupt_chunk_reports_the_distcp_and_its_absolute_offset(tmp_path):
    d = tmp_path / "run"
    dcp_save(d, state())
    fqn, rel, off, length = sorted(chunks(d), key=lambda c: c[2])[-1]  # not at the file's start
    assert off > 0
    distcp = d / rel
    data = bytearray(distcp.read_bytes())
    chunk = bytes(data[off:off + length])
    # Break the chunk's last central-directory header, then read it twice: extracted to a
    # file of its own (inspect), and in place through a slice.
    cd = chunk.rfind(b"PK\x01\x02")
    assert cd > 0
    data[off + cd] ^= 0xFF
    distcp.write_bytes(bytes(data))
    alone = tmp_path / "chunk.pt"
    alone.write_bytes(bytes(data[off:off + length]))
    rc_a, _, err_a = run_ckptool("inspect", alone)
    rc_s, _, err_s = slice_inspect(distcp, off, length)
    m_a = re.fullmatch(r"ckptool: (\w+): (.*?): byte (\d+): (.*)\n", err_a)
    m_s = re.fullmatch(r"slice_inspect: (\w+): (.*?): byte (\d+): (.*)\n", err_s)
    assert m_a and m_s, (err_a, err_s)
    assert rc_a == rc_s == 3
    assert m_s[1] == m_a[1] and m_s[4] == m_a[4]  # the same refusal
    assert m_a[2] == str(alone) and m_s[2] == str(distcp)
    assert int(m_s[3]) == int(m_a[3]) + off  # the byte in the .distcp
    assert int(m_a[3]) >= cd - 64  # the reader points near the damage
