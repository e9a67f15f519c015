#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then builds and runs a separate project
# that finds the client with find_package(tessera).
set -euo pipefail
build_dir=$1
sanitize=${2:-}  # the build's TESSERA_SANITIZE: the consumer must link the same runtime
source_dir=$(cd "$(dirname "$0")" && pwd)/consumer
work=$(mktemp -d)
trap 'status=$?; ((status)) && tail -n 30 "$work"/*.log 2>/dev/null; rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" > "$work/install.log"
test -f "$work/prefix/include/tessera/client.h"
test -f "$work/prefix/include/tessera/v1/tenant_admin.grpc.pb.h"
test -x "$work/prefix/bin/tessera-server"
test -x "$work/prefix/bin/tessera"
flags=()
[[ -n $sanitize ]] && flags=(-DCMAKE_CXX_FLAGS="-fsanitize=$sanitize" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=$sanitize")
cmake -S "$source_dir" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" "${flags[@]}" \
  > "$work/configure.log"
cmake --build "$work/build" > "$work/build.log"
"$work/build/consumer"
