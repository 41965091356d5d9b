"""Medusa's training objective: heads on the frozen target's final hidden states, trained
against its own predictions (``config.objective.name = "medusa"``; the interface is
``train/objectives.py``'s ``Objective``).
"""

import dataclasses
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from specjax import losses, parallel
from specjax.drafters import artifact, prompt_lookup
from specjax.drafters.base import sampled_candidates
from specjax.drafters.medusa import model as medusa
from specjax.drafters.medusa.drafter import Medusa, parse_tree
from specjax.models import llama
from specjax.models.config import ModelConfig
from specjax.typing import Params


@dataclasses.dataclass(frozen=True)
class MedusaHeads:
  """Medusa-1: heads on the frozen target's final hidden state (``drafters/medusa``).

  Head k at position t learns the target's distribution at t + k (one target forward per
  batch gives every head its labels), weighted ``decay ** (k - 1)``. With a reduced draft
  vocabulary (``vocab_size`` < the target's), ``with_data`` picks the ``vocab_size`` most
  frequent tokens of the training rows (stop tokens always in).
  """

  target_cfg: ModelConfig
  heads: medusa.HeadsConfig
  decay: float = 0.8
  vocab_ids: tuple | None = None  # the draft vocabulary's target ids; None = all of them
  init_from: str = ""  # heads to start from (their vocabulary kept); "" = fresh heads
  token_loss: str = "soft_ce"  # each head's term (losses.TOKEN_LOSSES)
  name: str = "medusa"
  rules: parallel.Rules = ()
  frozen_rules: parallel.Rules = llama.RULES

  @staticmethod
  def config() -> ml_collections.ConfigDict:
    """``config.objective.medusa``: the heads' shape and the per-head loss decay."""
    c = ml_collections.ConfigDict()
    c.num_heads = 4  # H: head k drafts the token k places after the newest
    c.num_layers = 1  # residual layers per head
    c.vocab_size = 0  # draft vocabulary V' (0 = the target's): the most frequent training tokens
    c.own_proj = False  # False: every head uses the target's frozen head (only W, b trained)
    c.decay = 0.8  # loss weight decay ** (k - 1) of head k
    c.loss = "soft_ce"  # each head's term (specjax.losses.TOKEN_LOSSES)
    c.init_from = ""  # trained heads (a draft_final directory) to continue from; "" = fresh
    return c

  @classmethod
  def check(cls, c: ml_collections.ConfigDict) -> None:
    f = "config.objective.medusa"
    for key in ("num_heads", "num_layers"):
      if int(c[key]) != c[key] or c[key] < 1:
        raise ValueError(f"{f}.{key} must be an integer >= 1, got {c[key]}.")
    if int(c.vocab_size) != c.vocab_size or c.vocab_size < 0:
      raise ValueError(f"{f}.vocab_size must be an integer >= 0 (0 = the target's).")
    if not 0 < c.decay <= 1:
      raise ValueError(f"{f}.decay must be in (0, 1], got {c.decay}.")
    losses.check_token_loss(c.loss, f"{f}.loss")
    if c.init_from:
      got = medusa.read_meta(c.init_from, f"{f}.init_from")["heads"]
      for key in ("num_heads", "num_layers", "own_proj"):
        if got[key] != c[key]:
          raise ValueError(
            f"{f}.init_from={c.init_from!r} holds heads with {key}={got[key]}, but "
            f"{f}.{key}={c[key]}: make them equal, or start fresh (init_from='')."
          )
      if c.vocab_size and got["vocab_size"] != c.vocab_size:
        raise ValueError(
          f"{f}.init_from={c.init_from!r} has a draft vocabulary of {got['vocab_size']}, but "
          f"{f}.vocab_size={c.vocab_size}: set it to {got['vocab_size']} (it is kept)."
        )

  @classmethod
  def check_seq_len(cls, c: ml_collections.ConfigDict, seq_len: int) -> None:
    """Head k at position t learns the target's prediction at t + k, of token t + k + 1: a row
    of T tokens labels heads 1 .. T - 2."""
    if c.num_heads > seq_len - 2:
      raise ValueError(
        f"config.objective.medusa.num_heads={c.num_heads} exceeds what a row of "
        f"config.data.seq_len={seq_len} tokens can label (head k learns the token k + 1 ahead: "
        f"at most seq_len - 2 = {seq_len - 2} heads; the others would never train but be saved "
        "as trained): lower num_heads or raise seq_len."
      )

  @classmethod
  def build(cls, c: ml_collections.ConfigDict, target: ModelConfig) -> "MedusaHeads":
    if c.vocab_size > target.vocab_size:
      raise ValueError(
        f"config.objective.medusa.vocab_size={c.vocab_size} exceeds the target's vocabulary "
        f"({target.vocab_size}); use 0 for all of it."
      )
    heads = medusa.HeadsConfig(
      dim=target.dim,
      num_heads=c.num_heads,
      vocab_size=c.vocab_size or target.vocab_size,
      target_vocab_size=target.vocab_size,
      num_layers=c.num_layers,
      own_proj=c.own_proj,
    )
    return cls(target, heads, decay=c.decay, init_from=c.init_from, token_loss=c.loss)

  def with_data(self, dataset, tokenizer) -> "MedusaHeads":
    """Picks the reduced draft vocabulary: the most frequent tokens of the counted positions'
    next tokens, stop tokens first."""
    if self.init_from:  # the heads started from keep their vocabulary
      ids = medusa.read_tensors(self.init_from)["vocab_ids"]
      return dataclasses.replace(self, vocab_ids=tuple(int(i) for i in ids))
    if not self.heads.reduced:
      return self
    ids = artifact.frequent_ids(
      dataset, self.target_cfg.vocab_size, self.heads.vocab_size, tokenizer
    )
    return dataclasses.replace(self, vocab_ids=ids)

  def cached_features(self) -> tuple:
    return ()

  def _vocab(self) -> jax.Array:
    if self.vocab_ids is None:
      return jnp.arange(self.heads.vocab_size, dtype=jnp.int32)
    return jnp.asarray(self.vocab_ids, jnp.int32)

  def describe(self) -> str:
    h = self.heads
    n = h.num_heads * h.num_layers * (h.dim + 1) * h.dim + (
      h.num_heads * h.vocab_size * h.dim if h.own_proj else 0
    )
    return (
      f"{h.num_heads} Medusa heads x {h.num_layers} layer(s), draft vocabulary {h.vocab_size}, "
      f"{'own' if h.own_proj else 'the target'}'s projection ({n / 1e6:.2f} M trained params)"
    )

  def init(self, key: jax.Array, frozen: Params) -> Params:
    del key  # Medusa's init is deterministic: identity residual layers, the target's head
    keys = medusa.TRAINED[self.heads.own_proj]
    if self.init_from:
      tensors = medusa.read_tensors(self.init_from)
      return {k: jnp.asarray(tensors[k]) for k in keys}
    params = medusa.init_heads(self.heads, frozen, self.target_cfg, self._vocab())
    return {k: params[k] for k in keys}

  def model_params(self, params: Params, frozen: Params) -> Params:
    out = dict(params, vocab_ids=self._vocab())
    if not self.heads.own_proj:
      out["proj"] = medusa.target_head(frozen, self.target_cfg)[self._vocab()][None]
    return out

  def loss(self, params, frozen, batch, key):
    del key
    logits_BxTxV, feats = llama.logits_of(frozen, self.target_cfg, batch["tokens"], ("final",))
    h_BxTxF = jax.lax.stop_gradient(feats[0])
    heads_BxTxHxW = medusa.head_logits(self.model_params(params, frozen), h_BxTxF)
    return losses.medusa_xent(
      logits_BxTxV, heads_BxTxHxW, self._vocab(), batch["mask"], self.decay, self.token_loss
    )

  def signature(self) -> dict[str, Any]:
    return {
      "objective": self.name,
      "heads": dataclasses.asdict(self.heads),
      "decay": self.decay,
      "init_from": self.init_from,
      "target": self.target_cfg.name,
      "loss": self.token_loss,
    }

  def drafter(self, config: ml_collections.ConfigDict) -> Medusa:
    c = config.drafter.medusa
    sampled = sampled_candidates(c, medusa.FIELD)
    return Medusa(self.heads, parse_tree(c), sampled, prompt_lookup.branch(c))

  def export(self, directory: Path, params: Params, target) -> Path:
    """Heads that ``drafter.medusa.path`` loads (with the target's fingerprint)."""
    extra = {"decay": self.decay, "init_from": self.init_from}
    return medusa.save(directory, self.heads, params, target, None, extra)
