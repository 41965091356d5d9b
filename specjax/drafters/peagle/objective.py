"""P-EAGLE's training (``config.objective.name = "peagle"``; the interface is
``train/objectives.py``'s ``Objective``): the EAGLE-3 layer trained to draft K tokens from one
anchor pair.

Each row of target-written text gets ``anchors`` random anchor pairs a (drawn without
replacement among those whose first drafted token counts); at each, the block is the pair
(features of a, token a + 1) then K - 1 masked rows (``mask_id``, ``mask_hidden``), its
context the row's pairs before a, and row d (0 .. K - 1) learns the target's distribution of
token a + 2 + d (its logits at a + 1 + d) by a token loss (``losses.TOKEN_LOSSES``, ``kl`` by
default, as speculators'). speculators trains P-EAGLE by COD sampling: depth d keeps a share
max(r^d, r_min) of the positions (r = 0.7, r_min = 0.2); here every anchor trains every depth
and depth d's loss is weighted by that share, the same expected weight with static shapes. The
metrics give top-1 agreement per depth and the greedy chain's expected accepted length
(``accept_len``). ``init_from`` continues a P-EAGLE drafter, or starts from an EAGLE-3 drafter
of the published architecture (its layer, fuse, head and vocabulary; ``mask_hidden`` new).
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
from specjax.drafters.eagle import model as eagle
from specjax.drafters.peagle import model
from specjax.drafters.peagle.drafter import PEagle, parse_tree
from specjax.drafters.peagle.model import PEagleConfig
from specjax.models import llama
from specjax.models.cache import KVCache
from specjax.models.config import ModelConfig
from specjax.typing import Params

FIELD = "config.objective.peagle"


def _saved(path: str) -> tuple[str, dict]:
  """``("peagle" | "eagle", meta)`` of an ``init_from`` directory."""
  if (Path(path) / model.META_FILE).is_file():
    return "peagle", model.read_meta(path, f"{FIELD}.init_from")
  return "eagle", eagle.read_meta(path, f"{FIELD}.init_from")


@dataclasses.dataclass(frozen=True)
class PEagleBlocks:
  """P-EAGLE (an EAGLE-3 layer with masked rows) on the frozen target's features."""

  target_cfg: ModelConfig
  peagle: PEagleConfig
  vocab_ids: tuple | None = None  # the draft vocabulary's target ids; None = all
  anchors: int = 16  # blocks per row per step
  cod_ratio: float = 0.7  # depth d weighs max(cod_ratio ** d, cod_min)
  cod_min: float = 0.2
  token_loss: str = "kl"
  init_from: str = ""
  name: str = "peagle"
  rules: parallel.Rules = ()
  frozen_rules: parallel.Rules = llama.RULES

  @staticmethod
  def config() -> ml_collections.ConfigDict:
    """``config.objective.peagle``: the drafter's shape and how it is trained."""
    c = ml_collections.ConfigDict()
    c.feature_layers = (0,)  # target layers read (specjax indices: the stream after the layer)
    c.num_depths = 8  # K: tokens drafted per forward
    c.mask_id = 0  # the token of the masked rows (a rarely used one)
    c.vocab_size = 0  # draft vocabulary V' (0 = the target's): the most frequent training tokens
    c.ffn_dim = 0  # the layer's MLP width (0 = the target's)
    c.anchors = 16  # blocks per row per step
    c.cod_ratio = 0.7  # depth weights max(cod_ratio ** d, cod_min): COD sampling's shares
    c.cod_min = 0.2
    c.loss = "kl"  # the token loss (specjax.losses.TOKEN_LOSSES)
    # A P-EAGLE drafter (peagle.json) to continue, or an EAGLE-3 drafter of the published
    # architecture (eagle.json) to start from; its shape and vocabulary are kept.
    c.init_from = ""
    return c

  @classmethod
  def check(cls, c: ml_collections.ConfigDict) -> None:
    losses.check_token_loss(c.loss, f"{FIELD}.loss")
    if isinstance(c.anchors, bool) or int(c.anchors) != c.anchors or c.anchors < 1:
      raise ValueError(f"{FIELD}.anchors must be an integer >= 1, got {c.anchors!r}.")
    if not (0 < c.cod_ratio <= 1 and 0 <= c.cod_min <= 1):
      raise ValueError(
        f"{FIELD}: cod_ratio must be in (0, 1] and cod_min in [0, 1], got {c.cod_ratio} and "
        f"{c.cod_min}."
      )
    if int(c.vocab_size) != c.vocab_size or c.vocab_size < 0:
      raise ValueError(f"{FIELD}.vocab_size must be an integer >= 0 (0 = the target's).")
    if isinstance(c.num_depths, bool) or not isinstance(c.num_depths, int) or c.num_depths < 1:
      raise ValueError(
        f"{FIELD}.num_depths must be an integer >= 1 (tokens drafted per forward), got "
        f"{c.num_depths!r}."
      )
    if c.init_from:
      _saved(c.init_from)

  @classmethod
  def check_seq_len(cls, c: ml_collections.ConfigDict, seq_len: int) -> None:
    """Depth d of anchor pair a learns the token at a + 2 + d: a row of T tokens has T - 2
    anchor pairs, and depths up to T - 3."""
    row = f"config.data.seq_len={seq_len}"
    if c.num_depths > seq_len - 2:
      raise ValueError(
        f"{FIELD}.num_depths={c.num_depths} exceeds what a row of {row} tokens can label "
        f"(depth d learns the token 2 + d after its anchor: at most seq_len - 2 = "
        f"{seq_len - 2} depths; the others would never train): lower num_depths or raise seq_len."
      )
    if c.anchors > seq_len - 2:
      raise ValueError(
        f"{FIELD}.anchors={c.anchors} exceeds the {seq_len - 2} anchor pairs of a row ({row} "
        f"- 2): lower anchors to at most {seq_len - 2} or raise seq_len."
      )

  @classmethod
  def build(cls, c: ml_collections.ConfigDict, target: ModelConfig) -> "PEagleBlocks":
    layers, vocab, ffn = tuple(c.feature_layers), c.vocab_size, c.ffn_dim
    if c.init_from:  # its shape, not the fields'
      kind, meta = _saved(c.init_from)
      saved = (PEagleConfig.fromdict(meta["peagle"]).eagle if kind == "peagle"
               else eagle.EagleConfig.fromdict(meta["eagle"]))  # fmt: skip
      if saved.architecture != "eagle3" or saved.target.dim != target.dim:
        raise ValueError(
          f"{FIELD}.init_from={c.init_from!r} is a drafter of architecture "
          f"{saved.architecture!r} for a {saved.target.dim}-wide target: P-EAGLE starts from "
          f"the published EAGLE-3 (architecture eagle3) of a {target.dim}-wide one."
        )
      layers, vocab, ffn = saved.feature_layers, saved.vocab_size, saved.ffn_dim
    try:
      llama.check_features(target, layers)
    except ValueError as e:
      raise ValueError(f"{FIELD}.feature_layers: {e}") from None
    try:
      ecfg = eagle.EagleConfig(target, layers, vocab, ffn_dim=ffn, architecture="eagle3")
      cfg = PEagleConfig(ecfg, c.num_depths, c.mask_id)
    except ValueError as e:  # the configs name the drafter's fields: these are the objective's
      said = str(e).replace(model.FIELD, FIELD).replace(eagle.FIELD, FIELD)
      raise ValueError(said if said.startswith(FIELD) else f"{FIELD}: {said}") from None
    return cls(target, cfg, None, c.anchors, c.cod_ratio, c.cod_min, c.loss, c.init_from)

  def describe(self) -> str:
    n = sum(int(np.prod(s)) for k, s in model.param_shapes(self.peagle).items()
            if k.partition(".")[0] in model.TRAINED)  # fmt: skip
    p = self.peagle
    return (
      f"P-EAGLE drafter (EAGLE-3 layer) reading {list(p.eagle.feature_layers)}, {p.num_depths} "
      f"tokens per forward, draft vocabulary {p.eagle.draft_vocab}, {self.anchors} blocks per "
      f"row ({n / 1e6:.2f} M trained params)"
    )

  def with_data(self, dataset, tokenizer) -> "PEagleBlocks":
    """The draft vocabulary: ``init_from``'s, or the training rows' most frequent tokens."""
    if self.init_from:
      kind, _ = _saved(self.init_from)
      read = model.read_trained if kind == "peagle" else eagle.read_trained
      ids = read(self.init_from)["vocab_ids"]
      return dataclasses.replace(self, vocab_ids=tuple(int(i) for i in ids))
    if not self.peagle.eagle.vocab_size:
      return self
    ids = artifact.frequent_ids(dataset, self.target_cfg.vocab_size,
                                self.peagle.eagle.vocab_size, tokenizer)  # fmt: skip
    return dataclasses.replace(self, vocab_ids=ids)

  def _vocab(self) -> jax.Array:
    if self.vocab_ids is None:
      return jnp.arange(self.peagle.eagle.draft_vocab, dtype=jnp.int32)
    return jnp.asarray(self.vocab_ids, jnp.int32)

  def init(self, key: jax.Array, frozen: Params) -> Params:
    fresh = model.init_params(self.peagle, key, frozen, self._vocab())
    if self.init_from:
      kind, _ = _saved(self.init_from)
      read = model.read_trained if kind == "peagle" else eagle.read_trained
      trained = {k: jax.tree.map(jnp.asarray, v) for k, v in read(self.init_from).items()
                 if k in model.TRAINED}  # fmt: skip
      return {k: trained.get(k, fresh[k]) for k in model.TRAINED}
    return {k: fresh[k] for k in model.TRAINED}

  def model_params(self, params: Params, frozen: Params) -> Params:
    return dict(params) | model.frozen_params(self.peagle, frozen, self._vocab())

  def cached_features(self) -> tuple:
    """The features read, then the final one (the target's logits, the labels)."""
    return tuple(dict.fromkeys(self.peagle.eagle.feature_layers + (llama.FINAL,)))

  def depth_weights(self) -> jax.Array:
    d = jnp.arange(self.peagle.num_depths)
    return jnp.maximum(self.cod_ratio**d, self.cod_min)

  def loss(self, params, frozen, batch, key):
    tokens_BxT, mask_BxT = batch["tokens"], batch["mask"]
    b, t = tokens_BxT.shape
    k, a = self.peagle.num_depths, self.anchors
    final_BxTxF, feats_BxTxG = anchored.target_features(
      frozen, self.target_cfg, batch, self.cached_features(), len(self.peagle.eagle.feature_layers)
    )
    # Anchor pairs a in [0, T - 2) whose first drafted token (a + 2) counts.
    pos_T = jnp.arange(t)
    valid = (pos_T[None] + 2 < t) & jnp.roll(mask_BxT.astype(bool), -2, axis=1)
    anchor_BxA, used_BxA = anchored.draw(valid, key, a)
    p = self.model_params(params, frozen)
    pairs = jnp.broadcast_to(pos_T[: t - 1], (b, t - 1))
    kk, vv = model.pair_kv(p, self.peagle, tokens_BxT[:, 1:], feats_BxTxG[:, :-1], pairs)
    rows = lambda x: jnp.repeat(x, a, axis=0)  # noqa: E731  [B, ...] -> [B * A, ...]
    anchor_R, used_R = anchor_BxA.reshape(-1), used_BxA.reshape(-1)
    row_R = jnp.repeat(jnp.arange(b), a)
    cache = KVCache(k=(rows(kk),), v=(rows(vv),), lengths=anchor_R)
    out_RxKxV = model.block_logits(p, self.peagle, cache, tokens_BxT[row_R, anchor_R + 1],
                                   feats_BxTxG[row_R, anchor_R], anchor_R)  # fmt: skip
    # Labels: the target's distribution of token a + 2 + d (its head's draft-vocabulary rows).
    head = artifact.target_head(frozen, self.target_cfg)[self._vocab()]
    drafted_RxK = anchor_R[:, None] + 2 + jnp.arange(k)[None]
    target_RxKxV, counted = anchored.labels(final_BxTxF, head, mask_BxT, row_R, drafted_RxK,
                                            used_R)  # fmt: skip
    per_RxK = losses.token_loss(self.token_loss, jax.nn.softmax(target_RxKxV, -1),
                                jax.nn.log_softmax(out_RxKxV, -1))  # fmt: skip
    weight_K = self.depth_weights()
    loss = jnp.sum(per_RxK * counted * weight_K) / (jnp.sum(counted * weight_K) + 1e-6)
    return loss, anchored.metrics(out_RxKxV, target_RxKxV, counted, used_R)

  def signature(self) -> dict[str, Any]:
    return {
      "objective": self.name,
      "peagle": self.peagle.asdict() | {"target": self.target_cfg.name},
      "anchors": self.anchors,
      "cod": [self.cod_ratio, self.cod_min],
      "loss": self.token_loss,
      "init_from": self.init_from,
    }

  def drafter(self, config: ml_collections.ConfigDict) -> PEagle:
    """The trained shape, drafting the tree of ``config.drafter.peagle`` (a chain by default)."""
    c = config.drafter.peagle
    tree = parse_tree(c, self.peagle.num_depths)
    return PEagle(self.peagle, tree, sampled_candidates(c, model.FIELD), prompt_lookup.branch(c))

  def export(self, directory: Path, params: Params, target) -> Path:
    """The drafter that ``drafter.peagle.path`` loads (with the target's fingerprint)."""
    return model.save(directory, self.peagle, params, target)
