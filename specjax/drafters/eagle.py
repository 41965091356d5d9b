"""EAGLE feature drafters (Li et al. 2024): one decoder layer drafts at the target's feature level.

The target's feature at position i, f_i, is what its head turns into the distribution of token
i + 1. The drafter reads the pair (s_i, t_{i+1}), s_i = ``fuse(f_i)``, and predicts the next
state:

    x_i   = fc([embed(t_{i+1}); s_i]) + b      embed: the target's (frozen)
    out_i = norm(block(x_i))                    block: ``llama.block`` with the target's shapes,
                                                its own weights and its own one-layer KV cache
    q     = softmax(head(out_i))                head: the target's (frozen), over the draft
                                                vocabulary V' (all of it unless reduced)

and feeds ``out_i`` back as s_{i+1} to draft further. EAGLE-1 reads the final normed state
(``feature_layers = ("final",)``, ``fuse`` the identity) and is trained so out_i matches f_{i+1}.
EAGLE-3 reads three layers' residual streams, ``fuse`` is a trained linear map from 3F to F, and
only the token loss trains it (with a simulated multi-step rollout, ``train/objectives.py``).

Each step (EAGLE-2's dynamic tree under static shapes, budget ``(top_k, depth, total)``):

1. catch up: the pairs of the tokens committed since the last step, whose features the verify
   pass handed to ``commit`` (``Verdict.features``), run through the layer in one forward that
   writes them into the draft cache (rolled back by the target's lengths, like the target's);
   the last one's output drafts depth 1;
2. expand, depth by depth: the ``top_k`` best nodes so far at the deepest level (by cumulative
   draft log-probability) are fed, with every expanded ancestor, in one read-only forward; each
   offers ``top_k`` children;
3. rerank: the ``total`` best of all offered nodes form the tree (parents before children), as
   data (``Draft.parents``) for the tree verifier.

Candidates. ``top_k`` mode: each node's top-k tokens, deterministic (``Draft.probs=None``), a
child's score its draft log-probability: exactly EAGLE-2, lossless at any temperature (one-hot
verification). ``sampled`` mode: a node's children are drawn without replacement from its q
(Gumbel-top-k, fresh noise per node) and verified with q by recursive rejection sampling. For
that to stay exact, whether a child is kept must not depend on which token it drew (keeping
children by their own q biases them towards q's mode, and the exact-distribution test fails:
``testing.rerank_by_own_q``): the rank-r child scores with q's r-th largest probability, which
the parent alone decides, so each node keeps a prefix of its draws. At temperature 0 both modes
are EAGLE-2's greedy tree.

A lookup branch (``lookup``: a ``PromptLookup`` chain of K tokens, ``drafter.eagle.lookup``)
adds the continuation of the longest n-gram match in the committed text as one more child of
the root, after every EAGLE node: the tokens a reply copies from its prompt, which one layer
trained on replies rarely predicts (``experiments/eagle_smollm2/hit_rates.py``). Its nodes are
deterministic proposals (q one-hot). Being last among the root's children keeps sampled mode
exact: the siblings drawn without replacement are all tried before it, and if one of them
already proposed its token, its renormalised q is zero and it is skipped.
"""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import struct
from jax.sharding import PartitionSpec as P
from ml_collections import config_dict

from specjax import sampling
from specjax.drafters import artifact, prompt_lookup
from specjax.drafters.base import (
  Chain,
  Draft,
  DraftContext,
  Prefill,
  Verdict,
  check_auto_from,
  sampled_candidates,
)
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.models import llama, schema, source
from specjax.models.cache import KVCache, gather_rows
from specjax.models.config import ModelConfig

FIELD = "config.drafter.eagle"
CANDIDATES = ("auto", "top_k", "sampled")
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


# --- the drafter ------------------------------------------------------------------------------


def pool_size(top_k: int, depth: int) -> int:
  """Nodes offered per step: the root's top_k children, then top_k^2 per further level."""
  return top_k + (depth - 1) * top_k**2


def check_shape(top_k, depth, total) -> None:
  """The tree budget ``(top_k, depth, total)``: one clear error naming the field."""
  for f, value in (("top_k", top_k), ("depth", depth), ("total", total)):
    if int(value) != value or value < 1:
      raise ValueError(f"{FIELD}.{f} must be an integer >= 1, got {value}.")
  if total < depth:
    raise ValueError(
      f"{FIELD}.total={total} is smaller than depth={depth}: a tree of {total} nodes cannot "
      f"reach depth {depth}; raise total or lower depth."
    )
  if total > pool_size(top_k, depth):
    raise ValueError(
      f"{FIELD}.total={total} exceeds the {pool_size(top_k, depth)} nodes that top_k={top_k} "
      f"and depth={depth} offer (top_k + (depth - 1) * top_k^2): lower total or raise top_k."
    )


@struct.dataclass
class EagleState:
  cache: KVCache  # one layer; lengths = pairs committed (the newest token's index L minus 1)
  pending_BxD1xF: jax.Array  # target features of the pairs not yet in the cache (to ``count``)
  count_B: jax.Array  # how many: the tokens accepted last step plus one


@dataclasses.dataclass(frozen=True)
class Eagle(Chain):
  """An EAGLE drafter growing an EAGLE-2 tree of ``total`` nodes, ``depth`` deep, expanding the
  ``top_k`` best nodes per level (``top_k = 1`` and ``total = depth``: a chain)."""

  cfg: EagleConfig
  top_k: int = 4
  depth: int = 4
  total: int = 12
  sampled: bool | None = False  # None: candidates "auto", set per run (base.at_temperature)
  lookup: PromptLookup | None = None  # a chain of prompt-lookup guesses, the root's last child
  name: str = "eagle"

  def __post_init__(self):
    check_shape(self.top_k, self.depth, self.total)
    if self.top_k > self.cfg.draft_vocab:
      raise ValueError(f"{FIELD}.top_k={self.top_k} exceeds the draft vocabulary.")
    prompt_lookup.check_branch(self.lookup, FIELD)

  @property
  def feature_layers(self) -> tuple:
    return self.cfg.feature_layers

  @property
  def cache_model(self) -> ModelConfig:
    return self.cfg.layer

  @property
  def partition_rules(self):
    """On a decoding mesh: the layer and embedding like the target's, the head by rows."""
    return (*llama.RULES, (r"(^|/)proj$", P("tensor", None)))

  @property
  def num_lookup(self) -> int:
    return 0 if self.lookup is None else self.lookup.num_draft

  @property
  def num_draft(self) -> int:
    """The deepest node: EAGLE's depth, or the lookup chain's length if longer."""
    return max(self.depth, self.num_lookup)

  @property
  def num_nodes(self) -> int:
    return self.total + self.num_lookup

  def check_params(self, params) -> None:
    """The drafter's weights fit its shapes (``load`` / ``init_params`` give such params)."""
    f, w = self.cfg.target.dim, self.cfg.draft_vocab
    want = {"fc": (f, 2 * f), "fc_b": (f,), "norm": (f,), "proj": (w, f), "vocab_ids": (w,),
            "embed": (self.cfg.target.vocab_size, f)}  # fmt: skip
    if self.cfg.fused:
      want["fuse"] = (f, len(self.feature_layers) * f)
    got = params if isinstance(params, dict) else {}
    for k, shape in want.items():
      if k not in got or tuple(np.shape(got[k])) != shape:
        have = tuple(np.shape(got[k])) if k in got else "missing"
        raise ValueError(f"EAGLE drafter_params[{k!r}] is {have}, expected {shape}.")
    layer = got.get("layer") if isinstance(got.get("layer"), dict) else {}
    for path, p in schema.entries(llama.SCHEMA, self.cfg.layer, 1):
      if path[0] == "layers":
        shape, have = p.shape(self.cfg.layer), layer.get(path[2])
        if have is None or tuple(np.shape(have)) != shape:
          have = "missing" if have is None else tuple(np.shape(have))
          raise ValueError(
            f"EAGLE drafter_params['layer'][{path[2]!r}] is {have}, expected {shape}."
          )

  def draft_calls_per_step(self) -> int:
    return self.depth

  @staticmethod
  def config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.path = ""  # a drafter saved by task=train with objective.name=eagle (its draft_final)
    c.top_k = 4  # nodes expanded per level, and children offered by each
    c.depth = 4  # levels drafted (draft forwards per step)
    # Nodes kept for verification (the tree's size), or "auto": the budget (top_k, depth,
    # total) predicted fastest where it runs, from auto_from's greedy τ of every budget.
    c.total = config_dict.FieldReference(12, field_type=object)
    c.auto_from = ""  # total = "auto": a cost_model.json with this drafter's eagle_grid
    c.candidates = "auto"  # auto (sampled iff temperature > 0) | top_k | sampled
    prompt_lookup.add_branch_fields(c)
    return c

  @classmethod
  def check(cls, c, config):
    if c.candidates not in CANDIDATES:
      raise ValueError(
        f"{FIELD}.candidates={c.candidates!r} is unknown; choose one of {', '.join(CANDIDATES)}."
      )
    prompt_lookup.check_branch_fields(c, FIELD)
    if c.total == "auto" and c.lookup:
      raise ValueError(
        f"{FIELD}.total='auto' prices EAGLE trees without a lookup branch: set lookup = 0 or "
        "give total."
      )
    if c.total == "auto":
      holds = "with an eagle variant of this drafter (it holds τ for every tree budget)"
      name = check_auto_from(c, FIELD, holds, config, knob="total")
      if not c.path:
        raise ValueError(f"{FIELD}.total='auto' picks a budget for a trained drafter: set path.")
      from specjax import costmodel  # (it prices every drafter: imported here, not at the top)

      costmodel.eagle_grid(c.auto_from, name, c.path)
    elif isinstance(c.total, str):
      raise ValueError(
        f"{FIELD}.total={c.total!r}: an integer number of nodes, or 'auto' (with auto_from) to "
        "pick the tree budget for this machine."
      )
    else:
      check_shape(c.top_k, c.depth, c.total)
    if not c.path:  # task=train decodes with the drafter it trains
      return None
    cfg = EagleConfig.fromdict(read_meta(c.path)["eagle"])
    d = cls(cfg, *_budget(c), lookup=prompt_lookup.branch(c))
    target = source.peek(config.target)  # its header: a mismatch shows before the weights load
    if target is not None:
      d.check_target(target.cfg)
    return d

  @classmethod
  def build(cls, c, config, target):
    if not c.path:
      raise ValueError(
        f"{FIELD}.path is empty: EAGLE decodes with a trained drafter (task=train with "
        "objective.name=eagle writes one into workdir/draft_final)."
      )
    cfg, params, _ = load(c.path, target)
    sampled = sampled_candidates(c)
    # total = "auto": set by build.drafter
    d = cls(cfg, *_budget(c), sampled, prompt_lookup.branch(c))
    d.check_target(target.cfg)
    return d, params

  def check_target(self, target_cfg: ModelConfig) -> None:
    if (self.cfg.target.dim, self.cfg.target.vocab_size) != (target_cfg.dim, target_cfg.vocab_size):
      raise ValueError(
        f"an EAGLE drafter for hidden size {self.cfg.target.dim} and vocabulary "
        f"{self.cfg.target.vocab_size} cannot read target {target_cfg.name!r} (hidden size "
        f"{target_cfg.dim}, vocabulary {target_cfg.vocab_size}): train one for this target."
      )
    llama.check_features(target_cfg, self.feature_layers)

  # -- state --

  def init(self, params, prefill: Prefill):
    """Runs the prompt's pairs (s_i, t_{i+1}) into the draft cache; the last prompt position's
    pair waits for the first sampled token."""
    b, p = prefill.tokens.shape
    s_BxPxF = fuse(params, prefill.features)
    next_BxP = jnp.concatenate([prefill.tokens[:, 1:], prefill.tokens[:, :1]], axis=1)
    cache = llama.init_cache(self.cfg.layer, b, prefill.num_slots, llama.param_dtype(params))
    positions = jnp.broadcast_to(jnp.arange(p), (b, p))
    attn = llama.attention_inputs(cache.lengths, llama.causal_mask(p), cache.num_slots, window=p)
    _, k, v = layer(params, self.cfg, inputs(params, self.cfg, next_BxP, s_BxPxF), positions,
                    cache.k[0], cache.v[0], attn)  # fmt: skip
    last = (prefill.lengths - 1)[:, None, None]
    last_BxF = jnp.take_along_axis(prefill.features, last, axis=1)[:, 0]
    pending = jnp.zeros((b, self.num_draft + 1, last_BxF.shape[-1]), last_BxF.dtype)
    return EagleState(
      cache=KVCache((k,), (v,), prefill.lengths - 1),
      pending_BxD1xF=pending.at[:, 0].set(last_BxF),
      count_B=jnp.ones((b,), jnp.int32),
    )

  def commit(self, state, verdict: Verdict, ctx):
    return state.replace(pending_BxD1xF=verdict.features, count_B=verdict.num_accepted + 1)

  # -- one step --

  def _catch_up(self, params, state: EagleState, ctx: DraftContext):
    """The pending pairs into the cache; returns the last one's output (it drafts depth 1)."""
    t = self.num_draft + 1
    start_B = ctx.lengths - state.count_B  # first pending pair's position
    positions_BxT = start_B[:, None] + jnp.arange(t)
    tokens_BxT = gather_rows(ctx.tokens, positions_BxT + 1)
    cache = state.cache.replace(lengths=start_B)
    attn = llama.attention_inputs(start_B, llama.causal_mask(t), cache.num_slots)
    x = inputs(params, self.cfg, tokens_BxT, fuse(params, state.pending_BxD1xF))
    out_BxTxF, k, v = layer(params, self.cfg, x, positions_BxT, cache.k[0], cache.v[0], attn)
    last = (state.count_B - 1)[:, None, None]
    cache = KVCache((k,), (v,), ctx.lengths)  # pairs up to the newest token's predecessor
    return jnp.take_along_axis(out_BxTxF, last, axis=1)[:, 0], cache

  def _children(self, logits_BxMxW, key, sp):
    """Each of M nodes' top_k children: tokens (draft-vocabulary ids), their log score, and the
    q they were drawn from (sampled mode)."""
    k = self.top_k
    log_soft = jax.nn.log_softmax(logits_BxMxW, axis=-1)
    if not self.sampled:
      score, tok = jax.lax.top_k(log_soft, k)
      return tok, score, None
    q_BxMxW = sampling.probs(logits_BxMxW, sp)
    greedy = sp.temperature <= 0
    gumbel = jax.random.gumbel(key, q_BxMxW.shape)
    _, tok = jax.lax.top_k(jnp.where(greedy, logits_BxMxW, jnp.log(q_BxMxW) + gumbel), k)
    # The rank-r child's score is q's r-th largest probability: the parent's, not the draw's.
    rank_score = jnp.log(jax.lax.top_k(q_BxMxW, k)[0])
    return tok, jnp.where(greedy, jax.lax.top_k(log_soft, k)[0], rank_score), q_BxMxW

  def propose(self, params, state, ctx: DraftContext):
    keys = jax.random.split(ctx.key, self.depth)
    root_BxF, cache = self._catch_up(params, state, ctx)
    tok, score, q = self._children(logits(params, root_BxF)[:, None], keys[0], ctx.sampling)
    pool = Pool.start(tok[:, 0], score[:, 0], None if q is None else q[:, 0], root_BxF)
    expanded = Expanded.empty(ctx.tokens.shape[0])
    for d in range(1, self.depth):
      frontier_BxK = pool.best_of_level(d, self.top_k)
      expanded = expanded.add(frontier_BxK, pool.parent_BxP, d)
      out_BxKxF = self._expand(params, cache, ctx, pool, expanded)
      tok, score, q = self._children(logits(params, out_BxKxF), keys[d], ctx.sampling)
      pool = pool.offer(frontier_BxK, tok, score, q, out_BxKxF)
    draft = self._rerank(params, pool)
    if self.lookup is not None:
      draft = self._with_lookup(draft, ctx)
    return draft, state.replace(cache=cache)

  def _with_lookup(self, draft: Draft, ctx: DraftContext) -> Draft:
    """The lookup chain after EAGLE's nodes (node ids ``total + 1 ..``)."""
    return prompt_lookup.with_branch(draft, self.lookup, ctx)

  def _expand(self, params, cache, ctx: DraftContext, pool: "Pool", expanded: "Expanded"):
    """One read-only forward of every expanded node (pair: its parent's output, its token)
    over the committed pairs and its expanded ancestors; the newest ``top_k`` nodes' outputs."""
    ids = jnp.take_along_axis(pool.tok_BxP, expanded.nodes_BxM, axis=1)
    tokens = params["vocab_ids"][ids]  # draft-vocabulary ids -> the target's
    s_in = jnp.take_along_axis(pool.s_in_BxPxF, expanded.nodes_BxM[..., None], axis=1)
    positions = ctx.lengths[:, None] + jnp.asarray(np.asarray(expanded.depths) - 1)
    attn = llama.attention_inputs(ctx.lengths, expanded.ancestors_BxMxM, cache.num_slots,
                                  write=False)  # fmt: skip
    x = inputs(params, self.cfg, tokens, s_in)
    out, _, _ = layer(params, self.cfg, x, positions, cache.k[0], cache.v[0], attn)
    return out[:, -self.top_k :]

  def _rerank(self, params, pool: "Pool") -> Draft:
    """The ``total`` best offered nodes (ties: the lower pool index, i.e. shallower, then
    earlier), sorted by pool index: parents before children."""
    b, p = pool.tok_BxP.shape
    keep_BxN = jnp.sort(jax.lax.top_k(pool.score_BxP, self.total)[1], axis=1)
    # Pool index -> node id (1-based; the root is 0).
    node_of = jnp.zeros((b, p + 1), jnp.int32)  # slot p: the root's "pool index" -1
    node_of = node_of.at[jnp.arange(b)[:, None], keep_BxN].set(jnp.arange(1, self.total + 1))
    parent_pool = jnp.take_along_axis(pool.parent_BxP, keep_BxN, axis=1)
    parents_BxN = jnp.take_along_axis(node_of, jnp.where(parent_pool < 0, p, parent_pool), axis=1)
    vocab_ids = params["vocab_ids"]
    tokens_BxN = vocab_ids[jnp.take_along_axis(pool.tok_BxP, keep_BxN, axis=1)]
    if not self.sampled:
      return Draft(tokens=tokens_BxN, parents=parents_BxN)
    dist_BxN = jnp.take_along_axis(pool.dist_BxP, keep_BxN, axis=1)
    q_BxNxW = jnp.take_along_axis(pool.q_BxDxW, dist_BxN[..., None], axis=1)
    if self.cfg.vocab_size:  # q is zero outside the draft vocabulary
      q_BxNxV = jnp.zeros(tokens_BxN.shape + (self.cfg.target.vocab_size,), q_BxNxW.dtype)
      q_BxNxW = q_BxNxV.at[:, :, vocab_ids].set(q_BxNxW)
    return Draft(tokens=tokens_BxN, probs=q_BxNxW, parents=parents_BxN)


def _budget(c) -> tuple[int, int, int]:
  """``(top_k, depth, total)`` of ``config.drafter.eagle``; a one-node placeholder for
  ``total = "auto"``, which ``build.drafter`` replaces with the budget it picks."""
  return (1, 1, 1) if c.total == "auto" else (c.top_k, c.depth, c.total)


@struct.dataclass
class Pool:
  """Every node offered so far in one step, level by level (the root's k children, then k^2
  per level): token (draft-vocabulary id), cumulative score, parent (pool index; -1 = the
  root), the input feature it is fed with (its parent's output), and (sampled mode) which
  distribution drew it (0: the root's, 1 + e: the e-th expanded node's) with those
  distributions."""

  tok_BxP: jax.Array
  score_BxP: jax.Array
  parent_BxP: jax.Array
  s_in_BxPxF: jax.Array
  dist_BxP: jax.Array
  q_BxDxW: jax.Array | None
  level_starts: tuple = struct.field(pytree_node=False)  # pool index where each level starts

  @classmethod
  def start(cls, tok_BxK, score_BxK, q_BxW, root_BxF) -> "Pool":
    b, k = tok_BxK.shape
    return cls(
      tok_BxK, score_BxK, jnp.full((b, k), -1, jnp.int32),
      jnp.broadcast_to(root_BxF[:, None], (b, k, root_BxF.shape[-1])),
      jnp.zeros((b, k), jnp.int32), None if q_BxW is None else q_BxW[:, None], (0,),
    )  # fmt: skip

  def best_of_level(self, level: int, k: int) -> jax.Array:
    """``[B, k]`` pool indices of level ``level``'s best k nodes (all k of level 1)."""
    lo = self.level_starts[level - 1]
    hi = self.level_starts[level] if level < len(self.level_starts) else self.tok_BxP.shape[1]
    return lo + jax.lax.top_k(self.score_BxP[:, lo:hi], k)[1]

  def offer(self, frontier_BxK, tok_BxKxK, score_BxKxK, q_BxKxW, out_BxKxF) -> "Pool":
    """Adds each frontier node's k children (scores accumulated along the path)."""
    b, k = frontier_BxK.shape
    parent_score = jnp.take_along_axis(self.score_BxP, frontier_BxK, axis=1)
    score = (parent_score[:, :, None] + score_BxKxK).reshape(b, k * k)
    first_dist = 0 if self.q_BxDxW is None else self.q_BxDxW.shape[1]
    cat = lambda a, x: jnp.concatenate([a, x], axis=1)  # noqa: E731
    return Pool(
      cat(self.tok_BxP, tok_BxKxK.reshape(b, k * k)),
      cat(self.score_BxP, score),
      cat(self.parent_BxP, jnp.repeat(frontier_BxK, k, axis=1)),
      cat(self.s_in_BxPxF, jnp.repeat(out_BxKxF, k, axis=1)),
      cat(self.dist_BxP, jnp.broadcast_to(jnp.repeat(first_dist + jnp.arange(k), k), (b, k * k))),
      None if self.q_BxDxW is None else cat(self.q_BxDxW, q_BxKxW),
      self.level_starts + (self.tok_BxP.shape[1],),
    )


@struct.dataclass
class Expanded:
  """The nodes expanded so far, in expansion order: pool index, depth, and which of them are
  each one's ancestors (itself included): the attention mask of their forward."""

  nodes_BxM: jax.Array
  ancestors_BxMxM: jax.Array
  depths: tuple = struct.field(pytree_node=False)

  @classmethod
  def empty(cls, b: int) -> "Expanded":
    return cls(jnp.zeros((b, 0), jnp.int32), jnp.zeros((b, 0, 0), bool), ())

  def add(self, frontier_BxK, parent_BxP, depth: int) -> "Expanded":
    """The frontier joins; a new node's ancestors are its parent's row (the parent was
    expanded one level up, or is the root) plus itself."""
    b, k = frontier_BxK.shape
    m = self.nodes_BxM.shape[1]
    parent_BxK = jnp.take_along_axis(parent_BxP, frontier_BxK, axis=1)
    is_parent_BxKxM = (self.nodes_BxM[:, None, :] == parent_BxK[:, :, None]).astype(jnp.int32)
    anc_BxMxM = self.ancestors_BxMxM.astype(jnp.int32)
    inherited = jnp.einsum("bkm,bmn->bkn", is_parent_BxKxM, anc_BxMxM) > 0
    rows = jnp.concatenate([inherited, jnp.broadcast_to(jnp.eye(k, dtype=bool), (b, k, k))], 2)
    old = jnp.pad(self.ancestors_BxMxM, ((0, 0), (0, 0), (0, k)))
    return Expanded(
      jnp.concatenate([self.nodes_BxM, frontier_BxK], axis=1),
      jnp.concatenate([old, rows], axis=1) if m else rows,
      self.depths + (depth,) * k,
    )


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
  return artifact.read_meta(directory, META_FILE, FORMAT, field, hint)


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
