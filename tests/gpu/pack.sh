#!/usr/bin/env bash
# Packs what the GPU checks need into one archive for a GPU host that has the NVIDIA driver
# and CUDA 13 but not this project's Debian libraries (a lent cloud machine, say):
#   tests/gpu/pack.sh [BUILD_DIR] [OUT]      defaults: build-ci, gpu-pack.tar.xz
# The archive holds BUILD_DIR's GPU test, GPU benchmark, benchmark suite, submit benchmark,
# integration test, server, CLI, kernel compiler and CUDA module at their paths inside the
# build tree, plus every shared library they need except the C and C++ runtimes and CUDA's
# own (the GPU host's are used).
# On the GPU host, from a checkout of the same commit: tests/gpu/run_packed.sh ARCHIVE.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-ci}
out=${2:-gpu-pack.tar.xz}
files=(tests/tessera_gpu_tests tests/tessera_gpu_bench tests/tessera_integration_tests tests/bench/tessera_bench
  tests/bench/tessera_submit_bench
  server/tessera-server server/tessera-kernel-compiler client/tessera lib/tessera/libtessera_cuda.so)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib"
for f in "${files[@]}"; do
  [[ -e $build/$f ]] || { echo "pack: $build/$f is missing (build the ci preset with TESSERA_CUDA=ON)" >&2; exit 1; }
  mkdir -p "$stage/build/$(dirname "$f")"
  cp -a "$build/$f" "$stage/build/$f"
done
for f in "${files[@]}"; do ldd "$build/$f"; done | awk '/=>/ && $3 ~ /^\// {print $3}' | sort -u |
  while read -r lib; do
    case $(basename "$lib") in
      libc.so* | libm.so* | libstdc++* | libgcc_s* | libdl.so* | libpthread* | librt.so* | \
        libcublas* | libcudart* | libnvrtc* | libcuda.so*) ;;
      *) cp -L "$lib" "$stage/lib/" ;;
    esac
  done
echo "$build" >"$stage/build-dir"
tar -C "$stage" -cJf "$out" .
echo "pack: $out ($(du -h "$out" | cut -f1)): ${#files[@]} binaries, $(ls "$stage/lib" | wc -l) libraries"
