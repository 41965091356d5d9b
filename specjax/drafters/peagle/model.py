"""P-EAGLE's model: its config, parameters, the block forward that drafts ``num_depths`` tokens
in one call, and specjax's save. It is the published EAGLE-3 layer (``drafters/eagle/model.py``,
architecture ``eagle3``) plus one trained vector, ``mask_hidden``: the features a masked row
reads in place of the target's. The decoding side is ``drafter.py``; the package docstring
describes both.
"""

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.drafters import artifact
from specjax.drafters.eagle import model as eagle
from specjax.models import llama
from specjax.models.cache import KVCache

FIELD = "config.drafter.peagle"
TRAINED = eagle.TRAINED_BY["eagle3"] + ("mask_hidden",)  # what training changes, a save stores
WEIGHTS_FILE, META_FILE = "peagle.safetensors", "peagle.json"
FORMAT = 1


@dataclasses.dataclass(frozen=True)
class PEagleConfig:
  """Shapes of a P-EAGLE drafter (static; hashable): an EAGLE-3 layer, ``num_depths`` rows per
  forward (the anchor pair, then ``num_depths - 1`` masked rows), ``mask_id`` their token."""

  eagle: eagle.EagleConfig  # architecture "eagle3"
  num_depths: int = 8  # K: tokens drafted per forward
  mask_id: int = 0

  def __post_init__(self):
    if self.eagle.architecture != "eagle3":
      raise ValueError(
        f"{FIELD}: P-EAGLE is the published EAGLE-3 layer with masked rows; this drafter's "
        f"architecture is {self.eagle.architecture!r}."
      )
    k = self.num_depths
    if isinstance(k, bool) or int(k) != k or k < 1:
      raise ValueError(f"{FIELD}.num_depths must be an integer >= 1, got {k!r}.")
    if not 0 <= self.mask_id < self.target.vocab_size:
      raise ValueError(
        f"{FIELD}.mask_id={self.mask_id} is not a token of the target's vocabulary "
        f"(0..{self.target.vocab_size - 1})."
      )

  @property
  def target(self):
    return self.eagle.target

  @property
  def feature_width(self) -> int:
    """nF: the concatenated target features a row reads (``mask_hidden``'s width)."""
    return self.target.dim * len(self.eagle.feature_layers)

  def asdict(self) -> dict:
    return {"eagle": self.eagle.asdict(), "num_depths": self.num_depths, "mask_id": self.mask_id}

  @classmethod
  def fromdict(cls, d: dict) -> "PEagleConfig":
    return cls(eagle.EagleConfig.fromdict(d["eagle"]), d["num_depths"], d["mask_id"])


def param_shapes(cfg: PEagleConfig) -> dict[str, tuple[int, ...]]:
  """Every parameter's shape but the target's embedding, by flat name."""
  return eagle.param_shapes(cfg.eagle) | {"mask_hidden": (cfg.feature_width,)}


def init_params(cfg: PEagleConfig, key: jax.Array, target_params, vocab_ids) -> dict:
  """EAGLE-3's initial weights (its head from the target's rows) and a random ``mask_hidden``
  (standard normal, as speculators draws it)."""
  k_layer, k_mask = jax.random.split(key)
  params = eagle.init_params(cfg.eagle, k_layer, target_params, vocab_ids)
  return params | {"mask_hidden": jax.random.normal(k_mask, (cfg.feature_width,))}


def frozen_params(cfg: PEagleConfig, target_params, vocab_ids) -> dict:
  return eagle.frozen_params(cfg.eagle, target_params, vocab_ids)


def pair_kv(params, cfg: PEagleConfig, tokens_BxT, features_BxTxnF, positions_BxT):
  """The layer's keys and values of pairs ``(features_i, tokens_i)`` at ``positions``."""
  e = cfg.eagle
  x = eagle.inputs(params, e, tokens_BxT, eagle.fuse(params, features_BxTxnF))
  return eagle.pair_kv(params, e, x, positions_BxT)


def block_logits(params, cfg: PEagleConfig, cache: KVCache, token_B, features_BxnF, pos_B):
  """Logits ``[B, K, V']`` of one block: the anchor pair (``features``, ``token``) at position
  ``pos`` and ``K - 1`` masked rows (``mask_id``, ``mask_hidden``) after it, each attending to
  the cached pairs ``[0, cache.lengths)`` and causally to the rows before it in the block. Row
  d drafts the token d + 1 places after ``token``."""
  e, k = cfg.eagle, cfg.num_depths
  b = token_B.shape[0]
  masks = jnp.full((b, k - 1), cfg.mask_id, jnp.int32)
  tokens_BxK = jnp.concatenate([token_B[:, None].astype(jnp.int32), masks], axis=1)
  hidden = jnp.broadcast_to(params["mask_hidden"].astype(features_BxnF.dtype),
                            (b, k - 1, features_BxnF.shape[-1]))  # fmt: skip
  feats_BxKxnF = jnp.concatenate([features_BxnF[:, None], hidden], axis=1)
  x = eagle.inputs(params, e, tokens_BxK, eagle.fuse(params, feats_BxKxnF))
  positions = pos_B[:, None] + jnp.arange(k)[None]
  attn = llama.attention_inputs(cache.lengths, llama.causal_mask(k), cache.num_slots, write=False)
  out, _, _ = eagle.layer(params, e, x, positions, cache.k[0], cache.v[0], attn)
  return eagle.logits(params, e, out)


def anchored_logits(params, cfg: PEagleConfig, tokens_1xT, features_1xTxnF, anchors_A):
  """``[A, K, V']``: a block at each anchor pair ``a`` of one text (features of position a,
  token a + 1), its context the text's pairs before a; row d drafts token a + 2 + d (training,
  replay, and the reference comparison)."""
  t = tokens_1xT.shape[1]
  k, v = pair_kv(params, cfg, tokens_1xT[:, 1:], features_1xTxnF[:, :-1], jnp.arange(t - 1)[None])
  a = anchors_A.shape[0]
  tile = lambda x: jnp.broadcast_to(x, (a, *x.shape[1:]))  # noqa: E731
  cache = KVCache(k=(tile(k),), v=(tile(v),), lengths=anchors_A.astype(jnp.int32))
  return block_logits(params, cfg, cache, tokens_1xT[0, anchors_A + 1],
                      features_1xTxnF[0, anchors_A], anchors_A)  # fmt: skip


# --- saving and loading in specjax's layout -----------------------------------------------------


def save(directory, cfg: PEagleConfig, params: dict, target) -> Path:
  """The trained tensors (and ``vocab_ids``) and their config, tied to ``target``."""
  tensors = eagle.flatten({k: params[k] for k in TRAINED + ("vocab_ids",) if k in params})
  meta = {"format": FORMAT, "peagle": cfg.asdict(), "target": artifact.target_meta(target)}
  return artifact.save(directory, tensors, WEIGHTS_FILE, meta, META_FILE)


def read_meta(directory, field: str = f"{FIELD}.path") -> dict:
  hint = "point it at a directory written by task=train with objective.name=peagle (draft_final)"
  return artifact.read_meta(directory, META_FILE, FORMAT, field, hint, WEIGHTS_FILE)


def read_trained(directory) -> dict:
  return eagle.unflatten(artifact.read_tensors(directory, WEIGHTS_FILE))


def load_saved(directory, target, field: str = f"{FIELD}.path") -> tuple[PEagleConfig, dict, dict]:
  """``(cfg, decode params, meta)`` of a drafter specjax saved, checked against ``target``."""
  meta = read_meta(directory, field)
  cfg = PEagleConfig.fromdict(meta["peagle"])
  where = f"{field}={str(directory)!r}"
  artifact.check_target(meta, cfg.target.dim, cfg.target.vocab_size, target, where, "drafters")
  trained = read_trained(directory)
  vocab_ids = trained.pop("vocab_ids").astype(np.int32)
  artifact.check_vocab(vocab_ids, target, where)
  params = jax.tree.map(jnp.asarray, trained) | frozen_params(cfg, target.params, vocab_ids)
  return cfg, params, meta
