#!/usr/bin/env bash
# Checks deploy/: the systemd units with `systemd-analyze verify` (in a scratch root that has
# stand-ins for the NVIDIA tools and the installed server, which this machine lacks; any
# warning fails), the Kubernetes manifests with yamllint and tests/deploy/check_manifests.py.
# The container image is not built here (no container engine on CI).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

mkdir -p "$scratch"/{usr/bin,usr/local/bin,bin,etc/systemd/system,usr/lib/systemd}
for tool in usr/bin/nvidia-smi usr/bin/nvidia-cuda-mps-control usr/local/bin/tessera-server; do
  printf '#!/bin/sh\nexit 0\n' >"$scratch/$tool"
  chmod +x "$scratch/$tool"
done
cp /bin/sh "$scratch/bin/sh"
cp -r /usr/lib/systemd/system "$scratch/usr/lib/systemd/"
cp "$root"/deploy/systemd/*.service "$scratch/etc/systemd/system/"
units=$(cd "$root/deploy/systemd" && ls *.service)
out=$(systemd-analyze verify --root="$scratch" $units 2>&1) || {
  echo "$out" >&2
  echo "systemd-analyze verify failed" >&2
  exit 1
}
if [[ -n $out ]]; then
  echo "$out" >&2
  echo "systemd-analyze verify warned" >&2
  exit 1
fi
echo "systemd units ok: $units"

yamllint -d '{extends: default, rules: {line-length: {max: 100}, document-start: disable}}' \
  "$root"/deploy/kubernetes/*.yaml
python3 "$root/tests/deploy/check_manifests.py" "$root/deploy/kubernetes"
