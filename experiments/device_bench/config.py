"""The device benchmark set (configs/device_bench.py) as an experiment: what ran on an NVIDIA H200.

    bash scripts/device_bench.sh full --config.device_bench.dtypes="('float32',)" \
      --config.device_bench.drafters="('eagle','medusa','prompt_lookup','draft_model')" \
      --config.device_bench.batch_sizes="(1,)"

then, for the two extra rows of the README (same config, task=benchmark):

    python -m specjax.run --config=configs/device_bench.py:full --config.dtype=float32 \
      --config.task=benchmark --config.drafter.name=eagle --config.drafter.eagle.top_k=8 \
      --config.drafter.eagle.depth=6 --config.drafter.eagle.total=60
    python -m specjax.run --config=configs/device_bench.py:full --config.dtype=float32 \
      --config.task=benchmark --config.drafter.name=eagle --config.batch_size=4

Each writes its record under results/device_bench/; the ones committed here are in
results/h200_float32/ with the run's log (run with ``--config.dtype=float32``, before the full
set had ``device_bench.dtypes``; the first command above is the same run now). The full set,
``bash scripts/device_bench.sh``, now runs every drafter, the block drafters' trees with the
lookup branch, DSpark and the served EAGLE-3, in float32 and in bfloat16, batch 1: what the
next device call measures.
"""

from configs.device_bench import get_config  # noqa: F401  (the experiment is that config)
