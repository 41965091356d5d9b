"""DFlash's drafter: a whole block drafted in one forward, verified as a chain or a static tree;
state, config section and build. The model is ``model.py``."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import struct

from specjax.drafters import prompt_lookup, static_tree
from specjax.drafters.base import (
  DraftContext,
  DrafterBase,
  Forward,
  Prefill,
  Verdict,
  llama_sizes,
  sampled_candidates,
  verify_forward,
)
from specjax.drafters.dflash import layouts, model
from specjax.drafters.dflash.model import FIELD, DFlashConfig
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.drafters.timing import median_seconds
from specjax.models import llama, source
from specjax.models.cache import KVCache, gather_rows
from specjax.models.config import ModelConfig
from specjax.sampling import SamplingParams
from specjax.trees import Tree


@struct.dataclass
class DFlashState:
  """The context's K/V per draft layer (target features of committed positions, fused); the
  last verdict's features (the root's and the accepted nodes', ``pending``), written into the
  context from slot ``anchor`` (where that step's newest token sat) as the next block begins."""

  cache: KVCache
  pending: jax.Array  # [B, D + 1, nF]
  anchor: jax.Array  # [B] int32


def parse_tree(c: ml_collections.ConfigDict, num_draft: int, field: str = FIELD) -> Tree:
  """The tree of ``config.drafter.dflash`` over a block drafting ``num_draft`` positions."""
  return static_tree.parse(c, num_draft, field, "a larger block_size")


@dataclasses.dataclass(frozen=True)
class DFlash(static_tree.OnStaticTree, DrafterBase):
  """A DFlash block drafter: each step one forward over [newest token, mask x (B - 1)] gives a
  distribution for each of the B - 1 positions after the newest token; ``tree`` (depth at most
  B - 1) takes each depth's ranked candidates (a chain: the top or sampled token per depth)."""

  cfg: DFlashConfig
  tree: Tree
  sampled: bool | None = False  # None: candidates "auto", set per run (base.at_temperature)
  lookup: PromptLookup | None = None  # a chain of prompt-lookup guesses, the root's last child
  name: str = "dflash"

  def __post_init__(self):
    if self.tree.num_nodes == 0 or self.tree.max_depth > self.cfg.num_draft:
      raise ValueError(
        f"{FIELD}: the tree needs 1 to {self.cfg.num_draft} levels (the block's drafted "
        f"positions), got "
        f"{self.tree.max_depth}."
      )
    prompt_lookup.check_branch(self.lookup, FIELD)

  @property
  def feature_layers(self) -> tuple:
    return self.cfg.feature_layers

  @staticmethod
  def config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.path = ""  # a drafter saved by specjax or speculators' dflash layout; "" = random weights
    c.format = "auto"  # auto | specjax | speculators
    # Random weights' shape (path = ""): B, and the next three; with a path, the saved drafter's
    # own (each left as it is here, or equal to the saved one)
    c.block_size = 8
    c.num_layers = 1
    c.feature_layers = (0,)  # target layers fused (specjax indices: after that layer)
    c.mask_id = 0  # the token at masked positions
    static_tree.add_fields(c, chain=True)
    return c

  @classmethod
  def check(cls, c, config):
    sampled_candidates(c, FIELD)
    prompt_lookup.check_branch_fields(c, FIELD)
    num_draft = layouts.peek_num_draft(c)
    target = source.peek(config.target)  # its header: a mismatch shows before the weights load
    if c.path:
      layouts.check_shape(c, cls.config())
    if c.path and target is not None:
      layouts.check_sizes(c, target.cfg)
    tree = parse_tree(c, num_draft)
    static_tree.check_auto(c, config, FIELD, "dflash")
    if c.lookup:
      tree = tree.with_branch(c.lookup)
    if c.tree != "auto":  # auto: the grid's trees within the budget
      tree.check_budget(config.drafter.max_depth, config.drafter.max_nodes)

  @classmethod
  def build(cls, c, config, target):
    cfg, params = layouts.load_or_init(c, target)
    d = cls(cfg, parse_tree(c, cfg.num_draft), sampled_candidates(c, FIELD),
            prompt_lookup.branch(c))  # fmt: skip
    d.check_target(target.cfg)
    return d, params

  def check_target(self, target_cfg: ModelConfig) -> None:
    t = self.cfg.target
    if (t.dim, t.vocab_size, t.num_layers) != (target_cfg.dim, target_cfg.vocab_size,
                                               target_cfg.num_layers):  # fmt: skip
      raise ValueError(
        f"this DFlash drafter reads a target of hidden size {t.dim}, {t.num_layers} layers and "
        f"a {t.vocab_size}-token vocabulary, not {target_cfg.name!r}: train one for this target."
      )

  def check_params(self, params) -> None:
    want = model.param_shapes(self.cfg)
    got = params if isinstance(params, dict) else {}
    for name in ("fc", "hidden_norm", "norm", *model.head_shapes(self.cfg)):
      if tuple(np.shape(got.get(name))) != want[name]:
        raise ValueError(f"DFlash drafter_params[{name!r}] is not {want[name]}.")
    if len(got.get("layers", ())) != self.cfg.num_layers or "embed" not in got:
      raise ValueError(
        f"DFlash drafter_params need {self.cfg.num_layers} layers and the target's embed and head."
      )
    rows = self.cfg.vocab_size or self.cfg.target.vocab_size
    if np.shape(got.get("head"))[:1] != (rows,) or (self.cfg.vocab_size and "vocab_ids" not in got):
      raise ValueError(f"DFlash drafter_params need a head of {rows} rows (and their vocab_ids).")

  # -- decoding --

  def init(self, params, prefill: Prefill):
    """The prompt's features as the context; nothing pending (zeros at the newest token's slot
    and after: past the committed length, never read before they are overwritten)."""
    b, p = prefill.tokens.shape
    cache = llama.init_cache(self.cfg.layer, b, prefill.num_slots, llama.param_dtype(params))
    positions = jnp.broadcast_to(jnp.arange(p)[None], (b, p))
    cache = model.write_context(cache, params, self.cfg, prefill.features, positions,
                                jnp.zeros((b,), jnp.int32))  # fmt: skip
    pending = jnp.zeros((b, self.num_draft + 1, prefill.features.shape[-1]), cache.k[0].dtype)
    return DFlashState(cache=cache, pending=pending, anchor=prefill.lengths.astype(jnp.int32))

  def propose(self, params, state: DFlashState, ctx: DraftContext):
    """Catch up (the last verdict's features join the context), then one forward over the
    block [newest token, mask x (B - 1)] at positions L .. L + B - 1."""
    d = state.pending.shape[1]
    positions = state.anchor[:, None] + jnp.arange(d)[None]
    cache = model.write_context(state.cache, params, self.cfg, state.pending, positions,
                                state.anchor)  # fmt: skip
    newest_B = gather_rows(ctx.tokens, ctx.lengths[:, None])[:, 0]
    block = ctx.lengths[:, None] + jnp.arange(self.cfg.block_size)[None]
    h = model.block_hidden(params, self.cfg, cache.replace(lengths=ctx.lengths),
                           model.block_tokens(self.cfg, newest_B), block)  # fmt: skip
    draft = self._draft(params, h, newest_B, self.sampled, ctx)
    return self._finish(draft, ctx), state.replace(cache=cache, anchor=ctx.lengths)

  def _draft(self, params, h_BxKxF, newest_B, sampled, ctx):
    """The tree from a block's hidden states: each depth's logits (the head on its position),
    and with a Markov head, biased under each node by the node's token (a draw per level)."""
    cfg = self.cfg
    h_BxDxF = h_BxKxF[:, cfg.first_slot :]
    logits_BxDxW = model.head(params, h_BxDxF)
    ids, v = params.get("vocab_ids"), cfg.target.vocab_size
    if not cfg.markov_rank:
      return static_tree.draft(self.tree, logits_BxDxW, sampled, ctx, ids, v)

    def children(level, tokens_BxI, state_BxIxR):
      h_BxIxF = jnp.broadcast_to(h_BxDxF[:, level, None], (*tokens_BxI.shape, h_BxDxF.shape[-1]))
      bias, _, state = model.markov_step(params, cfg, tokens_BxI, h_BxIxF, state_BxIxR)
      return logits_BxDxW[:, level, None] + bias, state

    state = model.markov_state(cfg, newest_B.shape)
    return static_tree.draft_by_parent(self.tree, children, newest_B, state, sampled, ctx, ids, v)

  def commit(self, state: DFlashState, verdict: Verdict, ctx):
    """The target's features of the root and the accepted nodes, for the next block (slots
    past the accepted path are written too, and stay unread: a block sees the slots below the
    committed length only)."""
    return state.replace(pending=verdict.features.astype(state.pending.dtype))

  # -- price and replay (the family record names these) --

  def step_forwards(self):
    """One block forward (its context catch-up included), then the target's verify."""
    return (Forward("dflash", self.cfg.block_size), verify_forward(self))

  def own_sizes(self, params):
    """Parameters a block forward reads (its layers, fuse and the target's head) and the KV
    bytes per context token."""
    own = sum(int(np.size(v)) for k, v in jax.tree_util.tree_leaves_with_path(params)
              if "embed" not in jax.tree_util.keystr(k))  # fmt: skip
    return {"dflash": (own, llama_sizes(self.cfg.layer)[1])}

  def teacher_forced_drafts(self, target, params, x_1xS, roots_R, row_len):
    """At every root r: a block anchored at ``x[r]`` whose context is the text's features
    before r (what decoding's context holds there), its tree's top-ranked candidates; a lookup
    branch's guess after them."""
    _, feats = llama.logits_of(target.params, target.cfg, x_1xS, self.cfg.feature_layers)
    h = model.anchored_hidden(params, self.cfg, x_1xS, jnp.concatenate(feats, -1), roots_R)
    tokens = self._draft(params, h, x_1xS[0, roots_R], False, None).tokens
    return self.replayed(tokens, target, x_1xS, roots_R, row_len)


def time_block(drafter: DFlash, dparams, target_cfg, context: int, sizes, repeats: int) -> dict:
  """One block forward (batch 1) after ``context`` cached context tokens, with its catch-up
  of a verdict's features: the family record's timer for ``"dflash"``."""
  del target_cfg
  cfg = drafter.cfg
  state = DFlashState(
    cache=llama.init_cache(cfg.layer, 1, context + 2 * cfg.block_size + drafter.num_draft + 1,
                           llama.param_dtype(dparams)),
    pending=jnp.ones((1, drafter.num_draft + 1, cfg.target.dim * len(cfg.feature_layers))),
    anchor=jnp.asarray([context], jnp.int32),
  )  # fmt: skip
  ctx = DraftContext(
    tokens=jnp.ones((1, context + 64), jnp.int32), lengths=jnp.asarray([context + 1], jnp.int32),
    key=jax.random.key(0), sampling=SamplingParams.create(0.0), vocab_size=cfg.target.vocab_size,
  )  # fmt: skip
  fn = jax.jit(functools.partial(_propose_tokens, drafter=drafter))
  seconds = median_seconds(lambda: fn(dparams, state, ctx), repeats)
  return {t: seconds for t in sorted(sizes)}


def _propose_tokens(params, state, ctx, *, drafter):
  return drafter.propose(params, state, ctx)[0].tokens
