#!/usr/bin/env bash
# `cmake --install` of a build tree, checked end to end: installs it into a temporary prefix,
# checks the layout (below), starts the installed server and asks it with the installed CLI,
# builds a separate project against the installed client with find_package(tessera) and has it
# call the server, and, when the CUDA module was built, starts the installed server on the
# installed module (over the build tree's fake driver).
#   check_install.sh BUILD_DIR [SANITIZERS]   (SANITIZERS: the build's TESSERA_SANITIZE)
set -euo pipefail
build_dir=$(cd "$1" && pwd)
sanitize=${2:-}  # the consumer must link the same sanitizer runtime as the library
source_dir=$(cd "$(dirname "$0")" && pwd)/consumer
work=$(mktemp -d)
prefix=$work/prefix
server_pid=
cleanup() {
  local status=$?
  if [[ -n $server_pid ]]; then kill "$server_pid" 2>/dev/null && wait "$server_pid" || true; fi
  ((status)) && tail -n 30 "$work"/*.log 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "check_install: $*" >&2
  exit 1
}

cmake --install "$build_dir" --prefix "$prefix" >"$work/install.log"
cache() { sed -n "s/^$1:[A-Z]*=//p" "$build_dir/CMakeCache.txt"; }
libdir=$(cache CMAKE_INSTALL_LIBDIR)
unitdir=$(cache TESSERA_SYSTEMD_UNIT_DIR)
docdir=share/doc/tessera
[[ -n $libdir && -n $unitdir ]] || fail "CMAKE_INSTALL_LIBDIR or TESSERA_SYSTEMD_UNIT_DIR not in the cache"

# ---- Layout ----------------------------------------------------------------------------------
expect() {  # expect -f|-x PATH...: installed (and executable with -x)
  local test=$1
  shift
  for path in "$@"; do
    test "$test" "$prefix/$path" || fail "not installed (test $test): $path"
  done
}
expect -x bin/tessera-server bin/tessera
expect -f include/tessera/client.h \
  include/tessera/v1/{tenant_admin,compute}.pb.h include/tessera/v1/{tenant_admin,compute}.grpc.pb.h \
  "$libdir"/libtessera_client.a "$libdir"/libtessera_proto.a \
  "$libdir"/cmake/tessera/{tesseraConfig,tesseraConfigVersion,tesseraTargets}.cmake \
  share/tessera/proto/tessera/v1/{tenant_admin,compute}.proto \
  "$unitdir"/tessera.service "$unitdir"/nvidia-mps.service \
  "$docdir"/{README,operations,mps,api,architecture,kernels,python,benchmarks}.md
cuda_module=$build_dir/lib/tessera/libtessera_cuda.so
if [[ -f $cuda_module ]]; then
  expect -f "$libdir"/tessera/libtessera_cuda.so
  expect -x bin/tessera-kernel-compiler
fi
# Nothing from the test suite: no fake driver, cuBLAS or compiler, no test binaries.
if stray=$(cd "$prefix" && find . -type f \( -name '*fake*' -o -name '*test*' -o -name 'libcu*' \)) &&
  [[ -n $stray ]]; then
  fail "test files installed: $stray"
fi
# The installed unit runs the installed server and points at the installed documentation.
unit=$prefix/$unitdir/tessera.service
grep -q "^ExecStart=$prefix/bin/tessera-server " "$unit" || fail "$unit: ExecStart is not $prefix/bin/tessera-server"
grep -q "^Documentation=file://$prefix/$docdir/operations.md$" "$unit" ||
  fail "$unit: Documentation is not $prefix/$docdir/operations.md"
if grep -q /usr/local "$unit"; then fail "$unit still names /usr/local"; fi

# ---- The installed server answers the installed CLI and a find_package(tessera) consumer -----
# start_server NAME ARGS...: runs the installed server on a free loopback port, in the
# background ($server_pid); sets $address once it serves.
start_server() {
  local name=$1
  shift
  "$prefix/bin/tessera-server" --listen=127.0.0.1:0 --state_dir="$work/state-$name" \
    --deadlock_detection=abort "$@" >"$work/server-$name.log" 2>&1 &
  server_pid=$!
  local port=
  for _ in $(seq 600); do  # 60 s: sanitizer builds start slowly
    port=$(sed -n 's/^tessera-server listening on 127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$work/server-$name.log")
    [[ -n $port ]] && break
    kill -0 "$server_pid" 2>/dev/null || fail "the installed server ($name) exited: $(cat "$work/server-$name.log")"
    sleep 0.1
  done
  [[ -n $port ]] || fail "the installed server ($name) did not start within 60 s"
  address=127.0.0.1:$port
  token_file=$work/state-$name/admin.token
}
stop_server() {
  kill -TERM "$server_pid"
  wait "$server_pid" || fail "the installed server did not exit 0 on SIGTERM"
  server_pid=
}

start_server cpu --backend=cpu
TESSERA_ADDR=$address TESSERA_TOKEN=$(cat "$token_file") "$prefix/bin/tessera" server info \
  >"$work/cli.log" 2>&1 || fail "the installed CLI could not ask the installed server"
grep -q '^backend: *cpu' "$work/cli.log" || fail "unexpected server info: $(cat "$work/cli.log")"

flags=()
[[ -n $sanitize ]] && flags=(-DCMAKE_CXX_FLAGS="-fsanitize=$sanitize" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=$sanitize")
cmake -S "$source_dir" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" "${flags[@]}" \
  >"$work/configure.log"
cmake --build "$work/consumer" >"$work/build.log"
"$work/consumer/consumer" "$address" "$token_file"
stop_server

# ---- The installed server loads the installed CUDA module ------------------------------------
# Over the build tree's fake driver and cuBLAS (tests/fake_cuda/driver), which are not
# installed: proves that the server finds the module where the install put it.
fake_cuda=$build_dir/tests/fake_cuda
if [[ -f $cuda_module && -f $fake_cuda/libcuda.so.1 ]]; then
  unset TESSERA_CUDA_MODULE  # the server must find it by itself
  LD_LIBRARY_PATH=$fake_cuda start_server cuda --backend=cuda --mps=off
  TESSERA_ADDR=$address TESSERA_TOKEN=$(cat "$token_file") "$prefix/bin/tessera" server info \
    >"$work/cli.log" 2>&1 || fail "the installed CLI could not ask the installed server (cuda)"
  grep -q '^backend: *cuda' "$work/cli.log" || fail "unexpected server info: $(cat "$work/cli.log")"
  stop_server
  echo "check_install: the installed server runs the installed CUDA module (fake driver)"
fi
echo "check_install: installed tree complete; server, CLI and find_package(tessera) consumer work"
