"""Turns a ConfigDict into the frozen objects the library takes, checking it on the way.

Config never crosses a jit boundary: this module is the edge. Every check raises a
ValueError naming the config field and the fix, before any model is loaded or compiled.
"""

import dataclasses
from typing import Any

import ml_collections
import numpy as np

from specjax import sampling, testing
from specjax.drafters.base import NoDraft, check_num_draft
from specjax.drafters.draft_model import DraftModel
from specjax.models.config import ModelConfig

DRAFTERS = ("none", "draft_model")
MODEL_SOURCES = ("random", "truncate")


@dataclasses.dataclass(frozen=True)
class Model:
  cfg: ModelConfig
  params: Any
  tokenizer: Any = None  # None for random models: prompts and outputs are token ids.


@dataclasses.dataclass(frozen=True)
class Request:
  """What to generate: prompts as token ids, plus the traced knobs."""

  prompts: list[list[int]]
  prompt_texts: list[str] | None
  max_new_tokens: int
  max_len: int
  temperature: float
  top_k: int
  top_p: float
  seed: int
  eos_id: int | None


def _choice(value: str, options: tuple[str, ...], field: str) -> str:
  if value not in options:
    raise ValueError(f"config.{field}={value!r} is unknown; choose one of {', '.join(options)}.")
  return value


def check(config: ml_collections.ConfigDict) -> None:
  """All cheap checks, run before anything is loaded."""
  _choice(config.target.source, ("random",), "target.source")
  _choice(config.drafter.name, DRAFTERS, "drafter.name")
  check_num_draft(config.drafter.num_draft)
  if config.drafter.name == "draft_model":
    _choice(config.drafter.source, MODEL_SOURCES, "drafter.source")
    if config.drafter.num_draft == 0:
      raise ValueError("config.drafter.num_draft must be >= 1 for drafter.name='draft_model'.")
  sampling.validate(config.temperature, config.top_k, config.top_p)
  if config.batch_size < 1:
    raise ValueError(f"config.batch_size must be >= 1, got {config.batch_size}.")


def _random_model(c: ml_collections.ConfigDict) -> Model:
  cfg, params = testing.tiny_model(
      seed=c.seed, vocab_size=c.vocab_size, dim=c.dim, num_layers=c.num_layers,
      num_heads=c.num_heads, num_kv_heads=c.num_kv_heads, ffn_dim=c.ffn_dim, name=c.name,
      logit_std=c.logit_std, residual_scale=c.residual_scale,
  )
  return Model(cfg, params)


def target(config: ml_collections.ConfigDict) -> Model:
  return _random_model(config.target)


def drafter(config: ml_collections.ConfigDict, target: Model):
  """Returns ``(drafter, drafter_params)``."""
  c = config.drafter
  if c.name == "none":
    return NoDraft(), None
  if c.source == "truncate":
    if not 1 <= c.num_layers < target.cfg.num_layers:
      raise ValueError(
          f"config.drafter.num_layers={c.num_layers} must be in [1, {target.cfg.num_layers}) to "
          "truncate the target into a draft."
      )
    dcfg, dparams = testing.truncated(target.cfg, target.params, c.num_layers)
  else:
    m = _random_model(c.model)
    dcfg, dparams = m.cfg, m.params
  d = DraftModel(dcfg, c.num_draft)
  d.check_target(target.cfg)
  return d, dparams


def request(config: ml_collections.ConfigDict, model: Model) -> Request:
  """Prompts: token-id lists for random models, random prompts when none are given."""
  rng = np.random.default_rng(config.seed)
  prompts = [list(p) for p in config.prompts] if config.prompts else [
      rng.integers(0, model.cfg.vocab_size, size=rng.integers(4, 17)).tolist()
      for _ in range(config.batch_size)
  ]
  prompts = (prompts * config.batch_size)[: max(config.batch_size, 1)]
  return Request(
      prompts=prompts,
      prompt_texts=None,
      max_new_tokens=config.max_new_tokens,
      max_len=config.max_len,
      temperature=config.temperature,
      top_k=config.top_k,
      top_p=config.top_p,
      seed=config.seed,
      eos_id=None if config.eos_id < 0 else config.eos_id,
  )

