#!/usr/bin/env bash
# The benchmark set on whatever accelerator JAX finds (GPU, TPU; else this CPU), one JSON record:
# tokens/s, tau, target calls per token and speedup per drafter and batch size, and the
# verify-cost curve, in OUT/device_bench.json (default results/device_bench); it first prints
# the device it runs on.
#
#   bash scripts/device_bench.sh [quick|tiny] [--config.field=value ...]
#
# On a fresh accelerator machine: pip install -e '.[cuda]' (or '.[tpu]'), then
# bash scripts/install_models.sh smollm2, then this script.
set -euo pipefail
cd "$(dirname "$0")/.."
arg=full
if [[ "${1:-}" == quick || "${1:-}" == tiny ]]; then arg=$1; shift; fi
python -m specjax.run --config="configs/device_bench.py:$arg" "$@"
