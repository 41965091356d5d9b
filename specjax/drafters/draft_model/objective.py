"""The draft model's training: a small Llama-family model distilled from the target by a token
loss over every counted position of target-written text (DistillSpec), ``config.objective.name
= "draft_distill"`` (the interface is ``train/objectives.py``'s ``Objective``)."""

import dataclasses
import math
from pathlib import Path
from typing import Any

import jax
import ml_collections

from specjax import losses, parallel
from specjax.drafters.base import check_integer
from specjax.drafters.draft_model.drafter import DraftModel
from specjax.models import export, llama
from specjax.models.config import ModelConfig
from specjax.typing import Params

EMBED_MODES = ("random", "copy", "frozen")
FIELD = "config.objective.draft_distill"
# The draft's integer sizes, their least values and what 0 means.
SIZES = (("num_layers", 1, ""), ("num_heads", 1, ""), ("num_kv_heads", 1, ""), ("ffn_dim", 1, ""),
         ("dim", 0, "0 = the target's"), ("head_dim", 0, "0 = dim // num_heads"))  # fmt: skip


def full_logits(params: Params, cfg: ModelConfig, tokens_BxT: jax.Array) -> jax.Array:
  """Causal logits over whole sequences: one forward into an empty cache of exactly T slots."""
  return llama.logits_of(params, cfg, tokens_BxT)[0]


@dataclasses.dataclass(frozen=True)
class DraftDistill:
  """Draft model ``draft_cfg`` trained to match target ``target_cfg``'s next-token distribution.

  ``embed``: ``random`` (own embedding, trained), ``copy`` (initialised from the target's
  embedding and head, trained), or ``frozen`` (the target's embedding and head, not trained:
  fewer trainable params, less optimiser state). ``copy`` and ``frozen`` need the draft's
  ``dim`` to equal the target's.
  """

  target_cfg: ModelConfig
  draft_cfg: ModelConfig
  temperature: float = 1.0
  embed: str = "copy"
  init_std: float = 0.02  # embedding std for embed = random
  token_loss: str = "kl"  # losses.TOKEN_LOSSES, at ``temperature``
  name: str = "draft_distill"
  rules: parallel.Rules = llama.RULES
  frozen_rules: parallel.Rules = llama.RULES

  @staticmethod
  def config() -> ml_collections.ConfigDict:
    """``config.objective.draft_distill``: the draft's shape and the KL temperature."""
    c = ml_collections.ConfigDict()
    c.name = "tiny-draft"  # the exported draft's name
    c.num_layers = 1
    c.dim = 0  # 0 = the target's (needed by embed = copy | frozen)
    c.num_heads = 4
    c.num_kv_heads = 2
    c.ffn_dim = 128
    c.head_dim = 0  # 0 = dim // num_heads
    c.embed = "copy"  # random | copy (target's embedding, trained) | frozen (not trained)
    c.temperature = 1.0  # the loss at this temperature
    c.loss = "kl"  # forward KL, or another of specjax.losses.TOKEN_LOSSES
    return c

  @classmethod
  def check(cls, c: ml_collections.ConfigDict) -> None:
    if c.embed not in EMBED_MODES:
      raise ValueError(
        f"{FIELD}.embed={c.embed!r} is unknown; choose one of {', '.join(EMBED_MODES)}."
      )
    losses.check_token_loss(c.loss, f"{FIELD}.loss")
    for name, low, what in SIZES:
      check_integer(c[name], f"{FIELD}.{name}", low, what)
    if c.num_heads % c.num_kv_heads:
      raise ValueError(
        f"{FIELD}.num_heads ({c.num_heads}) must be a multiple of num_kv_heads "
        f"({c.num_kv_heads}) for grouped-query attention."
      )
    if not 0 < c.temperature < math.inf:
      raise ValueError(
        f"{FIELD}.temperature must be finite and > 0 (the loss's softmax temperature; 1 = the "
        f"distributions as they are), got {c.temperature}."
      )

  @classmethod
  def build(cls, c: ml_collections.ConfigDict, target: ModelConfig) -> "DraftDistill":
    try:
      draft_cfg = dataclasses.replace(
        target,
        dim=c.dim or target.dim,
        num_layers=c.num_layers,
        num_heads=c.num_heads,
        num_kv_heads=c.num_kv_heads,
        ffn_dim=c.ffn_dim,
        head_dim=c.head_dim,
        name=c.name,
      )
    except ValueError as e:  # the draft's sizes are the section's fields: name them so
      raise ValueError(str(e).replace("ModelConfig.", f"{FIELD}.")) from None
    return cls(target, draft_cfg, temperature=c.temperature, embed=c.embed, token_loss=c.loss)

  def describe(self) -> str:
    d = self.draft_cfg
    return f"draft {d.num_layers} layers x {d.dim} ({d.num_params() / 1e6:.1f} M params)"

  def drafter(self, config: ml_collections.ConfigDict) -> DraftModel:
    return DraftModel(self.draft_cfg, config.drafter.draft_model.num_draft)

  def export(self, directory: Path, params: Params, target) -> Path:
    """An HF-style directory that ``drafter.draft_model.model.source=safetensors`` loads."""
    return export.save_model(directory, self.draft_cfg, params, target.tokenizer)

  def with_data(self, dataset, tokenizer) -> "DraftDistill":
    return self

  def cached_features(self) -> tuple:
    return ()

  def __post_init__(self):
    if self.draft_cfg.vocab_size != self.target_cfg.vocab_size:
      raise ValueError(
        f"draft.vocab_size ({self.draft_cfg.vocab_size}) != target vocab_size "
        f"({self.target_cfg.vocab_size}): a draft must share the target's tokenizer."
      )
    if self.embed not in EMBED_MODES:
      raise ValueError(f"draft.embed={self.embed!r} is unknown; choose one of {EMBED_MODES}.")
    if self.embed != "random" and self.draft_cfg.dim != self.target_cfg.dim:
      raise ValueError(
        f"draft.embed={self.embed!r} reuses the target's embedding, so draft.dim must be "
        f"{self.target_cfg.dim} (got {self.draft_cfg.dim}); or set draft.embed='random'."
      )
    if self.embed == "frozen" and self.draft_cfg.tie_embeddings != self.target_cfg.tie_embeddings:
      raise ValueError(
        "draft.embed='frozen' uses the target's head as is, so draft tie_embeddings must be "
        f"{self.target_cfg.tie_embeddings} like the target's."
      )
    if not self.temperature > 0:
      raise ValueError(f"{FIELD}.temperature must be > 0, got {self.temperature}.")

  def _shared(self, frozen: Params) -> Params:
    """The target's embedding (and untied head), in the draft's layout."""
    shared = {"embed": frozen["embed"]}
    if not self.draft_cfg.tie_embeddings:
      shared["lm_head"] = frozen["embed"] if self.target_cfg.tie_embeddings else frozen["lm_head"]
    return shared

  def init(self, key: jax.Array, frozen: Params) -> Params:
    params = llama.init_params(self.draft_cfg, key, embed_std=self.init_std)
    if self.embed == "copy":
      params |= self._shared(frozen)
    elif self.embed == "frozen":
      params = {k: v for k, v in params.items() if k not in ("embed", "lm_head")}
    return params

  def model_params(self, params: Params, frozen: Params) -> Params:
    return params | self._shared(frozen) if self.embed == "frozen" else params

  def loss(self, params, frozen, batch, key):
    del key  # deterministic objective
    tokens_BxT = batch["tokens"]
    teacher_BxTxV = full_logits(frozen, self.target_cfg, tokens_BxT)
    student_BxTxV = full_logits(self.model_params(params, frozen), self.draft_cfg, tokens_BxT)
    return losses.distill_kl(
      teacher_BxTxV, student_BxTxV, batch["mask"], self.temperature, self.token_loss
    )

  def signature(self) -> dict[str, Any]:
    return {
      "objective": self.name,
      "embed": self.embed,
      "draft": dataclasses.asdict(self.draft_cfg),
      "target": self.target_cfg.name,
      "loss": self.token_loss,
    }
