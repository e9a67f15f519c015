#!/usr/bin/env bash
# The GPU checks on a GPU host, from an archive of tests/gpu/pack.sh, in a checkout of the
# commit it was built from (the binaries carry absolute paths of the machine that built them,
# so the checkout is linked there):
#   tests/gpu/run_packed.sh ARCHIVE [OUT_DIR]
# Runs, each with a time limit: the gpu tests (what `ctest -L gpu` runs), the GPU benchmark,
# the integration suite's data-plane tests against a real server on the CUDA backend, then
# the gpu tests and a short benchmark again with an MPS control daemon when the driver has
# one. Prints everything and writes it, with the tests' XML, to OUT_DIR (default gpu-results).
# TESSERA_GPU_STAGES picks stages (default tests,bench,integration,mps); `host` runs the
# suite's tiny-op and noisy-neighbour scenarios (tessera_bench --quick --only=tiny,noisy) on
# this host's cores, on the CUDA backend and then the CPU backend: scenario 8 where the cores
# are not the floor they are on a 2-core build machine (docs/benchmarks.md). Separate calls
# fit a device session's 10-minute limit per command:
#   TESSERA_GPU_STAGES=host tests/gpu/run_packed.sh ARCHIVE OUT_DIR
set -uo pipefail
archive=$(realpath "$1")
out=$(realpath -m "${2:-gpu-results}")
cd "$(dirname "$0")/../.."
root=$PWD
mkdir -p "$out"
exec > >(tee "$out/log.txt") 2>&1
stage=$(mktemp -d)
tar -C "$stage" -xJf "$archive"
built_in=$(cat "$stage/build-dir")
# The binaries name their files by the build machine's absolute paths: put this checkout
# there when it is elsewhere (needs write access to that path's parent).
source_dir=$(strings "$stage/build/tests/tessera_gpu_tests" | grep -m1 -o '/[^ "]*/tests/gpu/gpu_test.cc' |
  sed 's|/tests/gpu/gpu_test.cc$||')
if [[ -n $source_dir && $source_dir != "$root" ]]; then
  mkdir -p "$(dirname "$source_dir")" && rm -rf "$source_dir" && ln -sfn "$root" "$source_dir"
fi
mkdir -p "$built_in" && cp -a "$stage/build/." "$built_in/"
cublas=$(ldconfig -p | awk '/libcublas.so.13 /{print $NF; exit}')
[[ -n $cublas ]] || cublas=$(find / -name libcublas.so.13 -not -path '/proc/*' 2>/dev/null | head -1)
nvrtc=$(find / -name libnvrtc.so.13 -not -path '/proc/*' 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$stage/lib:$(dirname "${cublas:-/x/x}"):$(dirname "${nvrtc:-/x/x}")
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
t() { local limit=$1; shift; echo; echo "=== $* (limit ${limit}s)"; local s=$SECONDS
  timeout -k 5 "$limit" "$@"; echo "=== exit $? after $((SECONDS - s)) s"; }
b=$built_in/tests
stages=",${TESSERA_GPU_STAGES:-tests,bench,integration,mps},"
has() { [[ $stages == *",$1,"* ]]; }
for s in ${stages//,/ }; do
  [[ $s =~ ^(tests|bench|integration|mps|host)$ ]] || echo "run_packed: unknown stage '$s' (tests, bench, integration, mps, host)" >&2
done
export CUDA_MPS_PIPE_DIRECTORY=$stage/no-mps
has tests && t 300 "$b/tessera_gpu_tests" --gtest_output="xml:$out/gpu_tests.xml"
has bench && t 180 "$b/tessera_gpu_bench" | tee "$out/bench.md"
if has bench; then  # the host's time per job, with each completion mode
  for completion in spin host_function; do
    t 60 env TESSERA_CUDA_MODULE="$built_in/lib/tessera/libtessera_cuda.so" \
      "$b/bench/tessera_submit_bench" --backend=cuda --completion=$completion --jobs=20000 |
      tee -a "$out/submit_bench.txt"
  done
fi
has integration && t 600 env TESSERA_TEST_BACKEND=cuda "$b/tessera_integration_tests" --gtest_brief=1 \
  --gtest_filter='ComputeTest.*:JobsTest.*:CatalogTest.*:UserKernelsTest.*:IsolationTest.*:BadRequestTest.*' \
  --gtest_output="xml:$out/integration_cuda.xml"
if has host; then
  nproc
  for backend in cuda cpu; do
    t 240 "$b/bench/tessera_bench" --quick --backend=$backend --only=tiny,noisy \
      --out="$out/host-$backend" | tee "$out/host-$backend.md"
  done
fi
if has mps && command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=$stage/mps-pipe CUDA_MPS_LOG_DIRECTORY=$stage/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d && sleep 1
  t 300 "$b/tessera_gpu_tests" --gtest_output="xml:$out/gpu_tests_mps.xml"
  t 120 "$b/tessera_gpu_bench" --quick | tee "$out/bench_mps.md"
  echo quit | nvidia-cuda-mps-control
fi
