"""Medusa's heads: their shapes, parameters and logits, and saving/loading them (specjax's own
files; other projects' layouts through ``specjax.drafters.medusa.formats``). The decoding side is
``drafter.py``; the package docstring describes both.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax.drafters import artifact
from specjax.drafters.artifact import target_head
from specjax.models import llama, schema
from specjax.models.config import ModelConfig
from specjax.models.schema import Param
from specjax.trees import Tree

FIELD = "config.drafter.medusa"
HEADS_FILE, META_FILE = "heads.safetensors", "medusa.json"
FORMAT = 1


@dataclasses.dataclass(frozen=True)
class HeadsConfig:
  """Shapes of a set of Medusa heads (static; hashable)."""

  dim: int  # F: the target's hidden size
  num_heads: int  # H
  vocab_size: int  # V': the draft vocabulary (== the target's unless reduced)
  target_vocab_size: int  # V
  num_layers: int = 1  # R: residual layers per head
  own_proj: bool = False  # False: every head uses the target's (frozen) head

  def __post_init__(self):
    for f in ("dim", "num_heads", "vocab_size", "target_vocab_size", "num_layers"):
      if int(getattr(self, f)) != getattr(self, f) or getattr(self, f) < 1:
        raise ValueError(f"Medusa heads: {f} must be an integer >= 1, got {getattr(self, f)}.")
    if self.vocab_size > self.target_vocab_size:
      raise ValueError(
        f"Medusa heads: the draft vocabulary ({self.vocab_size}) cannot exceed the target's "
        f"({self.target_vocab_size})."
      )

  @property
  def reduced(self) -> bool:
    return self.vocab_size < self.target_vocab_size

  @property
  def name(self) -> str:  # what schema.check_shapes calls these sizes in its errors
    return "Medusa heads"


_proj_shape = lambda c: (c.num_heads if c.own_proj else 1, c.vocab_size, c.dim)  # noqa: E731

# What the heads decode with. ``proj`` is trained only when ``own_proj``; otherwise it is the
# target's head (its ``vocab_ids`` rows), shared by every head and never trained.
SCHEMA: schema.Schema = (
  Param("res_w", lambda c: (c.num_heads, c.num_layers, c.dim, c.dim), "zeros"),
  Param("res_b", lambda c: (c.num_heads, c.num_layers, c.dim), "zeros"),
  Param("proj", _proj_shape, "head"),
)
TRAINED = {False: ("res_w", "res_b"), True: ("res_w", "res_b", "proj")}


def init_heads(cfg: HeadsConfig, target_params, target_cfg: ModelConfig, vocab_ids) -> dict:
  """Fresh heads: identity residual layers (W = 0, b = 0) and the target's head rows
  ``vocab_ids`` as every head's projection, so an untrained head k predicts the next token."""
  head = target_head(target_params, target_cfg)[jnp.asarray(vocab_ids)]
  params = schema.init_params(SCHEMA, cfg, jax.random.key(0), num_layers=0)
  params["proj"] = jnp.broadcast_to(head[None], _proj_shape(cfg)).astype(jnp.float32)
  return params


def random_heads(cfg: HeadsConfig, key: jax.Array, scale: float = 1.0) -> dict:
  """Random heads (unit tests): residual weights ~ N(0, scale / F), random projection."""
  k1, k2, k3 = jax.random.split(key, 3)
  shape_w = (cfg.num_heads, cfg.num_layers, cfg.dim, cfg.dim)
  return {
    "res_w": scale * jax.random.normal(k1, shape_w) / np.sqrt(cfg.dim),
    "res_b": 0.1 * jax.random.normal(k2, shape_w[:3]),
    "proj": jax.random.normal(k3, _proj_shape(cfg)) / np.sqrt(cfg.dim),
  }


def head_logits(params: dict, h_xF: jax.Array) -> jax.Array:
  """``[..., H, V']`` every head's logits from hidden states ``h[..., F]``."""
  h = params["res_w"].shape[0]
  x_xHF = jnp.broadcast_to(h_xF[..., None, :], h_xF.shape[:-1] + (h, h_xF.shape[-1]))
  for r in range(params["res_w"].shape[1]):
    y = _per_head(x_xHF, params["res_w"][:, r]) + params["res_b"][:, r]
    x_xHF = x_xHF + jax.nn.silu(y)
  proj_HxVxF = params["proj"]
  if proj_HxVxF.shape[0] == 1:  # one head projection shared by every head
    return llama.linear(x_xHF, proj_HxVxF[0])
  return _per_head(x_xHF, proj_HxVxF)


def _per_head(x_xHI: jax.Array, w_HxOxI: jax.Array) -> jax.Array:
  """``[..., H, O]``: head h's rows through its own weight. Float32: one batched product;
  narrower weights: each head through ``llama.linear`` (its fast bfloat16 forms: a batched
  product of float32 rows with bfloat16 weights converts every weight to float32 on every
  call, which made the heads' step 5x slower; experiments/verify_cost)."""
  if w_HxOxI.dtype == x_xHI.dtype == jnp.float32:
    return jnp.einsum("...hi,hoi->...ho", x_xHI, w_HxOxI)
  heads = [llama.linear(x_xHI[..., h, :], w_HxOxI[h]) for h in range(w_HxOxI.shape[0])]
  return jnp.stack(heads, axis=-2)


fingerprint = artifact.fingerprint
check_vocab = artifact.check_vocab


def save(directory, heads: HeadsConfig, params: dict, target, tree: Tree | None, extra=None):
  """Writes ``heads.safetensors`` (the trained tensors and ``vocab_ids``; a shared projection is
  the target's and is not saved) and ``medusa.json`` into ``directory``, atomically."""
  keep = TRAINED[heads.own_proj] + ("vocab_ids",)
  meta = {
    "format": FORMAT,
    "heads": dataclasses.asdict(heads),
    "target": artifact.target_meta(target),
    "tree": list(tree.parents) if tree is not None else None,
  } | (extra or {})
  return artifact.save(directory, {k: params[k] for k in keep}, HEADS_FILE, meta, META_FILE)


def read_meta(directory, field: str = f"{FIELD}.path") -> dict:
  hint = "point it at a directory written by task=train with objective.name=medusa (draft_final)"
  return artifact.read_meta(directory, META_FILE, FORMAT, field, hint, HEADS_FILE)


def read_tensors(directory) -> dict[str, np.ndarray]:
  return artifact.read_tensors(directory, HEADS_FILE)


def load_saved(directory, target, field: str = f"{FIELD}.path") -> tuple[HeadsConfig, dict, dict]:
  """``(heads, decode params, meta)`` saved by specjax; a clear error if they were trained for
  another target or their vocabulary cannot emit the target's stop tokens."""
  meta = read_meta(directory, field)
  heads = HeadsConfig(**meta["heads"])
  field = f"{field}={str(directory)!r}"
  artifact.check_target(meta, heads.dim, heads.target_vocab_size, target, field, "heads")
  tensors = read_tensors(directory)
  vocab_ids = tensors["vocab_ids"].astype(np.int32)
  check_vocab(vocab_ids, target, field)
  params = {k: jnp.asarray(v) for k, v in tensors.items()}
  if not heads.own_proj:
    params["proj"] = target_head(target.params, target.cfg)[jnp.asarray(vocab_ids)][None]
  schema.check_shapes(SCHEMA, heads, {k: v for k, v in params.items() if k != "vocab_ids"}, 0)
  return heads, params, meta
