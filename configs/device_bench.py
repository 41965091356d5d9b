"""The benchmark set for a device: SmolLM2-135M-Instruct with every trained and training-free
drafter (the block drafters as chains and as trees with the lookup branch, DSpark and the
served EAGLE-3 too), in float32 and in bfloat16, batch 1, and the verify-cost curve in each,
written to one JSON for the cost model.

    bash scripts/device_bench.sh                 # on whatever accelerator is present
    bash scripts/device_bench.sh quick           # a minute-scale check (this CPU: ~4 min)
    bash scripts/device_bench.sh tiny            # random tiny models: the script's own test

The full set runs each drafter in float32 and in bfloat16 (``device_bench.dtypes``); ``quick``
runs ``dtype = auto``: bfloat16 on GPU/TPU, on a CPU whichever dtype it runs the target faster
in (specjax/precision.py). The Medusa heads and the EAGLE, EAGLE-3, DFlash, DSpark and P-EAGLE
drafters are the ones committed under experiments/ (trained on this target).
"""

from ml_collections import config_dict

from configs import demo, tiny

MEDUSA_HEADS = "experiments/medusa_smollm2/heads"
EAGLE_DRAFTER = "experiments/eagle_smollm2/drafter"
DFLASH_DRAFTER = "experiments/block_smollm2/drafter"
PEAGLE_DRAFTER = "experiments/block_smollm2/drafter_peagle"
DSPARK_DRAFTER = "experiments/block_smollm2/drafter_dspark"
EAGLE3_DRAFTER = "experiments/eagle_smollm2/drafter_eagle3"


def block_variants() -> dict:
  """The block drafters verified as trees with the lookup branch (DFlash, DSpark, P-EAGLE) and
  the served EAGLE-3's tree beside them, as experiments/block_smollm2 decodes them."""
  from experiments.block_smollm2 import config as block

  eagle3 = {"path": EAGLE3_DRAFTER, "top_k": 4, "depth": 6, "total": 16, "lookup": 4}
  return {
    "dflash_tree_14_l4": block.dflash_variant(DFLASH_DRAFTER, block.CATERPILLAR, lookup=4),
    "dspark_tree_14_l4": block.dflash_variant(DSPARK_DRAFTER, block.CATERPILLAR, lookup=4),
    "peagle_tree_16_l4": block.peagle_variant(PEAGLE_DRAFTER, block.CATERPILLAR_8, lookup=4),
    "eagle3_16_l4": {"name": "eagle", "eagle": eagle3},
  }


def get_config(arg: str = "full"):
  if arg not in ("full", "quick", "tiny"):
    raise ValueError(f"config argument {arg!r} is unknown; use full, quick or tiny.")
  if arg == "tiny":
    c = tiny.get_config()
    c.task, c.output_dir = "device_bench", "results/device_bench_tiny"
    c.max_new_tokens, c.max_len, c.benchmark.repeats = 16, 64, 1
    c.device_bench = config_dict.ConfigDict()
    c.device_bench.variants = {"lookup_tree": {"name": "prompt_lookup",
                                               "prompt_lookup": {"num_branches": 2}}}  # fmt: skip
    c.device_bench.drafters = ("draft_model", "lookup_tree")
    c.device_bench.dtypes = ("float32", "bfloat16")
    c.device_bench.batch_sizes = (2,)  # batched rows; the grid's loop is the same at (1, 4)
    c.device_bench.verify_sizes = (1, 4)
    return c
  c = demo.base()
  c.task = "device_bench"
  c.output_dir = "results/device_bench"
  c.drafter.draft_model.num_layers = 8
  c.drafter.medusa.path = MEDUSA_HEADS  # with the 4-node tree saved beside them
  c.drafter.eagle.path = EAGLE_DRAFTER
  c.drafter.eagle.update(top_k=4, depth=5, total=16)
  c.drafter.dflash.path = DFLASH_DRAFTER  # a 7-chain from blocks of 8 (experiments/block_smollm2)
  c.drafter.peagle.path = PEAGLE_DRAFTER  # an 8-chain, one forward (experiments/block_smollm2)
  c.device_bench = config_dict.ConfigDict()
  c.device_bench.variants = block_variants()  # labels drafters may name beside the sections
  c.device_bench.drafters = (
    "prompt_lookup", "draft_model", "medusa", "eagle", "dflash", "peagle", *c.device_bench.variants
  )  # fmt: skip
  c.device_bench.dtypes = ("float32", "bfloat16")
  c.device_bench.batch_sizes = (1,)  # '(1,4)': batched rows too (twice the runs)
  c.device_bench.verify_sizes = (1, 2, 4, 8, 16, 32, 64)
  if arg == "quick":
    c.device_bench.drafters = ("prompt_lookup", "eagle", "dflash")
    c.device_bench.dtypes = ()  # the config's: dtype = auto
    c.device_bench.verify_sizes = (1, 4, 16)
    c.max_new_tokens = 16
    c.benchmark.repeats = 1
  return c
