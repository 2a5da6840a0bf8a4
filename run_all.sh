#!/usr/bin/env bash
# The comparison grid: every method that has landed × tasks × seeds (bench/grid.py), then the attention scaling
# table (bench/scaling.py, measured alone after the grid so nothing else shares the CPU), then the tables
# written into README.md (bench/report.py).
#   ./run_all.sh            --quick (default): CPU presets on the quick budget, cells side by side on the cores
#   ./run_all.sh --full     paper presets, 3 seeds (a GPU job); scaling to n = 8192
# Resumable: re-running skips the cells whose records are complete and a scaling table already written.
# Extra options go to every cell.
set -euo pipefail
cd "$(dirname "$0")"
export SPARSE_ATTN_DATA="${SPARSE_ATTN_DATA:-$(pwd)/data}"
export MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736  # one allocator setting for every CPU timing
lengths=1024,2048,4096
jobs=$(nproc)
for arg in "$@"; do
  if [ "$arg" = "--full" ]; then lengths=1024,2048,4096,8192; jobs=1; fi
done
python -m bench.grid --jobs "$jobs" "$@"
methods=$(python -c "from bench.grid import METHODS; from bench.train import available_methods as a; \
print(','.join(m for m in METHODS if m in a() and m != 'kernel') + ',full-ref')")
if [ ! -f results/scaling.json ]; then
  python -m bench.scaling --methods "$methods" --lengths "$lengths" --out results/scaling.json
fi
python -m bench.report --results results --readme README.md
