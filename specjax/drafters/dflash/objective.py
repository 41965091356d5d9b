"""DFlash's training on anchored blocks (``config.objective.name = "dflash"``; the interface is
``train/objectives.py``'s ``Objective``), as its paper and speculators train it.

Each row of target-written text gets ``anchors`` random anchor positions (drawn without
replacement among those whose whole block lies inside the row); at each, a block is the
anchor's token then ``mask_id``s, its context the row's target features before the anchor, and
block position d (1 .. B - 1) learns the target's distribution of the token at anchor + d (its
logits at anchor + d - 1) by a token loss (``losses.TOKEN_LOSSES``, ``kl`` by default), weighted
``exp(-(d - 1) / gamma)``: the early positions, which every accepted run passes through, count
most. Positions whose token is not counted (prompt, padding, past a document's end) weigh 0.
The metrics give each position's top-1 agreement with the target and the expected accepted
length of a greedy chain (``accept_len``: the mean run of agreeing positions from the first,
plus the target's own token), the τ a block chain would reach on the batch.
"""

import dataclasses
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from specjax import losses, parallel
from specjax.drafters import anchored, artifact, prompt_lookup
from specjax.drafters.base import sampled_candidates
from specjax.drafters.dflash import model
from specjax.drafters.dflash.drafter import DFlash, parse_tree
from specjax.drafters.dflash.model import DFlashConfig
from specjax.models import llama
from specjax.models.cache import KVCache
from specjax.models.config import ModelConfig
from specjax.typing import Params

FIELD = "config.objective.dflash"


@dataclasses.dataclass(frozen=True)
class DFlashBlocks:
  """DFlash layers on the frozen target's fused features, trained on anchored blocks."""

  target_cfg: ModelConfig
  dflash: DFlashConfig
  vocab_ids: tuple | None = None  # the draft vocabulary's target ids (reduced); None = all
  anchors: int = 16  # blocks per row per step
  gamma: float = 4.0  # position d weighs exp(-(d - 1) / gamma)
  token_loss: str = "kl"
  init_from: str = ""
  name: str = "dflash"
  rules: parallel.Rules = ()
  frozen_rules: parallel.Rules = llama.RULES

  @staticmethod
  def config() -> ml_collections.ConfigDict:
    """``config.objective.dflash``: the drafter's shape and how it is trained."""
    c = ml_collections.ConfigDict()
    c.feature_layers = (1,)  # target layers fused (specjax indices: the stream after the layer)
    c.num_layers = 1  # draft layers
    c.block_size = 8  # B: the anchor and B - 1 drafted positions
    c.mask_id = 0  # the token at masked positions (a rarely used one; the target's embedding)
    c.ffn_dim = 0  # the draft layers' MLP width (0 = the target's)
    # The draft vocabulary V': the most frequent next tokens of the training rows (stop tokens
    # always in), the rows of the target's head a block scores; 0 = the whole vocabulary. The
    # head over 7 positions is most of a step's cost: V' buys it back.
    c.vocab_size = 0
    c.anchors = 16  # blocks per row per step
    c.gamma = 4.0  # position weight exp(-(d - 1) / gamma) (the paper: 7 for B = 16, 4 for 8)
    c.loss = "kl"  # the token loss (specjax.losses.TOKEN_LOSSES)
    c.init_from = ""  # a trained DFlash drafter (its dflash.json directory) to continue from
    return c

  @classmethod
  def check(cls, c: ml_collections.ConfigDict) -> None:
    losses.check_token_loss(c.loss, f"{FIELD}.loss")
    if isinstance(c.anchors, bool) or int(c.anchors) != c.anchors or c.anchors < 1:
      raise ValueError(f"{FIELD}.anchors must be an integer >= 1, got {c.anchors!r}.")
    if not c.gamma > 0:
      raise ValueError(f"{FIELD}.gamma must be > 0, got {c.gamma}.")
    if c.init_from:
      model.read_meta(c.init_from, f"{FIELD}.init_from")

  @classmethod
  def build(cls, c: ml_collections.ConfigDict, target: ModelConfig) -> "DFlashBlocks":
    try:
      cfg = DFlashConfig(target, tuple(c.feature_layers), c.num_layers, c.block_size, c.mask_id,
                         c.ffn_dim, c.vocab_size)  # fmt: skip
    except ValueError as e:
      raise ValueError(f"{FIELD}: {e}") from None
    if c.init_from:
      saved = DFlashConfig.fromdict(model.read_meta(c.init_from, f"{FIELD}.init_from")["dflash"])
      if dataclasses.replace(saved, target=target) != cfg:
        raise ValueError(
          f"{FIELD}.init_from={c.init_from!r} is a drafter of another shape ({saved.asdict()}): "
          "set the objective's fields to its own."
        )
    return cls(target, cfg, None, c.anchors, c.gamma, c.loss, c.init_from)

  def describe(self) -> str:
    shapes = model.param_shapes(self.dflash)
    is_shape = lambda x: isinstance(x, tuple)  # noqa: E731
    n = sum(int(np.prod(s)) for s in jax.tree.leaves(shapes, is_leaf=is_shape))
    d = self.dflash
    return (
      f"DFlash drafter, {d.num_layers} layer(s) over features {list(d.feature_layers)}, blocks "
      f"of {d.block_size}, {self.anchors} per row ({n / 1e6:.2f} M trained params)"
    )

  def init(self, key: jax.Array, frozen: Params) -> Params:
    if self.init_from:
      cfg, params, _ = model.load_trained(self.init_from)
      return {k: params[k] for k in model.TRAINED}
    return model.init_params(self.dflash, key)

  def model_params(self, params: Params, frozen: Params) -> Params:
    return dict(params) | model.frozen_params(frozen, self.target_cfg, self.vocab_ids)

  def cached_features(self) -> tuple:
    """The fused features, then the final one (the target's logits, the labels)."""
    return tuple(dict.fromkeys(self.dflash.feature_layers + (llama.FINAL,)))

  def loss(self, params, frozen, batch, key):
    tokens_BxT, mask_BxT = batch["tokens"], batch["mask"]
    b, t = tokens_BxT.shape
    k, a = self.dflash.block_size, self.anchors
    final_BxTxF, feats_BxTxG = anchored.target_features(
      frozen, self.target_cfg, batch, self.cached_features(), len(self.dflash.feature_layers)
    )
    # Anchors: positions whose block fits and whose first drafted token counts.
    pos_T = jnp.arange(t)
    valid = (pos_T[None] + k - 1 < t) & jnp.roll(mask_BxT.astype(bool), -1, axis=1)
    anchor_BxA, used_BxA = anchored.draw(valid, key, a)
    # Every row's context K/V once, each anchor's block against its row's.
    p = self.model_params(params, frozen)
    ks, vs = model.context_kv(p, self.dflash, feats_BxTxG, jnp.broadcast_to(pos_T, (b, t)))
    rows = lambda x: jnp.repeat(x, a, axis=0)  # noqa: E731  [B, ...] -> [B * A, ...]
    anchor_R, used_R = anchor_BxA.reshape(-1), used_BxA.reshape(-1)
    cache = KVCache(k=tuple(map(rows, ks)), v=tuple(map(rows, vs)), lengths=anchor_R)
    block_R = anchor_R[:, None] + jnp.arange(k)[None]
    first_R = jnp.take_along_axis(tokens_BxT, anchor_BxA, axis=1).reshape(-1)
    out_RxKxV = model.block_logits(p, self.dflash, cache, model.block_tokens(self.dflash, first_R),
                                   block_R)[:, 1:]  # fmt: skip
    # Labels: the target's distribution of the token at anchor + d (its head at those positions
    # only, over the draft vocabulary's rows).
    row_R = jnp.repeat(jnp.arange(b), a)
    target_RxDxV, counted_RxD = anchored.labels(final_BxTxF, p["head"], mask_BxT, row_R,
                                                block_R[:, 1:], used_R)  # fmt: skip
    per_RxD = losses.token_loss(self.token_loss, jax.nn.softmax(target_RxDxV, -1),
                                jax.nn.log_softmax(out_RxKxV, -1))  # fmt: skip
    decay_D = jnp.exp(-jnp.arange(k - 1) / self.gamma)
    loss = jnp.sum(per_RxD * counted_RxD * decay_D) / (jnp.sum(counted_RxD) + 1e-6)
    return loss, anchored.metrics(out_RxKxV, target_RxDxV, counted_RxD, used_R)

  def signature(self) -> dict[str, Any]:
    return {
      "objective": self.name,
      "dflash": self.dflash.asdict() | {"target": self.target_cfg.name},
      "anchors": self.anchors,
      "gamma": self.gamma,
      "loss": self.token_loss,
      "init_from": self.init_from,
    }

  def drafter(self, config: ml_collections.ConfigDict) -> DFlash:
    """The trained shape, drafting the tree of ``config.drafter.dflash`` (a chain by default)."""
    c = config.drafter.dflash
    tree = parse_tree(c, self.dflash.num_draft)
    return DFlash(self.dflash, tree, sampled_candidates(c, model.FIELD), prompt_lookup.branch(c))

  def export(self, directory: Path, params: Params, target) -> Path:
    """The drafter that ``drafter.dflash.path`` loads (with the target's fingerprint)."""
    return model.save(directory, self.dflash, params, target)

  def with_data(self, dataset, tokenizer) -> "DFlashBlocks":
    """The draft vocabulary: ``init_from``'s, or the training rows' most frequent tokens."""
    if self.init_from:
      _, trained, _ = model.load_trained(self.init_from)
      ids = trained.get("vocab_ids")
      return dataclasses.replace(self, vocab_ids=None if ids is None else tuple(map(int, ids)))
    if not self.dflash.vocab_size:
      return self
    v = self.target_cfg.vocab_size
    ids = artifact.frequent_ids(dataset, v, self.dflash.vocab_size, tokenizer)
    return dataclasses.replace(self, vocab_ids=ids)
