#!/usr/bin/env bash
# Fails when a C++ or proto source differs from the repository's .clang-format style.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v clang-format >/dev/null || { echo "clang-format not installed"; exit 77; }
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' '*.proto')
else
  mapfile -t files < <(find client kernels proto server tests -name '*.cc' -o -name '*.h' -o -name '*.proto')
fi
# One clang-format process for every file (a process per file cost a minute, nearly all of
# it starting clang-format); only when that fails is each file checked to name the culprits.
existing=()
for f in "${files[@]}"; do [[ -f $f ]] && existing+=("$f"); done
if printf '%s\0' "${existing[@]}" | xargs -0 clang-format --dry-run -Werror >/dev/null 2>&1; then
  echo "${#existing[@]} files clang-formatted"
  exit 0
fi
bad=()
for f in "${existing[@]}"; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
echo "not clang-formatted (run clang-format -i on them):"
printf '  %s\n' "${bad[@]}"
exit 1
