"""The Python peers of the benchmark (issue 6): what PyTorch and safetensors users run today.

Run as a fresh process per sample by bench.py: `peer.py OP FILE [options]`. Imports (python,
torch, safetensors) and, on CUDA, the context creation happen before the clock starts; the
clock stops after every byte is resident (CPU: every page of every storage touched) or, on
CUDA, after torch.cuda.synchronize(). Prints one JSON object on the last line of stdout:

  op_s        the timed region (the figure compared with ckptool)
  lazy_s      for mmap-based loads, the time before the touch (lazy-only figure)
  touch_s     the touch part
  cpu_s       user+system CPU of this process during the timed region
  rchar, read_bytes, wchar, write_bytes  /proc/self/io deltas over the timed region
  import_s    interpreter start to the end of the imports (startup cost, not timed)
  cuda_init_s CUDA context creation (not timed), on CUDA
  tensors, bytes  what was loaded (bytes: unique storage bytes)
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

T_START = time.perf_counter()

import argparse  # noqa: E402


def proc_io() -> dict:
    out = {}
    try:
        with open("/proc/self/io") as f:
            for line in f:
                k, v = line.split(":")
                out[k.strip()] = int(v)
    except OSError:
        pass
    return out


def cpu_now() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def unique_storages(tensors):
    seen, out = set(), []
    for t in tensors:
        s = t.untyped_storage()
        key = (s.device.type, s.data_ptr())
        if key in seen:
            continue
        seen.add(key)
        out.append(s)
    return out


def touch_pages(tensors) -> int:
    """Fault in every page of every storage: one byte per 4 KiB read. After this every byte is
    resident and readable at memory speed, as it is after a materializing load; reading each
    byte once more would cost every loader the same."""
    import torch
    total = 0
    for s in unique_storages(tensors):
        if s.device.type != "cpu" or s.nbytes() == 0:
            continue
        u = torch.empty(0, dtype=torch.uint8).set_(s)
        total += int(u[::4096].sum())
        total += int(u[-1])
    return total


def read_all_bytes(tensors) -> None:
    import torch
    for s in unique_storages(tensors):
        if s.device.type != "cpu" or s.nbytes() == 0:
            continue
        u = torch.empty(0, dtype=torch.uint8).set_(s)
        n8 = (s.nbytes() // 8) * 8
        if n8:
            u[:n8].view(torch.int64).sum()
        if n8 < s.nbytes():
            u[n8:].sum()


def calib_h2d(device: str) -> dict:
    """Host-to-device ceilings: pinned and pageable copies of 256 MiB (one stream, copy engine
    via cudaMemcpyAsync), best and median of 8; pinned allocation rate; GPU name."""
    import torch
    out = {"gpu": torch.cuda.get_device_name(device), "torch_cuda": torch.version.cuda}
    n = 256 << 20
    dst = torch.empty(n, dtype=torch.uint8, device=device)
    t = time.perf_counter()
    pinned = torch.empty(n * 4, dtype=torch.uint8, pin_memory=True)
    out["pin_alloc_gb_per_s"] = n * 4 / (time.perf_counter() - t) / 1e9
    pinned = pinned[:n]
    pinned.random_(0, 255)
    pageable = torch.empty(n, dtype=torch.uint8)
    pageable.random_(0, 255)

    def rate(src):
        times = []
        for _ in range(10):
            torch.cuda.synchronize()
            t = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        times = sorted(times[2:])
        return n / times[0] / 1e9, n / times[len(times) // 2] / 1e9
    out["h2d_pinned_best"], out["h2d_pinned_median"] = rate(pinned)
    out["h2d_pageable_best"], out["h2d_pageable_median"] = rate(pageable)
    # two streams, two pinned buffers of 128 MiB each
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    half = n // 2
    times = []
    for _ in range(8):
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.cuda.stream(s1):
            dst[:half].copy_(pinned[:half], non_blocking=True)
        with torch.cuda.stream(s2):
            dst[half:].copy_(pinned[half:], non_blocking=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    out["h2d_pinned_2streams_best"] = n / min(times[2:]) / 1e9
    return out


def hf_shards(path: str) -> list:
    """The shard files of the set in directory `path`, in the order transformers opens them."""
    index = [n for n in os.listdir(path) if n.endswith(".index.json")]
    with open(os.path.join(path, index[0])) as fh:
        weight_map = json.load(fh)["weight_map"]
    return [os.path.join(path, n) for n in sorted(set(weight_map.values()))]


def fsync_tree(path: str) -> None:
    """fsync a file, or every file of a directory and the directory: as durable as ckptool's
    output (formats.md §11 syncs each file and the directory before it is complete)."""
    paths = [os.path.join(path, n) for n in os.listdir(path)] + [path] if os.path.isdir(path) else [path]
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def for_save_file(sd) -> dict:
    """What save_file accepts, nothing lost: a tensor that is an exact alias of an earlier one
    (a tied weight) is left out, as transformers does; other views are saved contiguous."""
    out, seen, owners = {}, set(), set()
    for k, v in sd.items():
        s = v.untyped_storage()
        alias = (s.data_ptr(), v.storage_offset(), tuple(v.shape), tuple(v.stride()))
        if alias in seen:
            continue
        seen.add(alias)
        whole = v.is_contiguous() and v.storage_offset() == 0 and v.numel() * v.element_size() == s.nbytes()
        out[k] = v if whole and s.data_ptr() not in owners else v.contiguous().clone()
        if whole:
            owners.add(s.data_ptr())
    return out


def consolidation_mapping(path: str, shard_bytes: int) -> dict:
    """fqn -> output file index for consolidate_safetensors_files, split as huggingface_hub
    splits (the same shards ckptool's --max-shard-size writes), from the global shapes in the
    per-rank files' DCP_SHARDING_INFO. An input the user already has (torchtitan derives it
    from the original checkpoint's index): computed outside the timed region."""
    import torch
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors import safe_open
    full, dtypes = {}, {}
    for name in sorted(os.listdir(path)):
        if not name.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(path, name), framework="pt") as g:
            info = json.loads(g.metadata()["DCP_SHARDING_INFO"])
            for k in g.keys():
                sl = g.get_slice(k)
                end = [o + n for o, n in zip(info[k]["saved_offsets"], sl.get_shape())]
                full[k] = [max(a, b) for a, b in zip(full.get(k, end), end)]
                dtypes[k] = sl.get_dtype()
    st_dtypes = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
                 "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                 "BOOL": torch.bool}
    meta = {k: torch.empty(full[k], dtype=st_dtypes[dtypes[k]], device="meta") for k in full}
    split = split_torch_state_dict_into_shards(meta, max_shard_size=shard_bytes)
    files = sorted(split.filename_to_tensors)
    return {k: files.index(f) + 1 for f, keys in split.filename_to_tensors.items() for k in keys}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("op")
    ap.add_argument("file", nargs="?")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--read-all", action="store_true", help="after the timed region, time a read of every byte")
    ap.add_argument("--fsync", action="store_true",
                    help="rekey and convert ops: fsync the output inside the timed region (as durable as ckptool's)")
    ap.add_argument("--max-shard-size", type=int, default=0, help="convert ops writing a shard set: bytes per shard")
    args = ap.parse_args()

    if args.op != "list_raw_header":  # the one peer that needs no torch
        import torch  # noqa: F401
    if args.op.startswith("st_") or args.op == "rekey_st":
        import safetensors  # noqa: F401
        import safetensors.torch  # noqa: F401
    if args.op == "hf_from_pretrained_sd":  # transformers' own loading code, imported outside the timed region
        import safetensors  # noqa: F401
        import transformers.core_model_loading  # noqa: F401
    res = {"op": args.op, "file": args.file}
    res["import_s"] = time.perf_counter() - T_START
    cuda = args.device.startswith("cuda")
    if cuda:
        t = time.perf_counter()
        torch.zeros(1, device=args.device)
        torch.cuda.synchronize()
        res["cuda_init_s"] = time.perf_counter() - t

    if args.op == "calib_h2d":
        res.update(calib_h2d(args.device if cuda else "cuda"))
        print(json.dumps(res), flush=True)
        return 0

    op = args.op
    f = args.file
    if op == "dcp_consolidate_hf":
        mapping = consolidation_mapping(f, args.max_shard_size)
        os.makedirs(args.out, exist_ok=True)
    io0, cpu0 = proc_io(), cpu_now()
    t0 = time.perf_counter()
    lazy = None
    tensors = None
    if op == "startup":
        tensors = []
    elif op == "torch_load":  # torch.load(weights_only=True), map_location cpu or cuda
        sd = torch.load(f, weights_only=True, map_location=args.device)
        tensors = list(sd.values())
    elif op == "torch_load_mmap":  # mmap=True (lazy), then touch (CPU) or per-tensor .to(cuda)
        sd = torch.load(f, weights_only=True, mmap=True, map_location="cpu")
        lazy = time.perf_counter() - t0
        tensors = list(sd.values())
        if cuda:
            tensors = [t.to(args.device) for t in tensors]
    elif op == "torch_load_mmap_cuda":  # torch.load(mmap=True, map_location="cuda")
        sd = torch.load(f, weights_only=True, mmap=True, map_location=args.device)
        tensors = list(sd.values())
    elif op == "jit_load":
        m = torch.jit.load(f, map_location=args.device)
        tensors = list(m.state_dict().values())
    elif op == "st_load_file":
        from safetensors.torch import load_file
        sd = load_file(f, device=args.device if cuda else "cpu")
        lazy = time.perf_counter() - t0
        tensors = list(sd.values())
    elif op == "st_safe_open_loop":  # safe_open(device=cuda) get_tensor loop
        from safetensors import safe_open
        with safe_open(f, framework="pt", device=args.device) as g:
            tensors = [g.get_tensor(k) for k in g.keys()]
    elif op == "meta_model_assign":  # meta skeleton + load_state_dict(assign=True) from torch.load
        sd = torch.load(f, weights_only=True, mmap=not cuda, map_location=args.device)
        with torch.device("meta"):
            holder = torch.nn.Module()
            for k, v in sd.items():
                parts = k.split(".")
                m = holder
                for p in parts[:-1]:
                    if not hasattr(m, p):
                        setattr(m, p, torch.nn.Module())
                    m = getattr(m, p)
                m.register_buffer(parts[-1], torch.empty_like(v, device="meta"))
        holder.load_state_dict(sd, assign=True)
        lazy = time.perf_counter() - t0
        tensors = list(holder.state_dict().values())
    # ---- S4: metadata only
    elif op == "list_mmap":  # torch.load(mmap=True) and list keys, shapes, dtypes
        sd = torch.load(f, weights_only=True, mmap=True)
        meta = [(k, tuple(v.shape), str(v.dtype)) for k, v in sd.items()]
        res["tensors"] = len(meta)
    elif op == "list_meta":  # torch.load(map_location="meta")
        sd = torch.load(f, weights_only=True, map_location="meta")
        meta = [(k, tuple(v.shape), str(v.dtype)) for k, v in sd.items()]
        res["tensors"] = len(meta)
    elif op == "list_jit":  # torch.jit.load (reads every storage)
        m = torch.jit.load(f, map_location="cpu")
        meta = [(k, tuple(v.shape), str(v.dtype)) for k, v in m.state_dict().items()]
        res["tensors"] = len(meta)
    elif op == "list_safe_open":  # safe_open header: keys, shapes, dtypes
        from safetensors import safe_open
        with safe_open(f, framework="pt") as g:
            meta = []
            for k in g.keys():
                sl = g.get_slice(k)
                meta.append((k, tuple(sl.get_shape()), sl.get_dtype()))
        res["tensors"] = len(meta)
    elif op == "list_raw_header":  # 8-byte length + JSON, no library
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            hdr = json.loads(fh.read(n))
        meta = [(k, tuple(v["shape"]), v["dtype"]) for k, v in hdr.items() if k != "__metadata__"]
        res["tensors"] = len(meta)
    # ---- S6: sharded checkpoints (a Hugging Face shard set or a DCP directory as FILE)
    elif op == "list_dcp_metadata":  # FileSystemReader.read_metadata(): keys, global shapes, dtypes
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata
        md = FileSystemReader(f).read_metadata()
        meta = [(k, tuple(v.size), str(v.properties.dtype)) for k, v in md.state_dict_metadata.items()
                if isinstance(v, TensorStorageMetadata)]
        res["tensors"] = len(meta)
    elif op == "list_hf_safe_open":  # safe_open over every shard the index names
        from safetensors import safe_open
        meta = []
        for shard in hf_shards(f):
            with safe_open(shard, framework="pt") as g:
                for k in g.keys():
                    sl = g.get_slice(k)
                    meta.append((k, tuple(sl.get_shape()), sl.get_dtype()))
        res["tensors"] = len(meta)
    elif op == "hf_load_shards":  # what transformers does for a state dict: load_file per shard, merged
        from safetensors.torch import load_file
        sd = {}
        for shard in hf_shards(f):
            sd.update(load_file(shard))
        tensors = list(sd.values())
    elif op == "hf_from_pretrained_sd":
        # from_pretrained's state-dict load of a safetensors shard set (transformers 5,
        # PreTrainedModel._load_pretrained_model and core_model_loading): safe_open(backend
        # "mmap") per shard, get_slice per key, then each slice materialized by [...] on the
        # loader's thread pool, with no device or dtype change (dtype "auto" on CPU). The
        # tensors stay views of the files' mappings (lazy); the common touch below maps
        # every page, as ckptool materialize --mmap does before it returns. Setting them on
        # the model's modules (setattr) is left out: the fixture has no model class.
        from concurrent.futures import ThreadPoolExecutor
        from safetensors import safe_open
        from transformers.core_model_loading import GLOBAL_WORKERS, spawn_materialize
        pointers, slices = [], {}
        for shard in hf_shards(f):
            fp = safe_open(shard, framework="pt", device="cpu", backend="mmap")
            pointers.append(fp)
            for k in fp.keys():
                slices[k] = fp.get_slice(k)
        with ThreadPoolExecutor(max_workers=GLOBAL_WORKERS) as pool:
            futures = [spawn_materialize(pool, sl) for sl in slices.values()]
            tensors = [fut.result() for fut in futures]
        lazy = time.perf_counter() - t0
    elif op == "dcp_load_full":  # empty full tensors from the metadata, then dcp.load without a process group
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata
        md = FileSystemReader(f).read_metadata()
        sd = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype) for k, v in md.state_dict_metadata.items()
              if isinstance(v, TensorStorageMetadata)}
        dcp.load(sd, checkpoint_id=f, no_dist=True)
        tensors = list(sd.values())
    elif op == "dcp_to_torch_save_load":  # PyTorch's converter to one file, then torch.load
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
        dcp_to_torch_save(f, args.out)
        sd = torch.load(args.out, weights_only=True)
        tensors = list(sd.values())
    # ---- S7: convert, as users do it in Python today (each writes its output with --fsync)
    elif op == "convert_st":  # torch.load + safetensors save_file
        from safetensors.torch import save_file
        sd = for_save_file(torch.load(f, weights_only=True))
        save_file(sd, args.out, metadata={"format": "pt"})
        res["tensors"] = len(sd)
    elif op == "convert_hf":  # torch.load + save_torch_state_dict (what save_pretrained writes)
        from huggingface_hub import save_torch_state_dict
        # for_save_file first: save_torch_state_dict would drop a strided view sharing a storage
        sd = for_save_file(torch.load(f, weights_only=True))
        res["tensors"] = len(sd)
        os.makedirs(args.out, exist_ok=True)
        save_torch_state_dict(sd, args.out, max_shard_size=args.max_shard_size)
    elif op == "dcp_resave_hf":  # dcp_to_torch_save, torch.load, save_torch_state_dict
        from huggingface_hub import save_torch_state_dict
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
        one = args.out + ".dcp.pt"
        dcp_to_torch_save(f, one)
        sd = torch.load(one, weights_only=True)
        os.unlink(one)
        res["tensors"] = len(sd)
        os.makedirs(args.out, exist_ok=True)
        save_torch_state_dict(sd, args.out, max_shard_size=args.max_shard_size)
    elif op == "dcp_consolidate_hf":  # PyTorch's own DCP (safetensors form) -> HF consolidation
        from torch.distributed.checkpoint._consolidate_hf_safetensors import consolidate_safetensors_files
        consolidate_safetensors_files(f, args.out, mapping)
        res["tensors"] = len(mapping)
    # ---- S5: load -> rename -> save
    # ---- S11: torch.export archives
    elif op == "list_export_load":  # torch.export.load, then list keys, shapes, dtypes
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = torch.export.load(f)
        listing = [(k, v.dtype, tuple(v.shape)) for k, v in ep.state_dict.items()]
        res["tensors"] = len(listing)
    elif op == "export_load":  # torch.export.load: every weight read into memory
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = torch.export.load(f)
        tensors = list(ep.state_dict.values())
    elif op == "rekey_torch":
        sd = torch.load(f, weights_only=True)
        sd = {k.replace("_orig_mod.", ""): v for k, v in sd.items()}
        torch.save(sd, args.out)
        res["tensors"] = len(sd)
    elif op == "rekey_torch_mmap":
        sd = torch.load(f, weights_only=True, mmap=True)
        sd = {k.replace("_orig_mod.", ""): v for k, v in sd.items()}
        torch.save(sd, args.out)
        res["tensors"] = len(sd)
    elif op == "rekey_st":
        from safetensors.torch import load_file, save_file
        sd = load_file(f)
        sd = {k.replace("_orig_mod.", ""): v for k, v in sd.items()}
        save_file(sd, args.out)
        res["tensors"] = len(sd)
    else:
        print(f"unknown op {op}", file=sys.stderr)
        return 2
    if args.fsync and args.out:
        fsync_tree(args.out)

    touch_s = None
    if tensors is not None:
        if cuda:
            torch.cuda.synchronize()
        else:
            t1 = time.perf_counter()
            touch_pages(tensors)
            touch_s = time.perf_counter() - t1
    t_end = time.perf_counter()
    io1, cpu1 = proc_io(), cpu_now()
    res["op_s"] = t_end - t0
    if lazy is not None:
        res["lazy_s"] = lazy
    if touch_s is not None:
        res["touch_s"] = touch_s
    res["cpu_s"] = cpu1 - cpu0
    for k in ("rchar", "read_bytes", "wchar", "write_bytes"):
        if k in io0 and k in io1:
            res[k] = io1[k] - io0[k]
    if tensors is not None:
        res["tensors"] = len(tensors)
        res["bytes"] = sum(s.nbytes() for s in unique_storages(tensors))
        if cuda:
            res["max_memory_allocated"] = torch.cuda.max_memory_allocated()
        if args.read_all and not cuda:
            t1 = time.perf_counter()
            read_all_bytes(tensors)
            res["read_all_s"] = time.perf_counter() - t1
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
