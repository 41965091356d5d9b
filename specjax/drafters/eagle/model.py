"""EAGLE's model: its config, parameters, the layer over (token, feature) pairs, its head over
the draft vocabulary, and saving/loading a trained drafter. The decoding side (the dynamic
tree) is ``drafter.py``; the package docstring describes both.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax.drafters import artifact
from specjax.models import llama, schema
from specjax.models.config import ModelConfig

FIELD = "config.drafter.eagle"
WEIGHTS_FILE, META_FILE = "eagle.safetensors", "eagle.json"
FORMAT = 1
# The drafter's architecture. "specjax": fc over the pair, a full pre-norm layer and a final
# norm, its output both fed back and read by the head (specjax's EAGLE-1/EAGLE-3 variants).
# "eagle1": the published EAGLE-1/2 (SafeAILab): fc with a bias, the layer without its input
# norm, no final norm, the target's head on the raw output. "eagle3": the published EAGLE-3
# (SafeAILab, SpecForge, vLLM speculators): fc maps the concatenated target layers to F, the
# layer's attention reads [input_norm(embed); hidden_norm(s)] (q, k, v over 2F) with s as its
# residual, and its own head over the draft vocabulary reads norm(output); the un-normed output
# is fed back.
ARCHITECTURES = ("specjax", "eagle1", "eagle3")
# What training changes and a saved drafter stores, per architecture (fuse: several features).
TRAINED_BY = {
  "specjax": ("fuse", "fc", "fc_b", "layer", "norm"),
  "eagle1": ("fc", "fc_b", "layer"),
  "eagle3": ("fuse", "layer", "norm", "proj"),
}
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
  architecture: str = "specjax"  # one of ARCHITECTURES
  # (field, value) pairs of ModelConfig that the drafter's layer has otherwise than the target
  # (a published drafter's own attention bias, RoPE base, ...); () = the target's throughout.
  layer_fields: tuple = ()

  def __post_init__(self):
    if self.inputs not in INPUTS:
      raise ValueError(f"EAGLE inputs={self.inputs!r} is unknown; choose one of {INPUTS}.")
    if self.architecture not in ARCHITECTURES:
      raise ValueError(
        f"EAGLE architecture={self.architecture!r} is unknown; choose one of {ARCHITECTURES}."
      )
    if self.architecture != "specjax" and self.inputs != INPUTS[0]:
      raise ValueError(
        f"EAGLE inputs={self.inputs!r} is an ablation of specjax's architecture; "
        f"architecture={self.architecture!r} reads {INPUTS[0]!r}."
      )
    if self.architecture == "eagle1" and tuple(self.feature_layers) != (llama.FINAL,):
      raise ValueError(
        f"EAGLE architecture='eagle1' reads the target's final feature, not "
        f"{list(self.feature_layers)}: set feature_layers=('final',), or use 'eagle3'."
      )
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = [k for k, _ in self.layer_fields if k not in fields or k in _FIXED_LAYER_FIELDS]
    if unknown:
      raise ValueError(
        f"EAGLE layer_fields {unknown} cannot be set: the drafter's layer takes every "
        f"ModelConfig field but {sorted(_FIXED_LAYER_FIELDS)} from its own config."
      )
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
      self.target,
      **dict(self.layer_fields),
      num_layers=1,
      ffn_dim=self.mlp_width,
      name=f"{self.target.name}-eagle",
    )

  @property
  def trained(self) -> tuple[str, ...]:
    """The parameters training changes and a saved drafter stores."""
    return TRAINED_BY[self.architecture]

  @property
  def mlp_width(self) -> int:
    return self.ffn_dim or self.target.ffn_dim

  @property
  def draft_vocab(self) -> int:
    return self.vocab_size or self.target.vocab_size

  @property
  def fused(self) -> bool:
    """Whether a trained ``fuse`` maps the features read to F (always, in official EAGLE-3)."""
    return len(self.feature_layers) > 1 or self.architecture == "eagle3"

  def asdict(self) -> dict:
    return {
      "target": dataclasses.asdict(self.target),
      "feature_layers": list(self.feature_layers),
      "vocab_size": self.vocab_size,
      "inputs": self.inputs,
      "ffn_dim": self.ffn_dim,
      "architecture": self.architecture,
      "layer_fields": [list(kv) for kv in self.layer_fields],
    }

  @classmethod
  def fromdict(cls, d: dict) -> "EagleConfig":
    layers = tuple(f if f == llama.FINAL else int(f) for f in d["feature_layers"])
    inputs = d.get("inputs", INPUTS[0])  # drafters saved before the ablation read both
    ffn_dim = d.get("ffn_dim", 0)  # drafters saved before it have the target's MLP width
    fields = tuple((k, _tuples(v)) for k, v in d.get("layer_fields", ()))
    target = ModelConfig(**{k: _tuples(v) for k, v in d["target"].items()})
    arch = d.get("architecture", "specjax")
    return cls(target, layers, d["vocab_size"], inputs, ffn_dim, arch, fields)


# The layer's fields that follow from the drafter's config, never from layer_fields.
_FIXED_LAYER_FIELDS = frozenset({"dim", "vocab_size", "num_layers", "ffn_dim", "name"})


def _tuples(v):
  """JSON's lists back as the tuples a frozen config holds."""
  return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def param_shapes(cfg: EagleConfig) -> dict[str, tuple[int, ...]]:
  """Every parameter's shape but the target's embedding, by flat name (``layer.wq``): what
  ``init_params`` makes and ``load`` returns for ``cfg.architecture``."""
  f, w, c = cfg.target.dim, cfg.draft_vocab, cfg.layer
  shapes = {"proj": (w, f), "vocab_ids": (w,)}
  if cfg.architecture != "eagle3":
    shapes |= {"fc": (f, 2 * f), "fc_b": (f,)}
  if cfg.architecture != "eagle1":
    shapes["norm"] = (f,)
  if cfg.fused:
    shapes["fuse"] = (f, len(cfg.feature_layers) * f)
  for path, p in schema.entries(llama.SCHEMA, c, 1):
    if path[0] != "layers" or (cfg.architecture == "eagle1" and path[2] == "attn_norm"):
      continue
    shape = p.shape(c)
    if cfg.architecture == "eagle3" and path[2] in ("wq", "wk", "wv"):
      shape = (shape[0], 2 * f)  # over [embed; s]
    shapes[f"layer.{path[2]}"] = shape
  if cfg.architecture == "eagle3":
    shapes["layer.hidden_norm"] = (f,)
  return shapes


def check_shapes(params, want: dict, what: str) -> None:
  """``params`` (nested one level: ``layer.wq`` is ``params["layer"]["wq"]``) hold every
  tensor of ``want`` (flat name -> shape): one error naming the first that does not fit."""
  got = params if isinstance(params, dict) else {}
  for name, shape in want.items():
    head, _, tail = name.partition(".")
    have = got.get(head)
    if tail:
      have = have.get(tail) if isinstance(have, dict) else None
    if have is None or tuple(np.shape(have)) != shape:
      have = "missing" if have is None else tuple(np.shape(have))
      key = f"[{head!r}][{tail!r}]" if tail else f"[{head!r}]"
      raise ValueError(f"{what} drafter_params{key} is {have}, expected {shape}.")


# --- the drafter's computation, shared by decoding and training --------------------------------


def init_params(cfg: EagleConfig, key: jax.Array, target_params, vocab_ids, copy_layer=None):
  """Trained weights (random, or the target's layer ``copy_layer``) and the frozen ones read
  from the target: its embedding, and (but in official EAGLE-3, whose head is its own and
  starts from them) its head's ``vocab_ids`` rows as the projection."""
  k_layer, k_fc, k_fuse = jax.random.split(key, 3)
  f = cfg.target.dim
  if copy_layer is None:
    layer = _fresh_layer(cfg, k_layer)
  elif cfg.architecture == "eagle3":
    raise ValueError(
      "EAGLE architecture='eagle3' reads 2F-wide pairs: a target layer cannot be copied "
      "(copy_layer = -1)."
    )
  else:
    layer = dict(target_params["layers"][copy_layer])
    if cfg.architecture == "eagle1":
      layer.pop("attn_norm")
  params = {"layer": layer}
  if cfg.architecture != "eagle3":
    fc = jax.random.normal(k_fc, (f, 2 * f)) / np.sqrt(2 * f)
    params |= {"fc": fc, "fc_b": jnp.zeros((f,))}
  if cfg.architecture != "eagle1":
    params["norm"] = target_params["final_norm"]
  if cfg.fused:
    n = len(cfg.feature_layers)
    params["fuse"] = jax.random.normal(k_fuse, (f, n * f)) / np.sqrt(n * f)
  if cfg.architecture == "eagle3":
    head = artifact.target_head(target_params, cfg.target)
    params["proj"] = head[jnp.asarray(vocab_ids, jnp.int32)]
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
  """A randomly initialised layer of the drafter's shapes (``llama.init_params``'s scheme;
  official EAGLE-3's q, k, v: two such halves side by side, over [embed; s])."""
  draw = lambda k: llama.init_params(dataclasses.replace(cfg.layer, vocab_size=1), k)["layers"][0]  # noqa: E731
  layer = draw(key)
  if cfg.architecture == "eagle1":
    layer.pop("attn_norm")
  if cfg.architecture == "eagle3":
    other = draw(jax.random.fold_in(key, 1))
    layer |= {n: jnp.concatenate([layer[n], other[n]], axis=1) for n in ("wq", "wk", "wv")}
    layer["hidden_norm"] = jnp.ones((cfg.target.dim,), layer["mlp_norm"].dtype)
  return layer


def frozen_params(cfg: EagleConfig, target_params, vocab_ids) -> dict:
  """What the drafter reads from the target: its embedding, and its head's ``vocab_ids`` rows
  (but official EAGLE-3's head is its own, in the trained parameters)."""
  ids = jnp.asarray(vocab_ids, jnp.int32)
  frozen = {"embed": target_params["embed"], "vocab_ids": ids}
  if "proj" not in cfg.trained:
    frozen["proj"] = artifact.target_head(target_params, cfg.target)[ids]
  return frozen


def fuse(params, f_xFin: jax.Array) -> jax.Array:
  """``s``: the feature the drafter reads, ``[..., F]`` (EAGLE-3: a linear map of the layers)."""
  return llama.linear(f_xFin, params["fuse"]) if "fuse" in params else f_xFin


def inputs(params, cfg: EagleConfig, tokens_BxT: jax.Array, s_BxTxF: jax.Array) -> jax.Array:
  """``fc([embed(t_{i+1}); s_i]) + b`` for every pair (one half zeroed if ``cfg.inputs``
  names only the other); official EAGLE-3: the pair ``[embed(t_{i+1}); s_i]`` itself, ``[.., 2F]``
  (its layer norms each half)."""
  e_BxTxF = params["embed"][tokens_BxT]
  if cfg.architecture == "eagle3":
    return jnp.concatenate([e_BxTxF.astype(s_BxTxF.dtype), s_BxTxF], axis=-1)
  if cfg.inputs == "feature":
    e_BxTxF = jnp.zeros_like(e_BxTxF)
  elif cfg.inputs == "token":
    s_BxTxF = jnp.zeros_like(s_BxTxF)
  return llama.linear(jnp.concatenate([e_BxTxF, s_BxTxF], axis=-1), params["fc"]) + params["fc_b"]


def layer(params, cfg: EagleConfig, x_BxTxF, positions_BxT, k, v, attn, kv_before=None):
  """The decoder layer (and specjax's final norm): ``(out [B, T, F], k, v)``, ``out`` the
  state fed back as the next pair's feature (see ``llama.attention`` for ``k``, ``v``,
  ``attn`` and ``kv_before``)."""
  p, c = params["layer"], cfg.layer
  residual_BxTxF, h_BxTxD = _attention_input(p, cfg, x_BxTxF)
  a_BxTxF, k, v = llama.attention(p, c, h_BxTxD, positions_BxT, k, v, attn, kv_before)
  return _layer_output(params, cfg, residual_BxTxF + a_BxTxF), k, v


def pair_kv(params, cfg: EagleConfig, x_BxTxD, positions_BxT) -> tuple[jax.Array, jax.Array]:
  """The layer's keys and values ``[B, G, T, Dh]`` of the pair inputs ``x`` (``inputs``'s) at
  ``positions``: what a cache of committed pairs holds (a pair's depend on it and its position
  alone, so they are written without running the layer)."""
  _, h_BxTxD = _attention_input(params["layer"], cfg, x_BxTxD)
  _, k, v = llama.qkv(params["layer"], cfg.layer, h_BxTxD, positions_BxT)
  return k, v


def _attention_input(p, cfg: EagleConfig, x_BxTxD) -> tuple[jax.Array, jax.Array]:
  """``(residual, what the attention reads)`` of the pair inputs ``x`` (``inputs``'s)."""
  eps = cfg.layer.norm_eps
  if cfg.architecture == "eagle1":  # no input norm
    return x_BxTxD, x_BxTxD
  if cfg.architecture == "eagle3":
    e_BxTxF, s_BxTxF = jnp.split(x_BxTxD, 2, axis=-1)
    normed = [
      llama.rms_norm(e_BxTxF, p["attn_norm"], eps),
      llama.rms_norm(s_BxTxF, p["hidden_norm"], eps),
    ]
    return s_BxTxF, jnp.concatenate(normed, axis=-1)
  return x_BxTxD, llama.rms_norm(x_BxTxD, p["attn_norm"], eps)


def _layer_output(params, cfg: EagleConfig, x_BxTxF) -> jax.Array:
  """The MLP half of the layer after the attention's residual sum, then specjax's norm."""
  p, c = params["layer"], cfg.layer
  x_BxTxF = x_BxTxF + llama.mlp(p, c, llama.rms_norm(x_BxTxF, p["mlp_norm"], c.norm_eps))
  if cfg.architecture == "specjax":
    return llama.rms_norm(x_BxTxF, params["norm"], cfg.target.norm_eps)
  return x_BxTxF


def rollout_layer(params, cfg: EagleConfig, x_BxTxF, positions_BxT, first_kv, rolled_kv):
  """Training-time test (EAGLE-3): the layer at rollout step j >= 2 from every start t at once.

  Start t's step-j input is the pair (its step j - 1 output, token t + j) at position
  t + j - 1; as at decode time, it attends to the teacher-forced pairs 0..t (``first_kv``: the
  step-1 K/V, ``[B, G, T, Dh]``) and to its own earlier rollout steps (``rolled_kv``: their
  K/V, same shapes, the same index t) and itself. Returns ``(out, k, v)`` of this step."""
  p, c = params["layer"], cfg.layer
  residual_BxTxF, h_BxTxD = _attention_input(p, cfg, x_BxTxF)
  q_BxGxRTxDh, k_new, v_new = llama.qkv(p, c, h_BxTxD, positions_BxT)
  k1, v1 = first_kv
  t, r = residual_BxTxF.shape[1], c.groups
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
  return (
    _layer_output(params, cfg, residual_BxTxF + llama.attention_output(p, c, out)),
    k_new,
    v_new,
  )


def logits(params, cfg: EagleConfig, out_xF: jax.Array) -> jax.Array:
  """``[..., V']`` draft logits over the draft vocabulary (official EAGLE-3: of the normed
  output)."""
  if cfg.architecture == "eagle3":
    out_xF = llama.rms_norm(out_xF, params["norm"], cfg.layer.norm_eps)
  return llama.linear(out_xF, params["proj"]).astype(jnp.float32)


# --- Saving and loading ------------------------------------------------------------------------


def save(directory, cfg: EagleConfig, params: dict, target, extra=None):
  """Writes the trained tensors and ``vocab_ids`` (``eagle.safetensors``) and ``eagle.json``
  (shapes, the target's fingerprint) into ``directory``, atomically. The frozen embedding and
  head are the target's and are re-read from it on load."""
  tensors = flatten({k: params[k] for k in cfg.trained + ("vocab_ids",) if k in params})
  meta = {"format": FORMAT, "eagle": cfg.asdict(), "target": artifact.target_meta(target)}
  return artifact.save(directory, tensors, WEIGHTS_FILE, meta | (extra or {}), META_FILE)


def read_meta(directory, field: str = f"{FIELD}.path") -> dict:
  hint = "point it at a directory written by task=train with objective.name=eagle (draft_final)"
  return artifact.read_meta(directory, META_FILE, FORMAT, field, hint, WEIGHTS_FILE)


def read_trained(directory) -> dict:
  return unflatten(artifact.read_tensors(directory, WEIGHTS_FILE))


def load_saved(directory, target, field: str = f"{FIELD}.path") -> tuple[EagleConfig, dict, dict]:
  """``(cfg, decode params, meta)`` of a drafter specjax saved (``eagle.json``); a clear error
  if it was trained for another target, reads features the target lacks, or cannot propose
  the target's stop tokens. Any layout, published ones included: ``layouts.load``."""
  meta = read_meta(directory, field)
  cfg = EagleConfig.fromdict(meta["eagle"])
  field = f"{field}={str(directory)!r}"
  artifact.check_target(meta, cfg.target.dim, cfg.target.vocab_size, target, field, "drafters")
  trained = read_trained(directory)
  vocab_ids = trained.pop("vocab_ids").astype(np.int32)
  artifact.check_vocab(vocab_ids, target, field)
  params = jax.tree.map(jnp.asarray, trained) | frozen_params(cfg, target.params, vocab_ids)
  return cfg, params, meta


def flatten(params: dict) -> dict:
  """``{"layer": {"wq": ..}}`` as ``{"layer.wq": ..}`` (how a drafter's tensors are stored)."""
  out = {}
  for k, v in params.items():
    if isinstance(v, dict):
      out |= {f"{k}.{kk}": vv for kk, vv in v.items()}
    else:
      out[k] = v
  return out


def unflatten(tensors: dict) -> dict:
  """``flatten``'s inverse."""
  out: dict = {}
  for k, v in tensors.items():
    head, _, tail = k.partition(".")
    if tail:
      out.setdefault(head, {})[tail] = v
    else:
      out[k] = v
  return out
