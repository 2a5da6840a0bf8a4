#!/usr/bin/env bash
# The comparison end to end: grid, attention scaling, report and plots, into one run folder (experiments/run_all.py).
#   ./run_all.sh                 the quick grid into runs/grid-quick (about 28 minutes on 2 cores)
#   ./run_all.sh --smoke --out X every cell at a handful of steps (3 minutes; 4.5 with the data)
#   ./run_all.sh --full          paper presets, 3 seeds (a GPU job)
#   ./run_all.sh --help          every option; runs nothing
set -euo pipefail
cd "$(dirname "$0")"
export SPARSE_ATTN_DATA="${SPARSE_ATTN_DATA:-$(pwd)/data}"
export MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736  # one allocator setting for every CPU timing
exec python -m experiments.run_all "$@"
