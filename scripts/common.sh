# Shared by scripts/install.sh and scripts/install_ipex.sh (sourced; set TAG first).

as_root() { if [[ $EUID -eq 0 ]]; then "$@"; else sudo "$@"; fi; }
step() { printf '[%s] %s\n' "$TAG" "$*"; }
die() { printf '[%s] ERROR: %s\n' "$TAG" "$*" >&2; exit 1; }

# Fail before a long step that would run out of disk half-way with a pip or OSError traceback.
need_space() {
    local dir="$1" gb="$2" what="$3" free_kb
    free_kb="$(df -Pk "$dir" | awk 'NR == 2 {print $4}')"
    ((free_kb >= gb * 1000 * 1000)) \
        || die "$what needs ${gb} GB free in $dir, $((free_kb / 1000 / 1000)) GB left; free space there and rerun"
}

# pip, without its notes about index directories that do not list a package. (`|| true`: grep
# fails when it prints nothing, and pipefail must only see pip's status.) No cache: pip's would
# keep a second copy of every wheel downloaded (torch 2.8 and its CUDA libraries alone ~3.5 GB),
# which on a fresh machine left too little disk for the image build after it.
quiet_pip() {
    local pip="$1"
    shift
    "$pip" install --quiet --progress-bar off --no-cache-dir "$@" 2>&1 \
        | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}

# torch.backends.xeon.run_cpu looks for the exact names libjemalloc.so / libtcmalloc.so in
# $VIRTUAL_ENV/lib (among others) but never in Debian's multiarch directory.
link_allocators() {
    local venv="$1" name soname target cache
    # Read the cache whole first: awk stopping early in a pipe would SIGPIPE ldconfig, and
    # with pipefail that failed the install at random (exit 141).
    cache="$(ldconfig -p)"
    for name in jemalloc tcmalloc; do
        soname="$(awk -v n="lib${name}.so." '$1 ~ "^"n {print $NF; exit}' <<<"$cache")"
        [[ -n "$soname" ]] || die "lib${name} not found by ldconfig; run \`make install\` (it installs the apt package)"
        target="$venv/lib/lib${name}.so"
        ln -sfn "$soname" "$target"
        step "linked $target -> $soname"
    done
}
