#!/usr/bin/env bash
# Builds ckptool (installing what is missing), then runs it on the embedded samples the
# way a new user would: what is inside a Lightning checkpoint of a torch.compile'd model,
# stripping its `_orig_mod.` segments, and loading its weights into the plain (scripted)
# model without any manual key fixing.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >/dev/null
ckptool=build/ckptool
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

show() {
  echo
  echo "\$ ckptool $*"
  "$ckptool" "$@"
}

# 1. What is in the file, and why it will not load into the uncompiled model.
show inspect samples/compiled_lightning.ckpt
show inspect samples/compiled_lightning.ckpt --tree
# 2. A TorchScript model: structure and method schemas, shapes inferred on the meta device.
show inspect samples/scripted.pt --input 2x6:int64
# 3. Make the compiled checkpoint load into an uncompiled model.
show rekey samples/compiled_lightning.ckpt -o "$work/uncompiled.ckpt" --strip-compiled
# 4. Or let ckptool find the edit itself, fill the scripted model's skeleton, and run it.
show materialize samples/compiled_lightning.ckpt --device cpu --model samples/scripted.pt \
  --run evaluation_step --input 4x6:int64 --input 4:int64 -o "$work/filled.pt"
# 5. Any checkpoint's tensors, straight into memory (safetensors here).
show materialize samples/model.safetensors --device cpu --check-finite
echo
echo "\$ ckptool inspect samples/plain.pt --json | head -20"
"$ckptool" inspect samples/plain.pt --json | head -20
