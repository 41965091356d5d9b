"""EAGLE's decoding side: ``Eagle`` (the drafter protocol over a dynamic tree under static
shapes), its state, and its teacher-forced drafts for the τ simulator. The tree's budget, pool
and expansion are ``tree.py``; the model it runs is ``model.py``; the package docstring
describes both.
"""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import struct
from ml_collections import config_dict

from specjax import indexing, sampling
from specjax.drafters import curves, prompt_lookup
from specjax.drafters.base import (
  DECODES_CONFIG_DRAFTER,
  Draft,
  DraftContext,
  DrafterBase,
  Forward,
  Prefill,
  Verdict,
  check_auto_from,
  llama_sizes,
  sampled_candidates,
  verify_forward,
)
from specjax.drafters.eagle.layouts import load
from specjax.drafters.eagle.model import (
  FIELD,
  EagleConfig,
  check_shapes,
  fuse,
  inputs,
  layer,
  logits,
  param_shapes,
  read_meta,
  rollout_layer,
)
from specjax.drafters.eagle.tree import Expanded, Pool, check_shape
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.models import llama, source
from specjax.models.cache import KVCache, gather_rows
from specjax.models.config import ModelConfig
from specjax.trees import Tree

# --- the drafter ------------------------------------------------------------------------------

_NO_PATH = (
  f"{FIELD}.path is empty: EAGLE decodes with a trained drafter (task=train with "
  "objective.name=eagle writes one into workdir/draft_final); set path to its directory."
)


@struct.dataclass
class EagleState:
  cache: KVCache  # one layer; lengths = pairs committed (the newest token's index L minus 1)
  pending_BxD1xF: jax.Array  # target features of the pairs not yet in the cache (to ``count``)
  count_B: jax.Array  # how many: the tokens accepted last step plus one


@dataclasses.dataclass(frozen=True)
class Eagle(DrafterBase):
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
    want = {"embed": (self.cfg.target.vocab_size, self.cfg.target.dim)} | param_shapes(self.cfg)
    check_shapes(params, want, "EAGLE")

  def draft_calls_per_step(self) -> int:
    return self.depth

  @staticmethod
  def config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    # A drafter saved by task=train with objective.name=eagle (its draft_final), or a published
    # one's directory (SafeAILab EAGLE-1/2 or EAGLE-3, SpecForge, vLLM speculators).
    c.path = ""
    c.format = "auto"  # auto (detected) | specjax | eagle | eagle3 | speculators
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
    sampled_candidates(c, FIELD)
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
      curves.eagle_grid(c.auto_from, name, c.path)
    elif isinstance(c.total, str):
      raise ValueError(
        f"{FIELD}.total={c.total!r}: an integer number of nodes, or 'auto' (with auto_from) to "
        "pick the tree budget for this machine."
      )
    else:
      check_shape(c.top_k, c.depth, c.total)
    from specjax.drafters.eagle import formats

    fmt = c.get("format", "auto")
    if not c.path:
      if config.get("task") in DECODES_CONFIG_DRAFTER:  # train decodes the drafter it trains
        raise ValueError(_NO_PATH)
      if fmt not in formats.FORMATS:
        raise ValueError(f"{FIELD}.format={fmt!r} is unknown; choose one of {formats.FORMATS}.")
      return None
    layout = formats.layout(c.path, fmt)  # the layout, its config's flags: no weights read
    target = source.peek(config.target)  # its header: a mismatch shows before the weights load
    if layout["fmt"] == "specjax":
      cfg = EagleConfig.fromdict(read_meta(c.path)["eagle"])
    elif target is None:  # a random target: its sizes are known once it is built
      return None
    else:
      cfg = formats.plan(c.path, target.cfg, fmt).cfg  # sizes and tensor headers checked
    d = cls(cfg, *_budget(c), lookup=prompt_lookup.branch(c))
    if target is not None:
      d.check_target(target.cfg)
    return d

  @classmethod
  def build(cls, c, config, target):
    if not c.path:
      raise ValueError(_NO_PATH)
    cfg, params, _ = load(c.path, target, c.get("format", "auto"))
    sampled = sampled_candidates(c, FIELD)
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
    last_BxF = indexing.take_along(prefill.features, last, axis=1)[:, 0]
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
    return indexing.take_along(out_BxTxF, last, axis=1)[:, 0], cache

  def _children(self, logits_BxMxW, key, sp):
    """Each of M nodes' top_k children: tokens (draft-vocabulary ids), their log score, and the
    q they were drawn from (sampled mode)."""
    k = self.top_k
    log_soft = jax.nn.log_softmax(logits_BxMxW, axis=-1)
    if not self.sampled:
      score, tok = jax.lax.top_k(log_soft, k)
      return tok, score, None
    q_BxMxW = sampling.probs(logits_BxMxW, sp)
    greedy = sampling.is_greedy(sp)
    if greedy is True:  # static temperature 0: q is one-hot, the children are the top-k
      return jax.lax.top_k(logits_BxMxW, k)[1], jax.lax.top_k(log_soft, k)[0], q_BxMxW
    gumbel = jax.random.gumbel(key, q_BxMxW.shape)
    _, tok = jax.lax.top_k(jnp.where(greedy, logits_BxMxW, jnp.log(q_BxMxW) + gumbel), k)
    # The rank-r child's score is q's r-th largest probability: the parent's, not the draw's.
    rank_score = jnp.log(jax.lax.top_k(q_BxMxW, k)[0])
    if greedy is False:
      return tok, rank_score, q_BxMxW
    return tok, jnp.where(greedy, jax.lax.top_k(log_soft, k)[0], rank_score), q_BxMxW

  @property
  def verifies_tree(self) -> bool:
    return True

  def step_forwards(self):
    """The catch-up (its head on the last accepted pair), then each further level's forward
    over its top_k new nodes and their head; a lookup branch adds its nodes to the verify (its
    n-gram search, ~0.1 ms, is not priced)."""
    levels = (Forward("eagle_level", self.top_k),) * (self.depth - 1)
    return (Forward("eagle", self.num_draft + 1),) + levels + (verify_forward(self),)

  def own_sizes(self, params):
    layer = llama_sizes(dataclasses.replace(self.cfg.layer, num_layers=1))
    own = sum(int(np.size(v)) for k, v in jax.tree_util.tree_leaves_with_path(params)
              if "embed" not in jax.tree_util.keystr(k))  # fmt: skip
    return {"eagle": (own, layer[1]), "eagle_level": (own, layer[1])}

  @property
  def static_tree(self) -> Tree | None:
    """A chain when top_k = 1 and every node is on it; else None: a tree of its own per step."""
    chain = self.top_k == 1 and self.total == self.depth and self.lookup is None
    return Tree.chain(self.depth) if chain else None

  def with_chain_length(self, k: int):
    return dataclasses.replace(self, depth=k, total=k)

  def teacher_forced_drafts(self, target, params, x_1xS, roots_R, row_len):
    """A chain: the drafter's rollout on its own features from pair ``r - 1`` (the training-
    time test's forward). A dynamic tree: its own ``propose``, one row per root, over a draft
    cache of the text's pairs cut at the root, with its lookup branch if it has one."""
    del row_len
    if self.static_tree is None:
      return (*_teacher_forced_tree(target, self, params, x_1xS, roots_R), _none(roots_R))
    return _teacher_forced_chain(target, self, params, x_1xS, roots_R), None, _none(roots_R)

  def propose(self, params, state, ctx: DraftContext):
    keys = jax.random.split(ctx.key, self.depth)
    root_BxF, cache = self._catch_up(params, state, ctx)
    tok, score, q = self._children(
      logits(params, self.cfg, root_BxF)[:, None], keys[0], ctx.sampling
    )
    pool = Pool.start(tok[:, 0], score[:, 0], None if q is None else q[:, 0], root_BxF)
    expanded, tree_kv = Expanded.empty(ctx.tokens.shape[0]), None
    for d in range(1, self.depth):
      frontier_BxK = pool.best_of_level(d, self.top_k)
      expanded = expanded.add(frontier_BxK, pool.parent_BxP, d)
      out_BxKxF, tree_kv = self._expand(params, cache, ctx, pool, expanded, tree_kv)
      tok, score, q = self._children(logits(params, self.cfg, out_BxKxF), keys[d], ctx.sampling)
      pool = pool.offer(frontier_BxK, tok, score, q, out_BxKxF)
    draft = self._rerank(params, pool)
    if self.lookup is not None:
      draft = self._with_lookup(draft, ctx)
    return draft, state.replace(cache=cache)

  def _with_lookup(self, draft: Draft, ctx: DraftContext) -> Draft:
    """The lookup chain after EAGLE's nodes (node ids ``total + 1 ..``)."""
    return prompt_lookup.with_branch(draft, self.lookup, ctx)

  def _expand(self, params, cache, ctx: DraftContext, pool: Pool, expanded: Expanded, tree_kv):
    """One read-only forward of the newest ``top_k`` expanded nodes (pair: the parent's output,
    the node's token) over the committed pairs and their expanded ancestors, whose keys and
    values the earlier levels left in ``tree_kv`` (a pair's keys and values depend only on the
    pair and its position): ``(their outputs, tree_kv with theirs appended)``."""
    new_BxK = expanded.nodes_BxM[:, -self.top_k :]
    ids = indexing.take_along(pool.tok_BxP, new_BxK, axis=1)
    tokens = params["vocab_ids"][ids]  # draft-vocabulary ids -> the target's
    s_in = indexing.take_along(pool.s_in_BxPxF, new_BxK[..., None], axis=1)
    positions = ctx.lengths[:, None] + jnp.asarray(np.asarray(expanded.depths[-self.top_k :]) - 1)
    mask_BxKxM = expanded.ancestors_BxMxM[:, -self.top_k :]
    attn = llama.attention_inputs(ctx.lengths, mask_BxKxM, cache.num_slots, write=False)
    x = inputs(params, self.cfg, tokens, s_in)
    out, k, v = layer(params, self.cfg, x, positions, cache.k[0], cache.v[0], attn, tree_kv)
    return out, (k, v)  # tree_kv's keys and values, then these nodes'

  def _rerank(self, params, pool: Pool) -> Draft:
    """The ``total`` best offered nodes (ties: the lower pool index, i.e. shallower, then
    earlier), sorted by pool index: parents before children."""
    b, p = pool.tok_BxP.shape
    keep_BxN = jnp.sort(jax.lax.top_k(pool.score_BxP, self.total)[1], axis=1)
    # Pool index -> node id (1-based; the root is 0).
    node_of = jnp.zeros((b, p + 1), jnp.int32)  # slot p: the root's "pool index" -1
    node_of = node_of.at[jnp.arange(b)[:, None], keep_BxN].set(jnp.arange(1, self.total + 1))
    parent_pool = indexing.take_along(pool.parent_BxP, keep_BxN, axis=1)
    parents_BxN = indexing.take_along(node_of, jnp.where(parent_pool < 0, p, parent_pool), axis=1)
    vocab_ids = params["vocab_ids"]
    tokens_BxN = vocab_ids[indexing.take_along(pool.tok_BxP, keep_BxN, axis=1)]
    if not self.sampled:
      return Draft(tokens=tokens_BxN, parents=parents_BxN)
    dist_BxN = indexing.take_along(pool.dist_BxP, keep_BxN, axis=1)
    q_BxNxW = indexing.take_along(pool.q_BxDxW, dist_BxN[..., None], axis=1)
    if self.cfg.vocab_size:  # q is zero outside the draft vocabulary
      q_BxNxV = jnp.zeros(tokens_BxN.shape + (self.cfg.target.vocab_size,), q_BxNxW.dtype)
      q_BxNxW = q_BxNxV.at[:, :, vocab_ids].set(q_BxNxW)
    return Draft(tokens=tokens_BxN, probs=q_BxNxW, parents=parents_BxN)


def _budget(c) -> tuple[int, int, int]:
  """``(top_k, depth, total)`` of ``config.drafter.eagle``; a one-node placeholder for
  ``total = "auto"``, which ``build.drafter`` replaces with the budget it picks."""
  return (1, 1, 1) if c.total == "auto" else (c.top_k, c.depth, c.total)


# --- teacher-forced drafts (the τ simulator) ----------------------------------------------


def _none(roots_R):
  return jnp.zeros(roots_R.shape, bool)


def _teacher_forced_chain(target, drafter, p, x_1xS, roots_R) -> jax.Array:
  """Depth j of the chain rooted at r: rollout step j from pair r - 1 (see the objective)."""
  s = x_1xS.shape[1]
  _, feats = llama.logits_of(target.params, target.cfg, x_1xS, drafter.feature_layers)
  f_in = jnp.concatenate(feats, axis=-1)[:, :-1]
  t = s - 1
  positions = jnp.arange(t)[None]
  shift = lambda a, j: jnp.pad(a[:, j : j + t], [(0, 0), (0, t - a[:, j : j + t].shape[1])])  # noqa: E731
  x = inputs(p, drafter.cfg, x_1xS[:, 1:], fuse(p, f_in))
  attn = llama.attention_inputs(jnp.zeros((1,), jnp.int32), llama.causal_mask(t), 0, 0, False)
  out, k1, v1 = layer(p, drafter.cfg, x, positions, None, None, attn)
  picks, rolled = [], []
  for j in range(1, drafter.depth + 1):
    if j > 1:
      x = inputs(p, drafter.cfg, shift(x_1xS, j), out)
      out, k, v = rollout_layer(p, drafter.cfg, x, positions + j - 1, (k1, v1), rolled)
      rolled.append((k, v))
    picks.append(p["vocab_ids"][jnp.argmax(logits(p, drafter.cfg, out)[0], -1)])
  return jnp.stack(picks, -1)[roots_R - 1]


def _teacher_forced_tree(target, drafter, p, x_1xS, roots_R) -> tuple[jax.Array, jax.Array]:
  """``propose`` at every root at once: the draft cache holds the text's pairs (written by
  ``init`` from the teacher-forced features), each row cut at its root, whose own pair
  (features of ``r - 1``) is pending. Decoding has the n + 1 pairs of its last step pending
  instead, but a pair's keys and values depend only on the pair and its position, so the
  last one's output, which drafts depth 1, sees the same cache either way."""
  s = x_1xS.shape[1]
  _, feats = llama.logits_of(target.params, target.cfg, x_1xS, drafter.feature_layers)
  f_1xSxF = jnp.concatenate(feats, axis=-1)
  slots = s + drafter.num_draft + 1  # the catch-up writes D + 1 slots from the root's pair
  whole = drafter.init(p, Prefill(x_1xS, jnp.asarray([s], jnp.int32), f_1xSxF, slots))
  r = roots_R.shape[0]
  tile = lambda a: jnp.repeat(a, r, axis=0)  # noqa: E731
  pending = jnp.zeros((r, drafter.num_draft + 1, f_1xSxF.shape[-1]), f_1xSxF.dtype)
  cache = KVCache(tuple(map(tile, whole.cache.k)), tuple(map(tile, whole.cache.v)), roots_R - 1)
  state = EagleState(
    cache=cache,
    pending_BxD1xF=pending.at[:, 0].set(f_1xSxF[0, roots_R - 1]),
    count_B=jnp.ones((r,), jnp.int32),
  )
  ctx = DraftContext(
    tokens=tile(jnp.pad(x_1xS, ((0, 0), (0, slots - s)))),
    lengths=roots_R,
    key=jax.random.key(0),
    sampling=sampling.SamplingParams.create(temperature=0.0),
    vocab_size=target.cfg.vocab_size,
  )
  draft, _ = drafter.propose(p, state, ctx)
  return draft.tokens, draft.parents
