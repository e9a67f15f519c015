#!/usr/bin/env bash
# Installs every Debian 12 package Tessera's build, server and tests need. Idempotent and
# quiet when everything is present. Run as root (or with sudo available).
set -euo pipefail

packages=(
  # toolchain
  g++ cmake ninja-build pkg-config clang-format
  # libraries
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev libsqlite3-dev libssl-dev libeigen3-dev libopenblas-dev
  prometheus-cpp-dev libcli11-dev libtcmalloc-minimal4
  # the fleet's store: etcd's v3 .proto files (compiled into the server) and etcd itself
  # (tests start it on loopback)
  golang-etcd-server-dev etcd-server
  # tests (systemd-analyze and yamllint check deploy/; promtool checks a live /metrics scrape
  # and curl scrapes it over mutual TLS; clang builds the libFuzzer targets)
  libgtest-dev libgmock-dev openssl curl systemd yamllint prometheus clang libclang-rt-dev
  # the Python client (client/python) and its tests
  python3-grpcio python3-protobuf python3-numpy python3-pytest
  # the headers of tessera._native, the package's transfers through the C++ client library
  python3-dev
)
# --bench: also what the benchmark suite needs (tests/bench/run.sh): its plots.
if [[ ${1:-} == --bench ]]; then
  packages+=(gnuplot-nox)
fi
# npm installs buf for the proto contract check (tests/api/check_proto.sh). Debian's nodejs
# and npm only when no npm is on PATH: a NodeSource nodejs ships its own npm, and Debian's npm
# package conflicts with it.
command -v npm >/dev/null || packages+=(nodejs npm)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ $status == "install ok installed" ]] || missing+=("$p")
done
((${#missing[@]} == 0)) && exit 0

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: need root to install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
