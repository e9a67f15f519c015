#!/usr/bin/env bash
# Runs the libFuzzer targets, one after another, for SECONDS each (docs/fuzzing.md):
#
#   tests/fuzz/run.sh [SECONDS] [TARGET...]      (default: 60 s, every target)
#
# Configures and builds build-fuzz (clang, TESSERA_FUZZ=ON; $TESSERA_FUZZ_BUILD overrides the
# directory) when needed. Each target reads its seeds in tests/fuzz/corpus/TARGET (never
# writing there); what it finds goes to BUILD/fuzz/corpus/TARGET, crash inputs to
# BUILD/fuzz/artifacts/TARGET/, its output to BUILD/fuzz/TARGET.log. Prints, per target, the
# executions, executions per second and the result; exits 1 if any target found something.
# Extra libFuzzer flags: $FUZZ_FLAGS (e.g. FUZZ_FLAGS="-jobs=2" or "-only_ascii=1").
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${TESSERA_FUZZ_BUILD:-$root/build-fuzz}
seconds=${1:-60}
[[ $# -gt 0 ]] && shift
all=(admin_request compute_request define_kernel kernel_source npy token state_store cli_attr)
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=("${all[@]}")

# ---- Build -----------------------------------------------------------------------------------
if ! grep -q '^TESSERA_FUZZ:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DTESSERA_CUDA=OFF \
    -DTESSERA_FUZZ=ON -DTESSERA_SANITIZE=address,undefined,fuzzer-no-link
fi
build_targets=()
for t in "${targets[@]}"; do build_targets+=("tessera_fuzz_$t"); done
nice -n 10 cmake --build "$build" --target "${build_targets[@]}"

# ---- Run -------------------------------------------------------------------------------------
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1:handle_abort=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
out=$build/fuzz
found=0
summary=()
for t in "${targets[@]}"; do
  bin=$(find "$build" -name "${t}_fuzz" -type f -perm -u+x | head -n 1)
  [[ -n $bin ]] || { echo "no binary for $t" >&2; exit 2; }
  mkdir -p "$out/corpus/$t" "$out/artifacts/$t"
  flags=(-max_total_time="$seconds" -print_final_stats=1 -timeout=25 -rss_limit_mb=2048
    -artifact_prefix="$out/artifacts/$t/")
  [[ -f $root/tests/fuzz/$t.dict ]] && flags+=(-dict="$root/tests/fuzz/$t.dict")
  # shellcheck disable=SC2206
  flags+=(${FUZZ_FLAGS:-})
  echo "== $t: ${seconds}s (log: $out/$t.log)"
  before=$(ls "$out/artifacts/$t" | wc -l)
  set +e
  nice -n 10 "$bin" "${flags[@]}" "$out/corpus/$t" "$root/tests/fuzz/corpus/$t" >"$out/$t.log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/$t.log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$out/$t.log" | tail -n 1)
  result=ok
  if [[ $rc -ne 0 ]] || [[ $(ls "$out/artifacts/$t" | wc -l) -ne $before ]]; then
    found=1
    crash=$(ls -t "$out/artifacts/$t" | head -n 1)
    result="FOUND (exit $rc): $out/artifacts/$t/$crash"
    grep -m 3 -E '^==[0-9]+==ERROR|^SUMMARY|runtime error|==fuzz==|ERROR: libFuzzer' \
      "$out/$t.log" || true
  fi
  summary+=("$(printf '%-16s %6ss  %12s execs  %8s exec/s  %s' "$t" "$seconds" "${execs:-?}" \
    "${rate:-?}" "$result")")
done
echo
printf '%s\n' "${summary[@]}"
exit $found
