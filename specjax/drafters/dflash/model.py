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
# DSpark's heads (``markov_rank`` > 0, ``confidence``), trained and saved beside them.
HEADS = ("markov_w1", "markov_w2", "markov_gate_w", "markov_gate_b", "markov_joint_w",
         "markov_joint_b", "confidence_w", "confidence_b")  # fmt: skip
MARKOV_HEADS = ("vanilla", "gated", "rnn")


SIZES = (("num_layers", 1), ("block_size", 2), ("ffn_dim", 0), ("vocab_size", 0),
         ("markov_rank", 0))  # the integer fields and their least values  # fmt: skip


def check_fields(get, field: str = FIELD) -> None:
  """The fields that need no target (``get(name)``: a field's value, of config section
  ``field``): the sizes and markov_head; the training config's check runs it before the data
  and the target load."""
  for name, low in SIZES:
    value = get(name)
    if isinstance(value, bool) or int(value) != value or value < low:
      raise ValueError(f"{field}.{name} must be an integer >= {low}, got {value!r}.")
  if get("markov_head") not in MARKOV_HEADS:
    raise ValueError(
      f"{field}.markov_head={get('markov_head')!r} is unknown; choose {', '.join(MARKOV_HEADS)}."
    )


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
  # DSpark (speculators' ``dspark``): the anchor's own position drafts too (B tokens a block)
  sample_from_anchor: bool = False
  markov_rank: int = 0  # r of the Markov logit bias W2 W1[previous token]; 0 = none (DFlash)
  markov_head: str = "vanilla"  # vanilla | gated (hidden-gated) | rnn (a state over the block)
  confidence: bool = False  # a per-position acceptance-probability head
  confidence_with_markov: bool = True  # its input: the hidden state and W1[previous token]

  def __post_init__(self):
    llama.check_features(self.target, self.feature_layers)
    if not self.feature_layers or llama.FINAL in self.feature_layers:
      raise ValueError(
        f"{FIELD}.feature_layers: DFlash fuses residual streams of target layers (indices), "
        f"got {list(self.feature_layers)}."
      )
    check_fields(lambda name: getattr(self, name))
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
    if self.confidence and self.confidence_with_markov and not self.markov_rank:
      raise ValueError(
        f"{FIELD}: the confidence head reads the Markov head's embedding "
        "(confidence_with_markov) but markov_rank is 0: set a rank or confidence_with_markov "
        "= False."
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
  def first_slot(self) -> int:
    """The block position drafting depth 1: the anchor's own (``sample_from_anchor``: DSpark's
    convention, position k drafts the token at L + k + 1) or the one after it (DFlash's)."""
    return 0 if self.sample_from_anchor else 1

  @property
  def num_draft(self) -> int:
    """Draft tokens per block: every position after the anchor (and the anchor's own)."""
    return self.block_size - self.first_slot

  @property
  def confidence_dim(self) -> int:
    return self.target.dim + (self.markov_rank if self.confidence_with_markov else 0)

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
  heads = {k: 0.02 * jax.random.normal(jax.random.fold_in(key, i), shape)
           for i, (k, shape) in enumerate(head_shapes(cfg).items())}  # fmt: skip
  # Biases and W2 start at zero: the Markov bias adds nothing until trained (a DFlash start).
  heads |= {k: jnp.zeros_like(v) for k, v in heads.items() if k.endswith("_b") or k == "markov_w2"}
  return {"fc": fc, "hidden_norm": jnp.ones((f,)), "layers": layers, "norm": jnp.ones((f,))} | heads


def head_shapes(cfg: DFlashConfig) -> dict:
  """DSpark's heads' weights (torch's ``[out, in]``; ``markov_w1`` an embedding ``[V, r]``)."""
  f, r = cfg.target.dim, cfg.markov_rank
  out = {}
  if r:
    out |= {"markov_w1": (cfg.target.vocab_size, r),
            "markov_w2": (cfg.vocab_size or cfg.target.vocab_size, r)}  # fmt: skip
    if cfg.markov_head == "gated":
      out |= {"markov_gate_w": (r, f + r), "markov_gate_b": (r,)}
    if cfg.markov_head == "rnn":
      out |= {"markov_joint_w": (3 * r, 2 * r + f), "markov_joint_b": (3 * r,)}
  if cfg.confidence:
    out |= {"confidence_w": (1, cfg.confidence_dim), "confidence_b": (1,)}
  return out


def param_shapes(cfg: DFlashConfig) -> dict:
  """The trainable weights' shapes."""
  f = cfg.target.dim
  layers = [{k: tuple(v.shape) for k, v in layer.items()}
            for layer in llama.param_shapes(cfg.layer)["layers"]]  # fmt: skip
  return {"fc": (f, f * len(cfg.feature_layers)), "hidden_norm": (f,), "layers": layers,
          "norm": (f,)} | head_shapes(cfg)  # fmt: skip


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


def block_hidden(params, cfg: DFlashConfig, cache: KVCache, tokens_BxK, positions_BxK):
  """The normed hidden states ``[B, K, F]`` of a block: its tokens (the anchor, then
  ``mask_id``s) attend to each other (non-causally) and to the context slots ``[0,
  cache.lengths)``, through every draft layer; then the final norm."""
  k = tokens_BxK.shape[1]
  x = params["embed"][tokens_BxK].astype(jnp.float32)
  attn = llama.attention_inputs(cache.lengths, jnp.ones((k, k), bool), cache.num_slots, write=False)
  for p, k_i, v_i in zip(params["layers"], cache.k, cache.v, strict=True):
    x, _, _ = llama.block(p, cfg.layer, x, positions_BxK, k_i, v_i, attn)
  return llama.rms_norm(x, params["norm"], cfg.target.norm_eps)


def head(params, h_xF: jax.Array) -> jax.Array:
  """The target's head rows (the draft vocabulary) on hidden states: float32 logits."""
  return llama.linear(h_xF, params["head"]).astype(jnp.float32)


def block_logits(params, cfg: DFlashConfig, cache: KVCache, tokens_BxK, positions_BxK):
  """Logits ``[B, K, V]`` of a block (``block_hidden``, then the target's head), without a
  Markov bias."""
  return head(params, block_hidden(params, cfg, cache, tokens_BxK, positions_BxK))


# --- DSpark's heads -----------------------------------------------------------------------------


def markov_state(cfg: DFlashConfig, shape: tuple) -> jax.Array:
  """The rnn head's state before a block's first position (zeros; unused by the others)."""
  return jnp.zeros((*shape, cfg.markov_rank), jnp.float32)


def markov_step(params, cfg: DFlashConfig, prev_x, hidden_xF, state_xR):
  """``(bias [..., V'], embedding [..., r], state)`` of one block position: its logit bias from
  the token before it (``prev_x``, a target id), the position's hidden state and (rnn) the
  state the block's earlier positions left: vanilla ``W2 e``, gated ``W2 (sigmoid(G [h, e]) *
  e)``, rnn ``W2 tanh(o)`` with the state updated by a gate and a candidate (speculators'
  ``MarkovHead``)."""
  e = params["markov_w1"][prev_x].astype(jnp.float32)
  if cfg.markov_head == "vanilla":
    return head_w2(params, e), e, state_xR
  h = hidden_xF.astype(jnp.float32)
  if cfg.markov_head == "gated":
    gate = jax.nn.sigmoid(affine(params, "markov_gate", jnp.concatenate([h, e], -1)))
    return head_w2(params, gate * e), e, state_xR
  z = affine(params, "markov_joint", jnp.concatenate([state_xR, e, h], -1))
  gate_raw, cand_raw, out_raw = jnp.split(z, 3, axis=-1)
  gate = jax.nn.sigmoid(gate_raw)
  state = gate * state_xR + (1.0 - gate) * jnp.tanh(cand_raw)
  return head_w2(params, jnp.tanh(out_raw)), e, state


def head_w2(params, x_xR):
  return llama.linear(x_xR, params["markov_w2"]).astype(jnp.float32)


def affine(params, name: str, x):
  return llama.linear(x, params[f"{name}_w"]).astype(jnp.float32) + params[f"{name}_b"]


def confidence_logit(params, cfg: DFlashConfig, hidden_xF, embedding_xR):
  """The confidence head's logit ``[...]`` (sigmoid: the predicted acceptance probability)."""
  x = hidden_xF.astype(jnp.float32)
  if cfg.confidence_with_markov:
    x = jnp.concatenate([x, embedding_xR], -1)
  return affine(params, "confidence", x)[..., 0]


def teacher_forced(params, cfg: DFlashConfig, hidden_AxKxF, prev_AxK):
  """``(Markov bias [A, K, V'] or None, confidence logits [A, K] or None)`` of blocks whose
  position k's previous token is ``prev[:, k]`` (training and the reference comparison)."""
  if not (cfg.markov_rank or cfg.confidence):
    return None, None
  bias = e_AxKxR = None
  if cfg.markov_rank and cfg.markov_head != "rnn":  # no state: every position at once
    state = markov_state(cfg, prev_AxK.shape)
    bias, e_AxKxR, _ = markov_step(params, cfg, prev_AxK, hidden_AxKxF, state)
  elif cfg.markov_rank:  # the state runs down the block
    biases, embeddings = [], []
    state = markov_state(cfg, prev_AxK.shape[:1])
    for k in range(prev_AxK.shape[1]):
      b, e, state = markov_step(params, cfg, prev_AxK[:, k], hidden_AxKxF[:, k], state)
      biases.append(b)
      embeddings.append(e)
    bias, e_AxKxR = jnp.stack(biases, 1), jnp.stack(embeddings, 1)
  conf = confidence_logit(params, cfg, hidden_AxKxF, e_AxKxR) if cfg.confidence else None
  return bias, conf


def block_tokens(cfg: DFlashConfig, anchor_B: jax.Array) -> jax.Array:
  """``[B, block_size]``: each anchor, then ``mask_id`` at every position after it."""
  masks = jnp.full((anchor_B.shape[0], cfg.block_size - 1), cfg.mask_id, jnp.int32)
  return jnp.concatenate([anchor_B[:, None].astype(jnp.int32), masks], axis=1)


def previous_tokens(cfg: DFlashConfig, tokens_BxT, anchors_BxA) -> jax.Array:
  """``[B, A, K]``: the token before each block position's drafted one, teacher-forced (the
  Markov head's input): the token at anchor + k (DSpark: position k drafts anchor + k + 1), or
  at anchor + k - 1, the anchor's own at k = 0 (DFlash's convention)."""
  t = tokens_BxT.shape[1]
  k_K = jnp.arange(cfg.block_size) - cfg.first_slot
  at = jnp.clip(anchors_BxA[..., None] + jnp.maximum(k_K, 0), 0, t - 1)
  return jnp.take_along_axis(tokens_BxT[:, None, :], at, axis=2)


def anchored_hidden(params, cfg: DFlashConfig, tokens_1xT, features_1xTxnF, anchors_A):
  """``[A, block_size, F]``: the hidden states of a block at each anchor position of one text,
  its context the text's features before the anchor (replay, training's reference)."""
  t = tokens_1xT.shape[1]
  k, v = context_kv(params, cfg, features_1xTxnF, jnp.arange(t)[None])
  a = anchors_A.shape[0]
  tile = lambda x: jnp.broadcast_to(x, (a, *x.shape[1:]))  # noqa: E731
  cache = KVCache(k=tuple(map(tile, k)), v=tuple(map(tile, v)), lengths=anchors_A.astype(jnp.int32))
  positions = anchors_A[:, None] + jnp.arange(cfg.block_size)[None]
  return block_hidden(params, cfg, cache, block_tokens(cfg, tokens_1xT[0, anchors_A]), positions)


def anchored_outputs(params, cfg: DFlashConfig, tokens_1xT, features_1xTxnF, anchors_A):
  """``(logits [A, block_size, V'], confidence logits [A, block_size] or None)``: a block at
  each anchor position of one text, its context the text's features before the anchor, the
  Markov bias (if any) from the text's own tokens (the reference comparison)."""
  h = anchored_hidden(params, cfg, tokens_1xT, features_1xTxnF, anchors_A)
  logits = head(params, h)
  bias, conf = teacher_forced(params, cfg, h, previous_tokens(cfg, tokens_1xT, anchors_A[None])[0])
  return (logits if bias is None else logits + bias), conf


def anchored_logits(params, cfg: DFlashConfig, tokens_1xT, features_1xTxnF, anchors_A):
  """``[A, block_size, V']``: ``anchored_outputs``' logits."""
  return anchored_outputs(params, cfg, tokens_1xT, features_1xTxnF, anchors_A)[0]


# --- saving and loading in specjax's layout -----------------------------------------------------

WEIGHTS_FILE, META_FILE = "dflash.safetensors", "dflash.json"
FORMAT = 1


def flat(params: dict) -> dict:
  """The trained tensors by name (``layers.{i}.{name}``), and ``vocab_ids`` where the draft
  vocabulary is reduced: what a save stores."""
  out = {k: params[k] for k in ("fc", "hidden_norm", "norm", "vocab_ids", *HEADS) if k in params}
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
