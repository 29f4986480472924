#!/usr/bin/env bash
# Builds ckptool (installing what is missing), then runs it on the embedded samples the
# way a new user would: what is inside a Lightning checkpoint of a compiled model, a
# safetensors file, and a TorchScript model (shapes inferred on the meta device).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >/dev/null
ckptool=build/ckptool

show() {
  echo
  echo "\$ ckptool $*"
  "$ckptool" "$@"
}

show inspect samples/compiled_lightning.ckpt
show inspect samples/compiled_lightning.ckpt --tree --filter 'state_dict*'
show inspect samples/model.safetensors
show inspect samples/scripted.pt --input 2x8
echo
echo "\$ ckptool inspect samples/plain.pt --json | head -20"
"$ckptool" inspect samples/plain.pt --json | head -20
