#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then builds and runs a separate project
# that finds the client with find_package(tessera).
set -euo pipefail
build_dir=$1
source_dir=$(cd "$(dirname "$0")" && pwd)/consumer
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" > "$work/install.log"
test -f "$work/prefix/include/tessera/client.h"
test -f "$work/prefix/include/tessera/v1/tenant_admin.grpc.pb.h"
test -x "$work/prefix/bin/tessera-server"
test -x "$work/prefix/bin/tessera"
cmake -S "$source_dir" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log"
cmake --build "$work/build" > "$work/build.log"
"$work/build/consumer"
