"""P-EAGLE's drafter: ``num_depths`` tokens drafted in one forward of the EAGLE-3 layer,
verified as a chain or a static tree; its state, config section and build. The model is
``model.py``."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import struct

from specjax import indexing
from specjax.drafters import prompt_lookup, static_tree
from specjax.drafters.base import (
  DECODES_CONFIG_DRAFTER,
  DraftContext,
  DrafterBase,
  Forward,
  Prefill,
  Verdict,
  llama_sizes,
  sampled_candidates,
  verify_forward,
)
from specjax.drafters.eagle import model as eagle_model
from specjax.drafters.peagle import layouts, model
from specjax.drafters.peagle.model import FIELD, PEagleConfig
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.drafters.timing import median_seconds
from specjax.models import llama, source
from specjax.models.cache import KVCache, gather_rows
from specjax.models.config import ModelConfig
from specjax.sampling import SamplingParams
from specjax.trees import Tree

_NO_PATH = (
  f"{FIELD}.path is empty: P-EAGLE decodes with a trained drafter (task=train with "
  "objective.name=peagle writes one into workdir/draft_final); set path to its directory."
)


def parse_tree(c: ml_collections.ConfigDict, num_depths: int, field: str = FIELD) -> Tree:
  """The tree of ``config.drafter.peagle`` over a block drafting ``num_depths`` tokens."""
  return static_tree.parse(c, num_depths, field, "a drafter trained with more num_depths")


@struct.dataclass
class PEagleState:
  """The committed pairs' keys and values (one layer; ``lengths``: pairs written), and the
  last verdict's features (the root's and the accepted nodes'), whose pairs join the cache as
  the next block begins."""

  cache: KVCache
  pending: jax.Array  # [B, D + 1, nF]
  count: jax.Array  # [B] pending pairs: the tokens accepted last step plus one


@dataclasses.dataclass(frozen=True)
class PEagle(static_tree.OnStaticTree, DrafterBase):
  """A P-EAGLE drafter: each step one forward over [the newest pair, K - 1 masked rows] gives a
  distribution for each of the K tokens after the newest; ``tree`` (depth at most K) takes each
  depth's ranked candidates (a chain: the top or sampled token per depth)."""

  cfg: PEagleConfig
  tree: Tree
  sampled: bool | None = False  # None: candidates "auto", set per run (base.at_temperature)
  lookup: PromptLookup | None = None  # a chain of prompt-lookup guesses, the root's last child
  name: str = "peagle"

  def __post_init__(self):
    if self.tree.num_nodes == 0 or self.tree.max_depth > self.cfg.num_depths:
      raise ValueError(
        f"{FIELD}: the tree needs 1 to {self.cfg.num_depths} levels (num_depths), got "
        f"{self.tree.max_depth}."
      )
    prompt_lookup.check_branch(self.lookup, FIELD)

  @property
  def feature_layers(self) -> tuple:
    return self.cfg.eagle.feature_layers

  @staticmethod
  def config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.path = ""  # a drafter saved by specjax (peagle.json) or speculators' peagle layout
    c.format = "auto"  # auto | specjax | speculators
    static_tree.add_fields(c, chain=True)
    return c

  @classmethod
  def check(cls, c, config):
    sampled_candidates(c, FIELD)
    prompt_lookup.check_branch_fields(c, FIELD)
    static_tree.check_auto(c, config, FIELD, "peagle")
    if not c.path:  # task=train decodes with the drafter it trains (its depth checks the tree)
      if config.get("task") in DECODES_CONFIG_DRAFTER:
        raise ValueError(_NO_PATH)
      return
    target = source.peek(config.target)  # its header: a mismatch shows before the weights load
    if target is not None:
      layouts.check_sizes(c, target.cfg)
    tree = parse_tree(c, layouts.peek_num_depths(c))
    if c.lookup:
      tree = tree.with_branch(c.lookup)
    if c.tree != "auto":  # auto: the grid's trees within the budget
      tree.check_budget(config.drafter.max_depth, config.drafter.max_nodes)

  @classmethod
  def build(cls, c, config, target):
    if not c.path:
      raise ValueError(_NO_PATH)
    cfg, params, _ = layouts.load(c.path, target, c.format)
    d = cls(cfg, parse_tree(c, cfg.num_depths), sampled_candidates(c, FIELD),
            prompt_lookup.branch(c))  # fmt: skip
    d.check_target(target.cfg)
    return d, params

  def check_target(self, target_cfg: ModelConfig) -> None:
    t = self.cfg.target
    if (t.dim, t.vocab_size) != (target_cfg.dim, target_cfg.vocab_size):
      raise ValueError(
        f"this P-EAGLE drafter reads a target of hidden size {t.dim} and a {t.vocab_size}-token "
        f"vocabulary, not {target_cfg.name!r}: train one for this target."
      )
    llama.check_features(target_cfg, self.feature_layers)

  def check_params(self, params) -> None:
    want = {"embed": (self.cfg.target.vocab_size, self.cfg.target.dim)}
    eagle_model.check_shapes(params, want | model.param_shapes(self.cfg), "P-EAGLE")

  # -- decoding --

  def init(self, params, prefill: Prefill):
    """The prompt's pairs (features_i, token_{i+1}) into the cache; the last prompt position's
    pair waits for the first sampled token."""
    b, p = prefill.tokens.shape
    cache = llama.init_cache(self.cfg.eagle.layer, b, prefill.num_slots, llama.param_dtype(params))
    next_BxP = jnp.concatenate([prefill.tokens[:, 1:], prefill.tokens[:, :1]], axis=1)
    positions = jnp.broadcast_to(jnp.arange(p)[None], (b, p))
    k, v = model.pair_kv(params, self.cfg, next_BxP, prefill.features, positions)
    cache = llama.write_kv(cache, llama.NewKV((k,), (v,)), jnp.zeros((b,), jnp.int32))
    last = (prefill.lengths - 1)[:, None, None]
    last_BxnF = indexing.take_along(prefill.features, last, axis=1)[:, 0]
    pending = jnp.zeros((b, self.num_draft + 1, last_BxnF.shape[-1]), last_BxnF.dtype)
    return PEagleState(
      cache=cache.replace(lengths=prefill.lengths - 1),
      pending=pending.at[:, 0].set(last_BxnF),
      count=jnp.ones((b,), jnp.int32),
    )

  def propose(self, params, state: PEagleState, ctx: DraftContext):
    """The pending pairs' keys and values into the cache (projections only), then one forward
    over the block [the newest pair, K - 1 masked rows] at positions L - 1 .. L + K - 2."""
    d = state.pending.shape[1]
    start_B = ctx.lengths - state.count  # the first pending pair's position
    positions = start_B[:, None] + jnp.arange(d)[None]
    tokens = gather_rows(ctx.tokens, positions + 1)
    k, v = model.pair_kv(params, self.cfg, tokens, state.pending, positions)
    cache = llama.write_kv(state.cache, llama.NewKV((k,), (v,)), start_B)
    newest_B = gather_rows(ctx.tokens, ctx.lengths[:, None])[:, 0]
    anchor = indexing.take_along(state.pending, (state.count - 1)[:, None, None], axis=1)[:, 0]
    logits = model.block_logits(params, self.cfg, cache.replace(lengths=ctx.lengths - 1),
                                newest_B, anchor, ctx.lengths - 1)  # fmt: skip
    draft = static_tree.draft(self.tree, logits, self.sampled, ctx, params.get("vocab_ids"),
                              self.cfg.target.vocab_size)  # fmt: skip
    return self._finish(draft, ctx), state.replace(cache=cache.replace(lengths=ctx.lengths))

  def commit(self, state: PEagleState, verdict: Verdict, ctx):
    return state.replace(pending=verdict.features.astype(state.pending.dtype),
                         count=verdict.num_accepted + 1)  # fmt: skip

  # -- price and replay (the family record names these) --

  def step_forwards(self):
    """One block forward (with its pairs' projections), then the target's verify."""
    return (Forward("peagle", self.cfg.num_depths), verify_forward(self))

  def own_sizes(self, params):
    """Parameters a block forward reads (the layer, fuse and its head) and the KV bytes per
    cached pair."""
    layer = llama_sizes(dataclasses.replace(self.cfg.eagle.layer, num_layers=1))
    own = sum(int(np.size(v)) for k, v in jax.tree_util.tree_leaves_with_path(params)
              if "embed" not in jax.tree_util.keystr(k))  # fmt: skip
    return {"peagle": (own, layer[1])}

  def teacher_forced_drafts(self, target, params, x_1xS, roots_R, row_len):
    """At every root r (the newest token x[r]): the block anchored at pair r - 1 whose context
    is the text's pairs before it (what decoding's cache holds there), its tree's top-ranked
    candidates; a lookup branch's guess after them."""
    _, feats = llama.logits_of(target.params, target.cfg, x_1xS, self.feature_layers)
    f = jnp.concatenate(feats, -1)
    logits = model.anchored_logits(params, self.cfg, x_1xS, f, roots_R - 1)
    tokens = static_tree.draft(self.tree, logits, False, None, params.get("vocab_ids")).tokens
    return self.replayed(tokens, target, x_1xS, roots_R, row_len)


def time_block(drafter: PEagle, dparams, target_cfg, context: int, sizes, repeats: int) -> dict:
  """One block forward (batch 1) after ``context`` cached pairs, with its catch-up of a
  verdict's pairs: the family record's timer for ``"peagle"``."""
  del target_cfg
  cfg = drafter.cfg
  d = drafter.num_draft + 1
  state = PEagleState(
    cache=llama.init_cache(cfg.eagle.layer, 1, context + d + cfg.num_depths + 1,
                           llama.param_dtype(dparams)).replace(
      lengths=jnp.asarray([context - d], jnp.int32)),
    pending=jnp.ones((1, d, cfg.feature_width)),
    count=jnp.asarray([d], jnp.int32),
  )  # fmt: skip
  ctx = DraftContext(
    tokens=jnp.ones((1, context + 64), jnp.int32), lengths=jnp.asarray([context], jnp.int32),
    key=jax.random.key(0), sampling=SamplingParams.create(0.0), vocab_size=cfg.target.vocab_size,
  )  # fmt: skip
  fn = jax.jit(functools.partial(_propose_tokens, drafter=drafter))
  seconds = median_seconds(lambda: fn(dparams, state, ctx), repeats)
  return {t: seconds for t in sorted(sizes)}


def _propose_tokens(params, state, ctx, *, drafter):
  return drafter.propose(params, state, ctx)[0].tokens
