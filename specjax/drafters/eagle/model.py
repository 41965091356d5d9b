"""EAGLE's model: its config, parameters, the layer over (token, feature) pairs, its head over
the draft vocabulary, and saving/loading a trained drafter. The decoding side (the dynamic
tree) is ``drafter.py``; the package docstring describes both.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax.drafters import artifact
from specjax.models import llama
from specjax.models.config import ModelConfig

FIELD = "config.drafter.eagle"
WEIGHTS_FILE, META_FILE = "eagle.safetensors", "eagle.json"
FORMAT = 1
TRAINED = ("fuse", "fc", "fc_b", "layer", "norm")  # what training changes (fuse: EAGLE-3 only)
# What a pair feeds the layer (the paper's input ablation): both halves of fc's input, or one
# with the other zeroed ("feature": the draft cannot see which token was chosen; "token": a
# one-layer model over the text's embeddings that never reads the target's state).
INPUTS = ("feature+token", "feature", "token")


@dataclasses.dataclass(frozen=True)
class EagleConfig:
  """Shapes of an EAGLE drafter (static; hashable)."""

  target: ModelConfig  # the target's config (the drafter's layer has its shapes)
  feature_layers: tuple = ("final",)  # EAGLE-1: ("final",); EAGLE-3: three layer indices
  vocab_size: int = 0  # V' (0 = the target's)
  inputs: str = "feature+token"  # one of INPUTS
  ffn_dim: int = 0  # the layer's MLP width (0 = the target's)

  def __post_init__(self):
    if self.inputs not in INPUTS:
      raise ValueError(f"EAGLE inputs={self.inputs!r} is unknown; choose one of {INPUTS}.")
    if int(self.ffn_dim) != self.ffn_dim or self.ffn_dim < 0:
      raise ValueError(
        f"EAGLE ffn_dim={self.ffn_dim} must be an integer >= 0 (0 = the target's MLP width)."
      )
    llama.check_features(self.target, self.feature_layers)
    if not self.feature_layers:
      raise ValueError(f"{FIELD}: an EAGLE drafter reads at least one target feature.")
    if not 0 <= self.vocab_size <= self.target.vocab_size:
      raise ValueError(
        f"EAGLE: the draft vocabulary ({self.vocab_size}) must be in [1, "
        f"{self.target.vocab_size}] (0 = the target's)."
      )

  @property
  def layer(self) -> ModelConfig:
    return dataclasses.replace(
      self.target, num_layers=1, ffn_dim=self.mlp_width, name=f"{self.target.name}-eagle"
    )

  @property
  def mlp_width(self) -> int:
    return self.ffn_dim or self.target.ffn_dim

  @property
  def draft_vocab(self) -> int:
    return self.vocab_size or self.target.vocab_size

  @property
  def fused(self) -> bool:
    return len(self.feature_layers) > 1

  def asdict(self) -> dict:
    return {
      "target": dataclasses.asdict(self.target),
      "feature_layers": list(self.feature_layers),
      "vocab_size": self.vocab_size,
      "inputs": self.inputs,
      "ffn_dim": self.ffn_dim,
    }

  @classmethod
  def fromdict(cls, d: dict) -> "EagleConfig":
    layers = tuple(f if f == llama.FINAL else int(f) for f in d["feature_layers"])
    inputs = d.get("inputs", INPUTS[0])  # drafters saved before the ablation read both
    ffn_dim = d.get("ffn_dim", 0)  # drafters saved before it have the target's MLP width
    return cls(ModelConfig(**d["target"]), layers, d["vocab_size"], inputs, ffn_dim)


# --- the drafter's computation, shared by decoding and training --------------------------------


def init_params(cfg: EagleConfig, key: jax.Array, target_params, vocab_ids, copy_layer=None):
  """Trained weights (random, or the target's layer ``copy_layer``) and the frozen ones read
  from the target: its embedding, and its head's ``vocab_ids`` rows as the projection."""
  k_layer, k_fc, k_fuse = jax.random.split(key, 3)
  f = cfg.target.dim
  if copy_layer is None:
    layer = _fresh_layer(cfg, k_layer)
  else:
    layer = dict(target_params["layers"][copy_layer])
  fc = jax.random.normal(k_fc, (f, 2 * f)) / np.sqrt(2 * f)
  params = {"fc": fc, "fc_b": jnp.zeros((f,)), "layer": layer, "norm": target_params["final_norm"]}
  if cfg.fused:
    n = len(cfg.feature_layers)
    params["fuse"] = jax.random.normal(k_fuse, (f, n * f)) / np.sqrt(n * f)
  return params | frozen_params(cfg, target_params, vocab_ids)


def widen(trained: dict, cfg: EagleConfig, key: jax.Array) -> dict:
  """A trained drafter's tensors with its layer's MLP widened to ``cfg.mlp_width``: the new
  hidden units' gate and up rows random (as a fresh layer's), their down-projection columns
  zero, so the wider drafter computes what the narrower one did (up to the order of float
  sums) and training grows the new units from there. Tensors already that wide are returned
  as they are."""
  layer = trained["layer"]
  have, want = layer["w_gate"].shape[0], cfg.mlp_width
  if have > want:
    raise ValueError(
      f"EAGLE: a drafter with an MLP {have} wide cannot be narrowed to {want}: set ffn_dim to "
      f"{have} or more (0 keeps the drafter's width)."
    )
  if have == want:
    return trained
  fresh = _fresh_layer(cfg, key)
  grown = dict(layer)
  for name in ("w_gate", "w_up", "b_gate", "b_up"):  # [ffn, dim] or [ffn] (mlp_bias): new rows
    if name in layer:
      grown[name] = jnp.concatenate([layer[name], fresh[name][have:]], axis=0)
  down = layer["w_down"]  # [dim, ffn]: new columns, zero
  grown["w_down"] = jnp.concatenate([down, jnp.zeros((down.shape[0], want - have), down.dtype)], 1)
  return trained | {"layer": grown}


def _fresh_layer(cfg: EagleConfig, key: jax.Array) -> dict:
  """A randomly initialised layer of the drafter's shapes (``llama.init_params``'s scheme)."""
  return llama.init_params(dataclasses.replace(cfg.layer, vocab_size=1), key)["layers"][0]


def frozen_params(cfg: EagleConfig, target_params, vocab_ids) -> dict:
  ids = jnp.asarray(vocab_ids, jnp.int32)
  head = artifact.target_head(target_params, cfg.target)
  return {"embed": target_params["embed"], "proj": head[ids], "vocab_ids": ids}


def fuse(params, f_xFin: jax.Array) -> jax.Array:
  """``s``: the feature the drafter reads, ``[..., F]`` (EAGLE-3: a linear map of the layers)."""
  return llama.linear(f_xFin, params["fuse"]) if "fuse" in params else f_xFin


def inputs(params, cfg: EagleConfig, tokens_BxT: jax.Array, s_BxTxF: jax.Array) -> jax.Array:
  """``fc([embed(t_{i+1}); s_i]) + b`` for every pair (one half zeroed if ``cfg.inputs``
  names only the other)."""
  e_BxTxF = params["embed"][tokens_BxT]
  if cfg.inputs == "feature":
    e_BxTxF = jnp.zeros_like(e_BxTxF)
  elif cfg.inputs == "token":
    s_BxTxF = jnp.zeros_like(s_BxTxF)
  return llama.linear(jnp.concatenate([e_BxTxF, s_BxTxF], axis=-1), params["fc"]) + params["fc_b"]


def layer(params, cfg: EagleConfig, x_BxTxF, positions_BxT, k, v, attn):
  """The decoder layer and the norm: ``(out [B, T, F], k, v)`` (see ``llama.block``)."""
  x_BxTxF, k, v = llama.block(params["layer"], cfg.layer, x_BxTxF, positions_BxT, k, v, attn)
  return llama.rms_norm(x_BxTxF, params["norm"], cfg.target.norm_eps), k, v


def rollout_layer(params, cfg: EagleConfig, x_BxTxF, positions_BxT, first_kv, rolled_kv):
  """Training-time test (EAGLE-3): the layer at rollout step j >= 2 from every start t at once.

  Start t's step-j input is the pair (its step j - 1 output, token t + j) at position
  t + j - 1; as at decode time, it attends to the teacher-forced pairs 0..t (``first_kv``: the
  step-1 K/V, ``[B, G, T, Dh]``) and to its own earlier rollout steps (``rolled_kv``: their
  K/V, same shapes, the same index t) and itself. Returns ``(out, k, v)`` of this step."""
  p, c = params["layer"], cfg.layer
  h_BxTxF = llama.rms_norm(x_BxTxF, p["attn_norm"], c.norm_eps)
  q_BxGxRTxDh, k_new, v_new = llama.qkv(p, c, h_BxTxF, positions_BxT)
  k1, v1 = first_kv
  t, r = x_BxTxF.shape[1], c.groups
  scale = 1.0 / np.sqrt(c.head_dim)
  query_t = np.arange(r * t) % t
  seen_QxT = np.arange(t)[None, :] <= query_t[:, None]  # pairs 0..t of start t
  scores = jnp.einsum("bgqd,bgsd->bgqs", q_BxGxRTxDh, k1) * scale
  scores = jnp.where(seen_QxT, scores, jnp.finfo(jnp.float32).min)
  own = [(jnp.tile(k, (1, 1, r, 1)), jnp.tile(v, (1, 1, r, 1))) for k, v in rolled_kv]
  own.append((jnp.tile(k_new, (1, 1, r, 1)), jnp.tile(v_new, (1, 1, r, 1))))
  own_scores = jnp.stack([jnp.sum(q_BxGxRTxDh * k, -1) * scale for k, _ in own], axis=-1)
  weights = jax.nn.softmax(jnp.concatenate([scores, own_scores], axis=-1), axis=-1)
  out = jnp.einsum("bgqs,bgsd->bgqd", weights[..., :t], v1)
  for i, (_, v) in enumerate(own):
    out = out + weights[..., t + i, None] * v
  x_BxTxF = x_BxTxF + llama.attention_output(p, c, out)
  x_BxTxF = x_BxTxF + llama.mlp(p, c, llama.rms_norm(x_BxTxF, p["mlp_norm"], c.norm_eps))
  return llama.rms_norm(x_BxTxF, params["norm"], cfg.target.norm_eps), k_new, v_new


def logits(params, out_xF: jax.Array) -> jax.Array:
  """``[..., V']`` draft logits over the draft vocabulary."""
  return llama.linear(out_xF, params["proj"]).astype(jnp.float32)


# --- Saving and loading ------------------------------------------------------------------------


def save(directory, cfg: EagleConfig, params: dict, target, extra=None):
  """Writes the trained tensors and ``vocab_ids`` (``eagle.safetensors``) and ``eagle.json``
  (shapes, the target's fingerprint) into ``directory``, atomically. The frozen embedding and
  head are the target's and are re-read from it on load."""
  tensors = _flatten({k: params[k] for k in TRAINED + ("vocab_ids",) if k in params})
  meta = {"format": FORMAT, "eagle": cfg.asdict(), "target": artifact.target_meta(target)}
  return artifact.save(directory, tensors, WEIGHTS_FILE, meta | (extra or {}), META_FILE)


def read_meta(directory, field: str = f"{FIELD}.path") -> dict:
  hint = "point it at a directory written by task=train with objective.name=eagle (draft_final)"
  return artifact.read_meta(directory, META_FILE, FORMAT, field, hint, WEIGHTS_FILE)


def read_trained(directory) -> dict:
  return _unflatten(artifact.read_tensors(directory, WEIGHTS_FILE))


def load(directory, target) -> tuple[EagleConfig, dict, dict]:
  """``(cfg, decode params, meta)``; a clear error if the drafter was trained for another
  target, reads features the target lacks, or cannot propose the target's stop tokens."""
  meta = read_meta(directory)
  cfg = EagleConfig.fromdict(meta["eagle"])
  field = f"{FIELD}.path={str(directory)!r}"
  artifact.check_target(meta, cfg.target.dim, cfg.target.vocab_size, target, field, "drafters")
  trained = read_trained(directory)
  vocab_ids = trained.pop("vocab_ids").astype(np.int32)
  artifact.check_vocab(vocab_ids, target, field)
  params = jax.tree.map(jnp.asarray, trained) | frozen_params(cfg, target.params, vocab_ids)
  return cfg, params, meta


def _flatten(params: dict) -> dict:
  out = {}
  for k, v in params.items():
    if isinstance(v, dict):
      out |= {f"{k}.{kk}": vv for kk, vv in v.items()}
    else:
      out[k] = v
  return out


def _unflatten(tensors: dict) -> dict:
  out: dict = {}
  for k, v in tensors.items():
    head, _, tail = k.partition(".")
    if tail:
      out.setdefault(head, {})[tail] = v
    else:
      out[k] = v
  return out
