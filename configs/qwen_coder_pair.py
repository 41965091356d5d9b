"""Qwen2.5-Coder-1.5B-Instruct target, Qwen2.5-Coder-0.5B-Instruct draft: a real pair.

    bash scripts/install_models.sh qwen && python -m specjax.run --config=configs/qwen_coder_pair.py

Both models share one tokenizer (checked by fingerprint before anything runs). Benchmarks AR
vs draft-model speculative decoding on code prompts, batch 1, greedy, in one process; prints
the table (τ, α_i, tokens/s, speedup, the cost ratio c) and writes
results/qwen_coder_pair/benchmark.json.
"""

from configs import tiny
from specjax.models import source


def get_config():
  c = tiny.get_config()
  c.task = "benchmark"
  c.output_dir = "results/qwen_coder_pair"
  c.target = source.config("qwen2.5-coder-1.5b-instruct")
  c.drafter.draft_model.source = "model"
  c.drafter.draft_model.model = source.config("qwen2.5-coder-0.5b-instruct")
  c.drafter.draft_model.num_draft = 4
  c.prompts = (
    "Write a Python function `merge_sorted(a, b)` that merges two sorted lists into one "
    "sorted list. Include a docstring.",
    "Write a Python class `Stack` with push, pop, peek and is_empty methods.",
    "Write a Python function that checks whether a string is a palindrome, ignoring case and "
    "non-alphanumeric characters.",
    "Write a Python function `binary_search(xs, target)` returning the index or -1.",
  )
  c.chat = True
  c.stop_at_eos = True
  c.batch_size = 1
  c.max_new_tokens = 128
  c.max_len = 320
  c.benchmark.repeats = 1
  return c
