#!/usr/bin/env bash
# Install everything the kit needs: system packages, the .venv, allocator links.
#   bash scripts/install.sh          (what `make install` runs)
# Idempotent: a stamp file records the inputs' hash, so a second run returns at once.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$ROOT/.venv"
STAMP="$VENV/.kit-installed"
PYTHON="${PYTHON:-python3}"
APT_PACKAGES=(apache2-utils libjemalloc2 libgoogle-perftools4 numactl)

TAG=install
# shellcheck source=scripts/common.sh
source "$ROOT/scripts/common.sh"

inputs_hash() {
    cat "$ROOT/requirements/main.txt" "$ROOT/requirements/constraints.txt" "$0" "$ROOT/scripts/common.sh" \
        | sha256sum | cut -d' ' -f1
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$(inputs_hash)" && -f "$ROOT/client/grpc_stubs/inference_pb2.py" ]]; then
    step "up to date ($VENV); delete $STAMP to force a reinstall"
    exit 0
fi

install_system_packages() {
    local missing=()
    for pkg in "${APT_PACKAGES[@]}"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    # TorchServe's frontend is Java; any JRE >= 11 will do, so only install one when none runs.
    java -version >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
    if ((${#missing[@]})); then
        step "apt: installing ${missing[*]}"
        as_root apt-get update -qq || die "apt-get update failed; check the package mirror"
        DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null \
            || die "apt-get install ${missing[*]} failed"
    else
        step "apt: all system packages present"
    fi
}

create_venv() {
    if [[ ! -x "$VENV/bin/python" ]]; then
        need_space "$ROOT" 3 "$VENV (torch, TorchServe, OpenVINO, ONNX Runtime: ~2 GB)"
        step "creating $VENV with $($PYTHON --version)"
        "$PYTHON" -m venv "$VENV"
    fi
    step "pip: installing requirements/main.txt (torch pinned by requirements/constraints.txt)"
    quiet_pip "$VENV/bin/pip" -c "$ROOT/requirements/constraints.txt" -r "$ROOT/requirements/main.txt" \
        || die "pip install failed; see the output above"
    "$VENV/bin/python" - <<'EOF' || die "torch in .venv is not the pinned 2.13.0 CPU build"
import torch
assert torch.__version__.startswith("2.13.0"), torch.__version__
assert not torch.version.cuda, f"CUDA build installed: {torch.version.cuda}"
EOF
}

# Python stubs of TorchServe's gRPC APIs, from the protos its frontend jar carries (the exact
# 0.12.0 API), for `python -m client --grpc` and the tests: client/grpc_stubs/ (not committed).
generate_grpc_stubs() {
    local jar protos out="$ROOT/client/grpc_stubs"
    jar="$("$VENV/bin/python" -c 'import ts, pathlib; print(pathlib.Path(ts.__file__).parent / "frontend/model-server.jar")')"
    protos="$(mktemp -d)"
    mkdir -p "$protos/client/grpc_stubs"
    "$VENV/bin/python" - "$jar" "$protos/client/grpc_stubs" <<'PY' || die "cannot read the protos in $jar"
import sys, zipfile
jar, out = sys.argv[1:]
with zipfile.ZipFile(jar) as archive:
    for name in ("inference.proto", "management.proto"):
        open(f"{out}/{name}", "wb").write(archive.read(f"proto/{name}"))
PY
    # Under client/grpc_stubs/ in protoc's path: the generated imports are then package-relative.
    "$VENV/bin/python" -m grpc_tools.protoc -I "$protos" -I "$("$VENV/bin/python" -c \
        'import google.rpc, pathlib; print(pathlib.Path(list(google.rpc.__path__)[0]).parent.parent)')" \
        --python_out="$ROOT" --grpc_python_out="$ROOT" \
        "$protos/client/grpc_stubs/inference.proto" "$protos/client/grpc_stubs/management.proto" \
        || die "grpc_tools.protoc failed on TorchServe's protos"
    touch "$out/__init__.py"
    rm -rf "$protos"
    step "gRPC stubs generated in $out"
}

install_system_packages
create_venv
link_allocators "$VENV"
generate_grpc_stubs
inputs_hash >"$STAMP"
step "done: $VENV"
