#!/usr/bin/env bash
# The README's two commands. Both install missing Debian packages and build first.
#   deploy/quickstart.sh serve [server flags...]   serve on 127.0.0.1:50051, state in ./var
#   deploy/quickstart.sh test  [ctest args...]     run the whole test suite
# $TESSERA_PRESET (default: default) is the CMake preset (CMakePresets.json) to build and test:
# CI sets ci, a Release build in build-ci (.ci/run). $TESSERA_CUDA, when set, is passed to CMake
# (AUTO when neither it nor the preset says): CI sets ON, so that a machine without the CUDA
# toolkit fails instead of building and testing everything but the CUDA parts.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

preset=${TESSERA_PRESET:-default}
build_dir=$root/build  # every other preset builds in build-<name>
[[ $preset == default ]] || build_dir=$root/build-$preset
cuda=()
[[ -n ${TESSERA_CUDA:-} ]] && cuda=(-DTESSERA_CUDA="$TESSERA_CUDA")

"$root/deploy/install-deps.sh"
jobs=$(nproc)
cmake --preset "$preset" --log-level=WARNING "${cuda[@]}" >/dev/null
cmake --build --preset "$preset" -j "$jobs"

case "${1:-}" in
  serve)
    shift
    # Clients on this machine reach the server over a Unix socket too (regions: tensors at
    # memory speed), unless the caller names their own.
    unix=()
    if [[ " $* " != *" --unix_socket="* ]]; then
      socket=$root/var/tessera.sock
      ((${#socket} <= 99)) || socket=var/tessera.sock  # sun_path holds 107 bytes with ".regions"
      mkdir -p "$root/var"
      unix=(--unix_socket="$socket")
    fi
    # OpenBLAS starts one thread, not a spinning pool per core (docs/operations.md).
    export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
    exec "$build_dir/server/tessera-server" "${unix[@]}" "$@"
    ;;
  test)
    shift
    # Twice as many tests as cores: much of the suite's time is spent waiting (on deadlines,
    # restarts, other processes), which the other tests fill; tests/README.md.
    exec ctest --preset "$preset" -j "$((jobs * 2))" "$@"
    ;;
  *)
    echo "usage: $0 serve [flags] | test [ctest args]" >&2
    exit 2
    ;;
esac
