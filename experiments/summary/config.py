"""The summary: every measured drafter per model, temperature and batch size, from the JSON.

    python -m specjax.run --config=experiments/summary/config.py:smollm2   # batch 4, T 0 and 1
    python -m specjax.run --config=experiments/summary/config.py:qwen      # T 1; batch 4, T 0 and 1
    python -m specjax.report experiments/summary      # rewrites README.md and results/summary.json

The table is assembled from the committed results of the experiments that measured it
(``SOURCES``), one row per (model, temperature, batch, drafter): τ, target calls per token and
the speedup over AR measured in the same process (means over that experiment's prompt
categories), and, where ``experiments/cost_model`` priced the drafter, its predicted speedup on
an H200 (the measured τ over the H200 roofline's step cost). The two runs above (task=sweep)
measure the cells no other experiment covers: SmolLM2 at batch 4 with the temperature sweep's
drafters, and the Qwen pair at temperature 1 and batch 4. Combinations nothing ran are listed
as missing.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHIP = "H200"
# (experiment results file, model, temperatures taken from it)
SMOL, QWEN = "SmolLM2-135M", "Qwen2.5-Coder 1.5B + 0.5B"
COST_MODEL = {
  SMOL: "experiments/cost_model/results/smollm2",
  QWEN: "experiments/cost_model/results/qwen",
}
SOURCES = (
  (f"{COST_MODEL[SMOL]}/sweep.json", SMOL, None),
  (f"{COST_MODEL[QWEN]}/sweep.json", QWEN, None),
  ("experiments/eagle_smollm2/results/sweep_b1/sweep.json", SMOL, None),
  ("experiments/temperature_sweep/results/sweep.json", SMOL, (1.0,)),
  ("experiments/eagle_smollm2/results/sweep_t1/sweep.json", SMOL, None),
  ("experiments/speculative_theory/results/qwen/sweep.json", QWEN, None),
  ("experiments/summary/results/smollm2/sweep.json", SMOL, None),
  ("experiments/summary/results/qwen/sweep.json", QWEN, None),
)
WANTED = [(m, t, b) for m in (SMOL, QWEN) for t in (0.0, 1.0) for b in (1, 4)]


def get_config(arg: str | None = None):
  """task=sweep over the cells the other experiments leave out (``smollm2`` or ``qwen``)."""
  from configs import demo, qwen_coder_pair
  from experiments import held_out
  from experiments.cost_model import config as cost_model
  from experiments.temperature_sweep import config as temperature_sweep
  from specjax.measure import sweep

  if arg not in ("smollm2", "qwen"):
    raise ValueError(
      f"experiments/summary/config.py needs smollm2 or qwen (got {arg!r}); the table itself: "
      "python -m specjax.report experiments/summary."
    )
  c = demo.base() if arg == "smollm2" else qwen_coder_pair.get_config()
  c.task = "sweep"
  c.output_dir = f"experiments/summary/results/{arg}"
  c.max_new_tokens = 64
  c.max_len = 384
  c.top_k = 0
  c.top_p = 1.0
  c.seed = 0
  c.benchmark.repeats = 1
  c.sweep = sweep.default_config()
  c.sweep.temperatures = (0.0, 1.0)
  c.sweep.verify_sizes = ()
  if arg == "smollm2":  # the temperature sweep's drafters at batch 4 (ragged rows, per-row accept)
    c.drafter.draft_model.num_layers = 8
    c.sweep.batch_sizes = (4,)
    c.sweep.categories = {k: held_out.CATEGORIES[k] for k in ("chat", "code")}
    c.sweep.variants = temperature_sweep.variants()
  else:  # T = 0 at batch 1 is experiments/cost_model's; it is measured again here alongside
    c.sweep.batch_sizes = (1, 4)
    c.sweep.categories = {"code": tuple(c.prompts)}
    v = cost_model.qwen_variants()
    c.sweep.variants = {k: v[k] for k in ("draft_k4", "lookup_k4")}
  return c
