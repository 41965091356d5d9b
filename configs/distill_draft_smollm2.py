"""A 2-layer draft for SmolLM2-135M-Instruct, distilled from its own sampled replies.

    bash scripts/install_models.sh smollm2 && bash scripts/install_corpora.sh all
    nice -n 10 python -m specjax.run --config=configs/self_distill_smollm2.py   # the data
    nice -n 10 python -m specjax.run --config=configs/distill_draft_smollm2.py  # ~20 min

trains the draft by KL(target || draft) on data/self_distill/smollm2 (rows of 256 tokens; only
the target-written positions count), prints the progress bar, writes
results/distill_draft_smollm2/{metrics.jsonl, checkpoints/, draft_init/, draft_final/,
train.json} and prints the greedy tau of the untrained and the trained draft on the demo
prompts. The draft shares the target's tokenizer and its (frozen) tied embedding and head; its
two layers and final norm are trained. Rerunning resumes from the newest checkpoint.

Then decode with the draft-model drafter against AR on the real model, in one process:

    python -m specjax.run --config=configs/distill_draft_smollm2.py:benchmark
    python -m specjax.run --config=configs/distill_draft_smollm2.py:benchmark_init

(the trained and the untrained draft): prints tau, alpha_i, the cost ratio c = draft step /
target step and the speedup over AR, and writes results/distill_draft_smollm2/{trained,
untrained}/benchmark.json. Greedy outputs equal AR's (the run checks it).
"""

from ml_collections import config_dict

from configs import demo, train_tiny

WORKDIR = "results/distill_draft_smollm2"


def get_config(arg: str | None = None):
  c = demo.base()  # SmolLM2 target, the demo prompts, chat template, greedy
  c.task = "train"
  c.workdir = WORKDIR
  c.drafter.name = "draft_model"
  c.drafter.draft_model.num_draft = 3  # K for decoding (the tau evaluation and the benchmark)
  c.benchmark.repeats = 1
  t = train_tiny.get_config()
  for section in ("objective", "data", "train", "optim", "mesh", "distributed", "evaluate"):
    c[section] = t[section]

  o = c.objective.draft_distill
  o.name = "smollm2-draft-2l"
  o.num_layers = 2
  o.dim = 0  # the target's 576: shares its embedding
  o.num_heads = 9
  o.num_kv_heads = 3
  o.ffn_dim = 1536
  o.embed = "frozen"  # the target's tied embedding/head, not trained

  c.data.sources = ("data/self_distill/smollm2",)  # written by configs/self_distill_smollm2.py
  c.data.seq_len = 200  # the longest self-distilled row (prompt + reply) is 200 tokens
  c.data.max_examples = 0  # all
  c.data.eval_examples = 32

  c.train.steps = 180
  c.train.global_batch = 4
  c.train.log_every = 5
  c.train.eval_every = 60
  c.train.eval_batches = 2
  c.train.checkpoint_every = 20
  c.train.keep = 2

  c.optim.learning_rate = 2e-3
  c.optim.warmup_steps = 10
  c.optim.decay_steps = 170
  c.optim.weight_decay = 0.0

  if arg in ("benchmark", "benchmark_init"):
    name = "draft_final" if arg == "benchmark" else "draft_init"
    c.task = "benchmark"
    c.output_dir = f"{WORKDIR}/{'trained' if arg == 'benchmark' else 'untrained'}"
    c.drafter.draft_model.source = "model"
    c.drafter.draft_model.model = config_dict.ConfigDict(
      {"source": "safetensors", "path": f"{WORKDIR}/{name}"}
    )
  elif arg:
    raise ValueError(
      f"unknown variant {arg!r} of distill_draft_smollm2.py; choose benchmark or benchmark_init."
    )
  return c
