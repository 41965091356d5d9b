"""DFlash's model: its config, parameters, and the block forward that drafts a whole block in
one call. The decoding side is ``drafter.py``; the package docstring describes both.
"""

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.drafters import artifact
from specjax.models import llama
from specjax.models.cache import KVCache
from specjax.models.config import ModelConfig

FIELD = "config.drafter.dflash"
TRAINED = ("fc", "hidden_norm", "layers", "norm")  # what training changes and a save stores


@dataclasses.dataclass(frozen=True)
class DFlashConfig:
  """Shapes of a DFlash drafter (static; hashable)."""

  target: ModelConfig  # the target's config (the draft layers have its widths)
  feature_layers: tuple = (0,)  # target layers whose residual streams are fused (specjax indices)
  num_layers: int = 1  # draft layers
  block_size: int = 8  # B: the anchor and B - 1 masked positions, drafted in one forward
  mask_id: int = 0  # the token fed at the masked positions (its embedding is the target's)
  ffn_dim: int = 0  # the draft layers' MLP width (0 = the target's)
  vocab_size: int = 0  # V': the draft vocabulary (the target's head rows it scores); 0 = all

  def __post_init__(self):
    llama.check_features(self.target, self.feature_layers)
    if not self.feature_layers or llama.FINAL in self.feature_layers:
      raise ValueError(
        f"{FIELD}.feature_layers: DFlash fuses residual streams of target layers (indices), "
        f"got {list(self.feature_layers)}."
      )
    sizes = (("num_layers", self.num_layers, 1), ("block_size", self.block_size, 2),
             ("ffn_dim", self.ffn_dim, 0), ("vocab_size", self.vocab_size, 0))  # fmt: skip
    for name, value, low in sizes:
      if isinstance(value, bool) or int(value) != value or value < low:
        raise ValueError(f"{FIELD}.{name} must be an integer >= {low}, got {value!r}.")
    if self.vocab_size > self.target.vocab_size:
      raise ValueError(
        f"{FIELD}.vocab_size={self.vocab_size} exceeds the target's vocabulary "
        f"({self.target.vocab_size}); 0 = all of it."
      )
    if not 0 <= self.mask_id < self.target.vocab_size:
      raise ValueError(
        f"{FIELD}.mask_id={self.mask_id} is not a token of the target's vocabulary "
        f"(0..{self.target.vocab_size - 1})."
      )

  @property
  def layer(self) -> ModelConfig:
    """The draft layers: the target's shapes, Qwen3's per-head q/k norms, no biases."""
    return dataclasses.replace(
      self.target, num_layers=self.num_layers, ffn_dim=self.ffn_dim or self.target.ffn_dim,
      qk_norm=True, qkv_bias=False, out_bias=False, mlp_bias=False, sliding_window=0,
      name=f"{self.target.name}-dflash",
    )  # fmt: skip

  @property
  def num_draft(self) -> int:
    """Draft tokens per block: every position after the anchor."""
    return self.block_size - 1

  def asdict(self) -> dict:
    return dataclasses.asdict(self) | {"feature_layers": list(self.feature_layers)}

  @classmethod
  def fromdict(cls, d: dict) -> "DFlashConfig":
    target = {k: tuple(v) if isinstance(v, list) else v for k, v in d["target"].items()}
    rest = {k: v for k, v in d.items() if k != "target"}
    rest["feature_layers"] = tuple(rest["feature_layers"])
    return cls(ModelConfig(**target), **rest)


def init_params(cfg: DFlashConfig, key: jax.Array) -> dict:
  """Random trainable weights: the fuse ``fc`` [F, nF], its norm, the layers, the final norm."""
  f = cfg.target.dim
  k_fc, k_layers = jax.random.split(key)
  n = f * len(cfg.feature_layers)
  fc = jax.random.normal(k_fc, (f, n)) / np.sqrt(n)
  layers = llama.init_params(cfg.layer, k_layers)["layers"]
  return {"fc": fc, "hidden_norm": jnp.ones((f,)), "layers": layers, "norm": jnp.ones((f,))}


def param_shapes(cfg: DFlashConfig) -> dict:
  """The trainable weights' shapes."""
  f = cfg.target.dim
  layers = [{k: tuple(v.shape) for k, v in layer.items()}
            for layer in llama.param_shapes(cfg.layer)["layers"]]  # fmt: skip
  return {"fc": (f, f * len(cfg.feature_layers)), "hidden_norm": (f,), "layers": layers,
          "norm": (f,)}  # fmt: skip


def frozen_params(target_params, target_cfg: ModelConfig, vocab_ids=None) -> dict:
  """What DFlash reads of the target: its embedding (the block's tokens) and its head, the
  rows of the draft vocabulary ``vocab_ids`` (its target ids) where it is reduced."""
  head = target_params["embed"] if target_cfg.tie_embeddings else target_params["lm_head"]
  out = {"embed": target_params["embed"], "head": head}
  if vocab_ids is not None:
    ids = jnp.asarray(vocab_ids, jnp.int32)
    out |= {"head": head[ids], "vocab_ids": ids}
  return out


def decode_params(trained: dict, target_params, target_cfg: ModelConfig) -> dict:
  """The trained tensors (with ``vocab_ids`` where the vocabulary is reduced) and what the
  drafter reads of the target."""
  ids = trained.get("vocab_ids")
  return {k: v for k, v in trained.items() if k != "vocab_ids"} | frozen_params(
    target_params, target_cfg, ids
  )


def fuse(params, cfg: DFlashConfig, features_BxTxnF: jax.Array) -> jax.Array:
  """The context: the target's features of committed positions, fused to F and normed."""
  h = llama.linear(features_BxTxnF, params["fc"])
  return llama.rms_norm(h, params["hidden_norm"], cfg.target.norm_eps)


def context_kv(params, cfg: DFlashConfig, features_BxTxnF, positions_BxT):
  """Every draft layer's keys and values ``[B, G, T, Dh]`` of the context positions: the
  layer's k/v projections (and k norm, rotation) of the fused features, no input norm."""
  h = fuse(params, cfg, features_BxTxnF)
  kv = [llama.qkv(p, cfg.layer, h, positions_BxT)[1:] for p in params["layers"]]
  return tuple(k for k, _ in kv), tuple(v for _, v in kv)


def write_context(cache: KVCache, params, cfg: DFlashConfig, features, positions, at_B):
  """``cache`` with the context K/V of ``features`` (at ``positions``) written from slot
  ``at_B[b]`` on (lengths unchanged)."""
  k, v = context_kv(params, cfg, features, positions)
  return llama.write_kv(cache, llama.NewKV(k, v), at_B)


def block_logits(params, cfg: DFlashConfig, cache: KVCache, tokens_BxK, positions_BxK):
  """Logits ``[B, K, V]`` of a block: its tokens (the anchor, then ``mask_id``s) attend to each
  other (non-causally) and to the context slots ``[0, cache.lengths)``, through every draft
  layer; then the final norm and the target's head."""
  k = tokens_BxK.shape[1]
  x = params["embed"][tokens_BxK].astype(jnp.float32)
  attn = llama.attention_inputs(cache.lengths, jnp.ones((k, k), bool), cache.num_slots, write=False)
  for p, k_i, v_i in zip(params["layers"], cache.k, cache.v, strict=True):
    x, _, _ = llama.block(p, cfg.layer, x, positions_BxK, k_i, v_i, attn)
  h = llama.rms_norm(x, params["norm"], cfg.target.norm_eps)
  return llama.linear(h, params["head"]).astype(jnp.float32)


def block_tokens(cfg: DFlashConfig, anchor_B: jax.Array) -> jax.Array:
  """``[B, block_size]``: each anchor, then ``mask_id`` at every position after it."""
  masks = jnp.full((anchor_B.shape[0], cfg.block_size - 1), cfg.mask_id, jnp.int32)
  return jnp.concatenate([anchor_B[:, None].astype(jnp.int32), masks], axis=1)


def anchored_logits(params, cfg: DFlashConfig, tokens_1xT, features_1xTxnF, anchors_A):
  """``[A, block_size, V]``: a block at each anchor position of one text, its context the
  text's features before the anchor (training, and the reference comparison)."""
  t = tokens_1xT.shape[1]
  k, v = context_kv(params, cfg, features_1xTxnF, jnp.arange(t)[None])
  a = anchors_A.shape[0]
  tile = lambda x: jnp.broadcast_to(x, (a, *x.shape[1:]))  # noqa: E731
  cache = KVCache(k=tuple(map(tile, k)), v=tuple(map(tile, v)), lengths=anchors_A.astype(jnp.int32))
  positions = anchors_A[:, None] + jnp.arange(cfg.block_size)[None]
  return block_logits(params, cfg, cache, block_tokens(cfg, tokens_1xT[0, anchors_A]), positions)


# --- saving and loading in specjax's layout -----------------------------------------------------

WEIGHTS_FILE, META_FILE = "dflash.safetensors", "dflash.json"
FORMAT = 1


def flat(params: dict) -> dict:
  """The trained tensors by name (``layers.{i}.{name}``), and ``vocab_ids`` where the draft
  vocabulary is reduced: what a save stores."""
  out = {k: params[k] for k in ("fc", "hidden_norm", "norm", "vocab_ids") if k in params}
  for i, layer in enumerate(params["layers"]):
    out |= {f"layers.{i}.{k}": v for k, v in layer.items()}
  return out


def unflat(tensors: dict, num_layers: int) -> dict:
  layers = [{} for _ in range(num_layers)]
  out = {}
  for name, value in tensors.items():
    if name.startswith("layers."):
      _, i, key = name.split(".", 2)
      layers[int(i)][key] = jnp.asarray(value)
    else:
      out[name] = jnp.asarray(value)
  return out | {"layers": tuple(layers)}


def save(directory, cfg: DFlashConfig, params: dict, target) -> Path:
  """The trained weights and their config, tied to ``target`` (its fingerprint)."""
  meta = {"format": FORMAT, "dflash": cfg.asdict(), "target": artifact.target_meta(target)}
  return artifact.save(directory, flat(params), WEIGHTS_FILE, meta, META_FILE)


def read_meta(directory, field: str = f"{FIELD}.path") -> dict:
  hint = "save one with specjax.drafters.dflash.model.save"
  return artifact.read_meta(directory, META_FILE, FORMAT, field, hint, WEIGHTS_FILE)


def load_saved(directory, target, field: str = f"{FIELD}.path") -> tuple[DFlashConfig, dict, dict]:
  """``(cfg, decode params, meta)`` of a drafter specjax saved, checked against ``target``."""
  meta = read_meta(directory, field)
  cfg = DFlashConfig.fromdict(meta["dflash"])
  t = cfg.target
  artifact.check_target(meta, t.dim, t.vocab_size, target, field, "DFlash drafter weights")
  params = unflat(artifact.read_tensors(directory, WEIGHTS_FILE), cfg.num_layers)
  return cfg, decode_params(params, target.params, target.cfg), meta


def load_trained(directory, field: str = f"{FIELD}.path") -> tuple[DFlashConfig, dict, dict]:
  """``(cfg, trained params, meta)`` of a saved drafter, without its target (to continue
  training it: ``objective.dflash.init_from``)."""
  meta = read_meta(directory, field)
  cfg = DFlashConfig.fromdict(meta["dflash"])
  return cfg, unflat(artifact.read_tensors(directory, WEIGHTS_FILE), cfg.num_layers), meta
