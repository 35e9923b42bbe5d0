#!/usr/bin/env bash
# Build .venv-ipex: torch 2.8.0 + Intel Extension for PyTorch 2.8.0 + TorchServe + the kit's
# handler dependencies, for the `ipex` backends. The main .venv is not touched.
#   bash scripts/install_ipex.sh     (what `make install-ipex` runs; needs `make install` first)
# Idempotent: a stamp file records the inputs' hash, so a second run returns at once.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$ROOT/.venv-ipex"
STAMP="$VENV/.kit-installed"
PYTHON="${PYTHON:-python3}"
TAG=install-ipex
# shellcheck source=scripts/common.sh
source "$ROOT/scripts/common.sh"

inputs_hash() {
    cat "$ROOT"/requirements/ipex*.txt "$0" "$ROOT/scripts/common.sh" | sha256sum | cut -d' ' -f1
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$(inputs_hash)" ]]; then
    step "up to date ($VENV); delete $STAMP to force a reinstall"
    exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    need_space "$ROOT" 6 "$VENV (torch 2.8 with its CUDA runtime libraries: 4.8 GB, and one wheel at a time while installing)"
    step "creating $VENV with $($PYTHON --version)"
    "$PYTHON" -m venv "$VENV"
fi
# cuDNN's kernel libraries (1 GB) are opened by libcudnn.so.9 only when a cuDNN operation runs on
# a GPU, and torch's CUDA linear algebra (0.1 GB) only by a linalg call on a GPU tensor; on the
# CPU nothing loads them (read from /proc/<pid>/maps after IPEX ran a model; the check below
# runs one). A fresh CI machine's disk is what ran out.
site="$(echo "$VENV"/lib/python3*/site-packages)"
remove_gpu_only() {
    local gpu_only=("$site"/nvidia/cudnn/lib/libcudnn_*.so.* "$site"/torch/lib/libtorch_cuda_linalg.so) present=()
    for file in "${gpu_only[@]}"; do
        if [[ -e "$file" ]]; then present+=("$file"); fi
    done
    ((${#present[@]})) || return 0
    step "  removing GPU-only libraries never loaded on the CPU ($(du -shc "${present[@]}" | tail -1 | cut -f1))"
    rm -f "${present[@]}"
}
step "pip: torch 2.8.0 (CUDA build, used on the CPU) + IPEX 2.8.0 + CUDA runtime libraries, --no-deps (~3.5 GB download)"
# One package per pip call: pip (without a cache) holds every wheel it downloads under TMPDIR until
# the last is installed, 3.7 GB at once for this list; one at a time, at most the largest (0.9 GB).
while read -r requirement; do
    quiet_pip "$VENV/bin/pip" --no-deps "$requirement" \
        || die "pip install of $requirement (requirements/ipex-torch.txt) failed; see the output above"
    remove_gpu_only
done < <(grep -v '^\s*\(#\|$\)' "$ROOT/requirements/ipex-torch.txt")
step "pip: TorchServe and the handlers' dependencies (pinned by requirements/ipex-constraints.txt);"
step "  pip may list torch's nvrtc/cusolver/nvtx/triton as 'dependency conflicts': left out on purpose"
quiet_pip "$VENV/bin/pip" -c "$ROOT/requirements/ipex-constraints.txt" -r "$ROOT/requirements/ipex.txt" \
    || die "pip install of requirements/ipex.txt failed; see the output above"
step "checking that IPEX imports with this torch"
"$VENV/bin/python" - <<'PY' || die "IPEX does not import in $VENV; delete it and run \`make install-ipex\` again"
import torch
assert torch.__version__.startswith("2.8."), torch.__version__
import intel_extension_for_pytorch as ipex
model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(288, 4))
# float32: IPEX's bf16 weight prepack refuses a CPU without AVX-512 (or AVX-NE-CONVERT), and an
# AVX2-only machine must still install it (its bf16 tests skip there, as the kit refuses bf16).
model = ipex.optimize(model.eval())
with torch.no_grad():
    assert model(torch.randn(2, 3, 8, 8)).shape == (2, 4)
print(f"[install-ipex] torch {torch.__version__}, IPEX {ipex.__version__}: ran a model")
PY
link_allocators "$VENV"
inputs_hash >"$STAMP"
step "done: $VENV ($(du -sh "$VENV" | cut -f1))"
