#!/usr/bin/env bash
# What `make test` needs beyond `make install`: nginx, which the container's auth proxy
# (kit/proxy.py) runs and the e2e tests also start on the host in front of a served model; and
# Prometheus, which an e2e test starts against served models (its promtool checks the rules
# deploy/k8s ships). Installed without starting Debian's own services: the tests start theirs,
# on their ports.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TAG=test-tools
# shellcheck source=scripts/common.sh
source "$ROOT/scripts/common.sh"

packages=()
command -v nginx >/dev/null 2>&1 || [[ -x /usr/sbin/nginx ]] || packages+=(nginx-light)
command -v prometheus >/dev/null 2>&1 || packages+=(prometheus)
if ((${#packages[@]} == 0)); then
    step "nginx and prometheus present"
    exit 0
fi
start=$SECONDS
step "apt: installing ${packages[*]} (their services are not started)"
policy=/usr/sbin/policy-rc.d
had_policy=0
[[ -e "$policy" ]] && had_policy=1
if ((!had_policy)); then
    # Debian's maintainer scripts ask invoke-rc.d, which asks this, before starting a service: 101 = no.
    printf '#!/bin/sh\nexit 101\n' | as_root tee "$policy" >/dev/null
    as_root chmod +x "$policy"
fi
trap '((had_policy)) || as_root rm -f "$policy"' EXIT
as_root apt-get update -qq || die "apt-get update failed; check the package mirror"
DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null \
    || die "apt-get install ${packages[*]} failed"
step "${packages[*]} installed in $((SECONDS - start)) s"
