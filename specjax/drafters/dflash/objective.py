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
import optax

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


def _backbone(cfg: DFlashConfig) -> DFlashConfig:
  """``cfg`` without DSpark's heads: what ``init_from`` must share."""
  return dataclasses.replace(cfg, markov_rank=0, confidence=False, sample_from_anchor=False,
                             markov_head="vanilla", confidence_with_markov=True)  # fmt: skip


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
  confidence_weight: float = 1.0
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
    # DSpark (speculators' dspark): position k drafts the token at anchor + k + 1 (B a block);
    # a low-rank Markov logit bias from the token before each position (0 = none); a head
    # predicting each position's acceptance probability, trained to 1 - TV(q, p) by a binary
    # cross-entropy weighted confidence_weight. init_from may be a DFlash without these heads.
    c.sample_from_anchor = False
    c.markov_rank = 0
    c.markov_head = "vanilla"  # vanilla | gated | rnn
    c.confidence = False
    c.confidence_weight = 1.0
    return c

  @classmethod
  def check(cls, c: ml_collections.ConfigDict) -> None:
    losses.check_token_loss(c.loss, f"{FIELD}.loss")
    model.check_fields(lambda name: c[name], FIELD)
    if isinstance(c.anchors, bool) or int(c.anchors) != c.anchors or c.anchors < 1:
      raise ValueError(f"{FIELD}.anchors must be an integer >= 1, got {c.anchors!r}.")
    if not c.gamma > 0:
      raise ValueError(f"{FIELD}.gamma must be > 0, got {c.gamma}.")
    if not c.confidence_weight >= 0:
      raise ValueError(f"{FIELD}.confidence_weight must be >= 0, got {c.confidence_weight}.")
    if c.init_from:
      model.read_meta(c.init_from, f"{FIELD}.init_from")

  @classmethod
  def check_seq_len(cls, c: ml_collections.ConfigDict, seq_len: int) -> None:
    """A block lies inside its row, and a row has ``anchors`` positions whose block does."""
    b, a, row = c.block_size, c.anchors, f"config.data.seq_len={seq_len}"
    if b > seq_len:
      raise ValueError(
        f"{FIELD}.block_size={b} does not fit in a row of {row} tokens (a block is its anchor "
        "and the drafted positions after it, all in one row: no block would train): lower "
        "block_size or raise seq_len."
      )
    if a > seq_len - b + 1:
      raise ValueError(
        f"{FIELD}.anchors={a} exceeds the {seq_len - b + 1} anchor positions of a row "
        f"({row} - block_size={b} + 1, those whose block fits): lower anchors to at most "
        f"{seq_len - b + 1} or raise seq_len."
      )

  @classmethod
  def build(cls, c: ml_collections.ConfigDict, target: ModelConfig) -> "DFlashBlocks":
    try:
      llama.check_features(target, tuple(c.feature_layers))
    except ValueError as e:
      raise ValueError(f"{FIELD}.feature_layers: {e}") from None
    try:
      cfg = DFlashConfig(
        target, tuple(c.feature_layers), c.num_layers, c.block_size, c.mask_id, c.ffn_dim,
        c.vocab_size, bool(c.sample_from_anchor), c.markov_rank, c.markov_head,
        bool(c.confidence), confidence_with_markov=bool(c.markov_rank),
      )  # fmt: skip
    except ValueError as e:  # DFlashConfig names the drafter's fields: these are the objective's
      said = str(e).replace(model.FIELD, FIELD)
      raise ValueError(said if said.startswith(FIELD) else f"{FIELD}: {said}") from None
    if c.init_from:
      saved = DFlashConfig.fromdict(model.read_meta(c.init_from, f"{FIELD}.init_from")["dflash"])
      if _backbone(dataclasses.replace(saved, target=target)) != _backbone(cfg):
        raise ValueError(
          f"{FIELD}.init_from={c.init_from!r} is a drafter of another shape ({saved.asdict()}): "
          "set the objective's fields to its own."
        )
    return cls(target, cfg, None, c.anchors, c.gamma, c.loss, c.init_from,
               confidence_weight=c.confidence_weight)  # fmt: skip

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
    fresh = model.init_params(self.dflash, key)
    if not self.init_from:
      return fresh
    _, params, _ = model.load_trained(self.init_from)
    # The backbone from init_from; DSpark's heads from it where it has them, fresh otherwise.
    return {k: params[k] if k in params else fresh[k] for k in fresh}

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
    d, s = self.dflash.num_draft, self.dflash.first_slot  # depth d is block position d - 1 + s
    h_RxDxF = model.block_hidden(p, self.dflash, cache, model.block_tokens(self.dflash, first_R),
                                 block_R)[:, s:]  # fmt: skip
    out_RxDxV = model.head(p, h_RxDxF)
    prev_RxD = model.previous_tokens(self.dflash, tokens_BxT, anchor_BxA).reshape(b * a, k)[:, s:]
    bias, conf_RxD = model.teacher_forced(p, self.dflash, h_RxDxF, prev_RxD)
    if bias is not None:
      out_RxDxV = out_RxDxV + bias
    # Labels: the target's distribution of the token at anchor + d (its head at those positions
    # only, over the draft vocabulary's rows).
    row_R = jnp.repeat(jnp.arange(b), a)
    drafted_RxD = anchor_R[:, None] + 1 + jnp.arange(d)[None]
    target_RxDxV, counted_RxD = anchored.labels(final_BxTxF, p["head"], mask_BxT, row_R,
                                                drafted_RxD, used_R)  # fmt: skip
    p_RxDxV = jax.nn.softmax(target_RxDxV, -1)
    per_RxD = losses.token_loss(self.token_loss, p_RxDxV, jax.nn.log_softmax(out_RxDxV, -1))
    decay_D = jnp.exp(-jnp.arange(d) / self.gamma)
    weight_RxD = counted_RxD * decay_D
    loss = jnp.sum(per_RxD * weight_RxD) / (jnp.sum(counted_RxD) + 1e-6)
    metrics = anchored.metrics(out_RxDxV, target_RxDxV, counted_RxD, used_R)
    if conf_RxD is not None:  # trained to the acceptance probability sum min(q, p) = 1 - TV
      accept_RxD = jax.lax.stop_gradient(
        jnp.sum(jnp.minimum(jax.nn.softmax(out_RxDxV, -1), p_RxDxV), -1)
      )
      bce_RxD = optax.sigmoid_binary_cross_entropy(conf_RxD, accept_RxD)
      loss += self.confidence_weight * jnp.sum(bce_RxD * weight_RxD) / (jnp.sum(counted_RxD) + 1e-6)
      n = jnp.sum(counted_RxD) + 1e-6
      error_RxD = jnp.abs(jax.nn.sigmoid(conf_RxD) - accept_RxD)
      metrics |= {
        "accept_rate": jnp.sum(accept_RxD * counted_RxD) / n,
        "confidence_error": jnp.sum(error_RxD * counted_RxD) / n,
      }
    return loss, metrics

  def signature(self) -> dict[str, Any]:
    return {
      "objective": self.name,
      "dflash": self.dflash.asdict() | {"target": self.target_cfg.name},
      "anchors": self.anchors,
      "gamma": self.gamma,
      "loss": self.token_loss,
      "init_from": self.init_from,
      "confidence_weight": self.confidence_weight,
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
