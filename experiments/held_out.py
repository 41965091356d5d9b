"""The held-out prompts every experiment decodes, read from ``held_out.json`` beside this file.

    from experiments import held_out
    held_out.CATEGORIES["code"]      # three prompts per category: rewrite, code, chat, qa
    held_out.CHAT_NEW                # six more chat prompts, of kinds no request template asks

``CATEGORIES`` are four kinds of request a chat model gets: rewriting or summarising a given
passage (much to copy), code continuation, open chat and QA over a passage. ``CHAT_NEW`` asks
for kinds of reply the self-distillation request sets do not (``tests/test_distill.py`` checks
that no training prompt holds any of these texts). Drafters are never trained on them; they
are data, so a new experiment reads the same file rather than importing another's config.
"""

import json
from pathlib import Path

import ml_collections

from specjax.measure import sweep

_PROMPTS = json.loads((Path(__file__).parent / "held_out.json").read_text())
CATEGORIES: dict[str, tuple[str, ...]] = {k: tuple(v) for k, v in _PROMPTS["categories"].items()}
CHAT_NEW: tuple[str, ...] = tuple(_PROMPTS["chat_new"])


def sweep_on(
  c: ml_collections.ConfigDict,
  output_dir: str,
  categories: dict,
  variants: dict,
  batch_sizes: tuple = (1,),
  temperatures: tuple = (),
  log_likelihood: bool = False,
) -> None:
  """``c`` as a ``task=sweep`` over held-out ``categories`` (name -> prompts), as the drafter
  experiments decode them: 64 new tokens (``max_len`` 384), AR and each of ``variants`` in one
  process, at ``c.temperature`` or each of ``temperatures``."""
  c.task = "sweep"
  c.output_dir = output_dir
  c.prompts = CATEGORIES["chat"]
  c.max_new_tokens = 64
  c.max_len = 384
  c.sweep = sweep.default_config()
  c.sweep.batch_sizes = tuple(batch_sizes)
  if temperatures:
    c.sweep.temperatures = temperatures
  if log_likelihood:
    c.sweep.log_likelihood = True
  c.sweep.categories = categories
  c.sweep.verify_sizes = ()
  c.sweep.variants = variants
