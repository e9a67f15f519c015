#!/usr/bin/env bash
# Runs the benchmark suite: installs what it needs (deploy/install-deps.sh --bench), builds,
# runs tessera_bench against a fresh loopback server and echo baseline, writes JSON, Markdown
# and PNG plots into docs/benchmarks/ and refreshes the results in docs/benchmarks.md.
#   tests/bench/run.sh [--quick] [--backend=cpu|cuda|auto] [--only=...] [--server_arg=FLAG ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
./deploy/install-deps.sh --bench
cmake --preset default --log-level=WARNING >/dev/null
cmake --build --preset default --target tessera-server tessera_bench
./build/tests/bench/tessera_bench --out=docs/benchmarks --doc=docs/benchmarks.md "$@"
gnuplot -e "dir='docs/benchmarks'" tests/bench/plots.gp
echo "bench: results in docs/benchmarks/ (results.json, results.md, *.png) and docs/benchmarks.md"
