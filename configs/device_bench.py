"""The benchmark set for a device: SmolLM2-135M-Instruct with every trained and training-free
drafter, batch 1 and 4, and the verify-cost curve, written to one JSON for the cost model.

    bash scripts/device_bench.sh                 # on whatever accelerator is present
    bash scripts/device_bench.sh quick           # a minute-scale check (this CPU: ~4 min)
    bash scripts/device_bench.sh tiny            # random tiny models: the script's own test

Weights and caches are bfloat16 on GPU/TPU; on a CPU, whichever dtype it runs the target
faster in (``dtype = auto``: specjax/precision.py). The Medusa
heads, the EAGLE drafter and the DFlash and P-EAGLE block drafters are the ones committed under
experiments/ (trained on this target).
"""

from ml_collections import config_dict

from configs import demo, tiny

MEDUSA_HEADS = "experiments/medusa_smollm2/heads"
EAGLE_DRAFTER = "experiments/eagle_smollm2/drafter"
DFLASH_DRAFTER = "experiments/block_smollm2/drafter"
PEAGLE_DRAFTER = "experiments/block_smollm2/drafter_peagle"


def get_config(arg: str = "full"):
  if arg not in ("full", "quick", "tiny"):
    raise ValueError(f"config argument {arg!r} is unknown; use full, quick or tiny.")
  if arg == "tiny":
    c = tiny.get_config()
    c.task, c.output_dir = "device_bench", "results/device_bench_tiny"
    c.max_new_tokens, c.max_len, c.benchmark.repeats = 16, 64, 1
    c.device_bench = config_dict.ConfigDict()
    c.device_bench.drafters = ("draft_model", "prompt_lookup")
    c.device_bench.batch_sizes = (2,)  # batched rows; the grid's loop is the same at (1, 4)
    c.device_bench.verify_sizes = (1, 4)
    return c
  c = demo.base()
  c.task = "device_bench"
  c.output_dir = "results/device_bench"
  c.drafter.draft_model.num_layers = 8
  c.drafter.medusa.path = MEDUSA_HEADS
  c.drafter.medusa.tree_spec = (3, 2, 2, 1)
  c.drafter.eagle.path = EAGLE_DRAFTER
  c.drafter.eagle.update(top_k=4, depth=5, total=16)
  c.drafter.dflash.path = DFLASH_DRAFTER  # a 7-chain from blocks of 8 (experiments/block_smollm2)
  c.drafter.peagle.path = PEAGLE_DRAFTER  # an 8-chain, one forward (experiments/block_smollm2)
  c.device_bench = config_dict.ConfigDict()
  c.device_bench.drafters = ("prompt_lookup", "draft_model", "medusa", "eagle", "dflash", "peagle")
  c.device_bench.batch_sizes = (1, 4)
  c.device_bench.verify_sizes = (1, 2, 4, 8, 16, 32, 64)
  if arg == "quick":
    c.device_bench.drafters = ("prompt_lookup", "eagle", "dflash")
    c.device_bench.batch_sizes = (1,)
    c.device_bench.verify_sizes = (1, 4, 16)
    c.max_new_tokens = 16
    c.benchmark.repeats = 1
  return c
