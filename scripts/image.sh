#!/usr/bin/env bash
# Build the kit's container image (what `make image` runs):
#   bash scripts/image.sh [--context-only]
#   bash scripts/image.sh --remove    (IMAGE, the local base, build cache and build/: what make test LEAN=1 runs)
# Environment: IMAGE (tag), VARIANTS (archives inside, comma list), MODELS (whose archives, comma
# list; empty = every archive of those variants), BASE (base image; empty =
# a Debian bookworm base bootstrapped here from Debian's packages), BUILDER (podman | docker).
# Stages build/image/ (the kit's sources, a wheelhouse of the pinned packages, the archives),
# then builds Containerfile on it, and prints the build time and the image's size.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
IMAGE="${IMAGE:?set IMAGE, or run make image}"
MODELS="${MODELS:-}"
BASE="${BASE:-}"
BUILDER="${BUILDER:-podman}"
# The locally bootstrapped base, for machines that reach Debian's mirror but no image registry.
LOCAL_BASE="localhost/kit-base:bookworm"
CONTEXT="$ROOT/build/image"
WHEELS="$ROOT/build/wheels"
SOURCES=(kit handlers client config requirements scripts/common.sh model_store/__init__.py model_store/lm_compile.py)

TAG=image
# shellcheck source=scripts/common.sh
source "$ROOT/scripts/common.sh"

install_tools() {
    local missing=() tool
    for tool in podman buildah mmdebstrap; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    if [[ "$BUILDER" == podman && ${#missing[@]} -gt 0 ]]; then
        step "apt: installing ${missing[*]}"
        as_root apt-get update -qq || die "apt-get update failed; check the package mirror"
        DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" uidmap >/dev/null \
            || die "apt-get install ${missing[*]} failed"
    fi
}

wheelhouse() {
    local stamp="$WHEELS/.inputs" hash
    hash="$(cat "$ROOT/requirements/image.txt" "$ROOT/requirements/constraints.txt" | sha256sum | cut -d' ' -f1)"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$hash" ]]; then
        step "wheelhouse up to date ($WHEELS)"
        return
    fi
    step "wheelhouse: downloading the pinned packages of requirements/image.txt into $WHEELS"
    rm -rf "$WHEELS"
    "$ROOT/.venv/bin/pip" download --quiet --progress-bar off --no-cache-dir -d "$WHEELS" \
        -c "$ROOT/requirements/constraints.txt" -r "$ROOT/requirements/image.txt" 2>&1 \
        | { grep -v "is ignored: it is neither a file nor a directory" || true; }
    echo "$hash" >"$stamp"
}

stage_context() {
    local variant
    rm -rf "$CONTEXT"
    mkdir -p "$CONTEXT/model_store"
    # Hard links: staging costs no copy. Untracked files count too (a change not yet committed).
    (cd "$ROOT" && git ls-files --cached --others --exclude-standard -z -- "${SOURCES[@]}" \
        | xargs -0 cp --parents --link -t "$CONTEXT")
    cp "$ROOT/Containerfile" "$CONTEXT/"
    cp -r --link "$WHEELS" "$CONTEXT/wheels"
    local model
    for variant in ${VARIANTS//,/ }; do
        [[ -d "$ROOT/model_store/$variant" ]] || die "model_store/$variant is not built; run make archive VARIANTS=$variant"
        if [[ -z "$MODELS" ]]; then
            cp -r --link "$ROOT/model_store/$variant" "$CONTEXT/model_store/"
            continue
        fi
        mkdir -p "$CONTEXT/model_store/$variant"
        for model in ${MODELS//,/ }; do
            [[ -f "$ROOT/model_store/$variant/$model/MAR-INF/MANIFEST.json" ]] \
                || die "model_store/$variant/$model is not built; run make archive VARIANTS=$variant MODELS=$model"
            cp -r --link "$ROOT/model_store/$variant/$model" "$CONTEXT/model_store/$variant/"  # the archive
            for footprint in "$ROOT/model_store/$variant/$model".*footprint.json; do  # and its footprints
                if [[ -f "$footprint" ]]; then cp --link "$footprint" "$CONTEXT/model_store/$variant/"; fi
            done
        done
    done
    # Footprints recorded here (kit/footprint.py) go along: the container's plan fits them into its
    # memory limit. One never measured leaves that model's memory unplanned in the container.
    local manifest archive unmeasured=()
    for manifest in "$CONTEXT"/model_store/*/*/MAR-INF/MANIFEST.json; do
        archive="${manifest%/MAR-INF/MANIFEST.json}"
        [[ -f "$archive.footprint.json" ]] || unmeasured+=("$(basename "$(dirname "$archive")")/$(basename "$archive")")
    done
    if ((${#unmeasured[@]})); then
        step "no memory footprint measured for ${unmeasured[*]}: the container cannot fit them to its memory limit (make serve VARIANT=... here first, then make image, takes the footprints along)"
    fi
    step "context $CONTEXT: $(du -sh --apparent-size "$CONTEXT" | cut -f1) (variants: $VARIANTS; models: ${MODELS:-all})"
}

local_base() {
    if podman image exists "$LOCAL_BASE"; then
        step "base $LOCAL_BASE present"
        return
    fi
    step "bootstrapping $LOCAL_BASE from Debian's packages (mmdebstrap, ~20 s)"
    local tar="$ROOT/build/rootfs.tar"
    mmdebstrap --quiet --variant=minbase bookworm "$tar" || die "mmdebstrap failed; check the Debian mirror"
    podman import --quiet "$tar" "$LOCAL_BASE" >/dev/null
    rm -f "$tar"
}

# Where the build's temporaries go: podman stages each layer it commits under TMPDIR (/var/tmp by
# default), 2.9 GB at the build's peak on top of the layers themselves. In memory (/dev/shm) when
# it has room for them and the machine has memory to spare, the disk needs that much less.
build_tmpdir() {
    local shm_free_kb available_kb
    shm_free_kb="$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}')"
    available_kb="$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)"
    if ((${shm_free_kb:-0} >= 4 * 1000 * 1000 && ${available_kb:-0} >= 8 * 1000 * 1000)); then
        mktemp -d /dev/shm/kit-image-build.XXXXXX
    else
        echo "${TMPDIR:-/var/tmp}"
    fi
}

build() {
    local base="${BASE:-$LOCAL_BASE}" start=$SECONDS previous tmp
    [[ -n "$BASE" ]] || local_base
    previous="$("$BUILDER" image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)"
    tmp="$(build_tmpdir)"
    step "building $IMAGE from $base with $BUILDER (temporaries in $tmp)"
    if [[ "$BUILDER" == podman ]]; then
        # --isolation=chroot: this sandbox cannot create the namespaces of podman's default
        # (OCI) isolation; where they exist, ISOLATION=oci builds the same image.
        TMPDIR="$tmp" podman build --quiet --isolation="${ISOLATION:-chroot}" --build-arg BASE="$base" -t "$IMAGE" \
            -f "$CONTEXT/Containerfile" "$CONTEXT" >/dev/null || die "podman build failed; see the output above"
        [[ "$tmp" == /dev/shm/* ]] && rm -rf "$tmp"
    else
        docker build --build-arg BASE="$base" -t "$IMAGE" "$CONTEXT" || die "docker build failed"
    fi
    local bytes
    bytes="$("$BUILDER" image inspect --format '{{.Size}}' "$IMAGE")"
    # The image this tag named before is left untagged, and each rebuild would keep its changed
    # layers (the archives' alone ~0.6 GB). Refused while a container still runs it: then it stays.
    if [[ -n "$previous" && "$previous" != "$("$BUILDER" image inspect --format '{{.Id}}' "$IMAGE")" ]]; then
        "$BUILDER" rmi "$previous" >/dev/null 2>&1 || true
    fi
    step "built $IMAGE in $((SECONDS - start)) s: $((bytes / 1000 / 1000)) MB"
}

# After the tests' container part (make test LEAN=1): the tag, the base it was built on, the
# build's cached intermediate images (dangling once the tag is gone) and build/ (the wheelhouse).
remove() {
    local before
    before="$(df -Pk "$ROOT" | awk 'NR == 2 {print $4}')"
    if command -v "$BUILDER" >/dev/null; then
        "$BUILDER" rmi --force "$IMAGE" "$LOCAL_BASE" >/dev/null 2>&1 || true
        "$BUILDER" image prune --force >/dev/null 2>&1 || true
    fi
    rm -rf "$CONTEXT" "$WHEELS"
    step "removed $IMAGE, $LOCAL_BASE, the build's cache and build/: $(( ($(df -Pk "$ROOT" | awk 'NR == 2 {print $4}') - before) / 1000 )) MB freed"
}

[[ "${1:-}" == --remove ]] && { remove; exit 0; }
VARIANTS="${VARIANTS:?set VARIANTS (comma list), or run make image}"
# Measured from an empty image store: 7.1 GB used at the build's peak (wheelhouse, the base's root
# file system, the layers and the build container holding the same files), 2.9 GB after it.
need_space "$ROOT" 8 "the image build (wheelhouse, context and image layers)"
wheelhouse
stage_context
[[ "${1:-}" == --context-only ]] && exit 0
install_tools
build
