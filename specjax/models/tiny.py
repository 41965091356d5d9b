"""Models made without a checkpoint: tiny random decoders and layer truncations of a model.

``random_model`` serves unit tests and ``configs/tiny.py`` (every task in seconds on a CPU);
``truncated`` keeps a model's first layers with its own embedding and head: a draft that
needs no training.
"""

import dataclasses

import jax

from specjax.models import llama
from specjax.models.config import ModelConfig
from specjax.typing import Params


def tiny_config(vocab_size=8, dim=16, num_layers=2, name="tiny", **kw) -> ModelConfig:
  kw = dict(num_heads=2, num_kv_heads=1, ffn_dim=2 * dim, tie_embeddings=False) | kw
  return ModelConfig(vocab_size=vocab_size, dim=dim, num_layers=num_layers, name=name, **kw)


def random_model(
  seed: int = 0, logit_std: float = 1.5, residual_scale: float = 1.0, **kw
) -> tuple[ModelConfig, Params]:
  """A random tiny LM whose next-token distributions have moderate entropy (``logit_std``).

  ``kw`` are ``tiny_config`` fields; ``residual_scale < 1`` makes truncations of it agree with
  the whole (see ``llama.init_params``).
  """
  cfg = tiny_config(**kw)
  params = llama.init_params(
    cfg, jax.random.key(seed), embed_std=logit_std / cfg.dim**0.5, residual_scale=residual_scale
  )
  return cfg, params


def truncated(cfg: ModelConfig, params: Params, num_layers: int) -> tuple[ModelConfig, Params]:
  """The first ``num_layers`` layers of a model with its own embeddings and head: a cheap draft."""
  if not 1 <= num_layers <= cfg.num_layers:
    raise ValueError(f"num_layers={num_layers} must be in [1, {cfg.num_layers}] for {cfg.name!r}.")
  small = dataclasses.replace(cfg, num_layers=num_layers, name=f"{cfg.name}-first{num_layers}")
  return small, dict(params, layers=params["layers"][:num_layers])
