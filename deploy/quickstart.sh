#!/usr/bin/env bash
# The README's two commands. Both install missing Debian packages and build first.
#   deploy/quickstart.sh serve [server flags...]   serve on 127.0.0.1:50051, state in ./var
#   deploy/quickstart.sh test  [ctest args...]     run the whole test suite
# $TESSERA_CUDA (AUTO by default) is passed to CMake: CI sets ON (.ci/run), so that a machine
# without the CUDA toolkit fails instead of building and testing everything but the CUDA parts.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

"$root/deploy/install-deps.sh"
jobs=$(nproc)
cmake --preset default --log-level=WARNING -DTESSERA_CUDA="${TESSERA_CUDA:-AUTO}" >/dev/null
cmake --build --preset default -j "$jobs"

case "${1:-}" in
  serve)
    shift
    exec "$root/build/server/tessera-server" "$@"
    ;;
  test)
    shift
    exec ctest --preset default -j "$jobs" "$@"
    ;;
  *)
    echo "usage: $0 serve [flags] | test [ctest args]" >&2
    exit 2
    ;;
esac
