"""Peers side by side: specjax vs HF transformers on the same model, prompts and draft.

    pip install -e '.[oracle]' && bash scripts/install_models.sh all
    python -m specjax.run --config=experiments/peers/config.py          # SmolLM2-135M, ~6 min
    python -m specjax.run --config=experiments/peers/config.py:qwen     # Qwen pair, ~10 min
    python -m specjax.report experiments/peers                          # README

task=peers (``specjax/tasks/peers.py``): specjax AR / prompt lookup / draft model against HF
``generate`` plain / ``prompt_lookup_num_tokens`` / assisted generation with the same draft,
greedy, batch 1, in one process. SmolLM2: the chat and code prompts of
``experiments/held_out.json``, 64 new tokens, K = 4, the draft is the target's first 8 layers
(HF loads the same GGUF with ``num_hidden_layers=8``). Qwen: the pair config's first two code
prompts, 96 new tokens, the 0.5B as the draft, K = 4.
"""

from ml_collections import config_dict

from configs import demo, qwen_coder_pair
from experiments import held_out

HERE = "experiments/peers"


def get_config(arg: str = "smollm2"):
  if arg not in ("smollm2", "qwen"):
    raise ValueError(f"config argument {arg!r} is unknown; use smollm2 or qwen.")
  if arg == "smollm2":
    c = demo.base()
    c.prompts = held_out.CATEGORIES["chat"] + held_out.CATEGORIES["code"]
    c.max_new_tokens = 64
    c.max_len = 384
    c.drafter.draft_model.num_layers = 8
  else:
    c = qwen_coder_pair.get_config()
    c.prompts = c.prompts[:2]
    c.max_new_tokens = 96
  c.task = "peers"
  c.output_dir = f"{HERE}/results/{arg}"
  c.benchmark.repeats = 1
  c.peers = config_dict.ConfigDict()
  c.peers.num_draft = 4
  # A subset of peers.MODES to run (specjax AR, every row's reference, always runs).
  c.peers.modes = (
    "specjax_ar", "specjax_prompt_lookup", "specjax_draft_model",
    "hf_greedy", "hf_prompt_lookup", "hf_assisted",
  )  # fmt: skip
  return c
