"""Test helpers: the exact-distribution check, fakes (a random tree drafter, a recording
drafter) and deliberately broken verifiers.

The broken verifiers exist so the exact-distribution tests can show that they fail on a
wrong algorithm, not only pass on the right one. The enumerated distribution and the
chi-square statistic live in ``specjax/exact.py``; nothing in the library imports this module.
"""

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax import indexing, sampling, trees, verify
from specjax.decode import generate
from specjax.drafters.base import Draft, Drafter, Prefill, TokensOnly, Verdict, WithFeatures
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.exact import chi2_pvalue, sequence_distribution

# --- The exact-distribution check -------------------------------------------------------------

# A correct sampler must give p > P_PASS (fails by chance 1 time in 1000); a wrong one p < P_FAIL.
P_PASS, P_FAIL = 1e-3, 1e-6


def exact_pvalues(
  target,
  drafter: Drafter,
  dparams,
  knobs: dict,
  *,
  prompts: Sequence[Sequence[int]] = ((1, 2, 3),),
  num_new: int = 3,
  rows: int = 4000,
  calls: int = 5,
  stop_ids: Sequence[int] = (),
  verifier=verify.verify,
  mesh=None,
  forward_rows: int = 0,
) -> list[float]:
  """Samples ``rows * calls`` rows through the batched ``generate`` (on ``mesh``, if given; with
  ``forward_rows``, if given), the
  ``prompts`` cycled through each batch (ragged lengths in one batch), and returns one
  chi-square p-value per prompt against the target's enumerated distribution for that prompt."""
  tcfg, tparams = target
  batch = [list(prompts[i % len(prompts)]) for i in range(rows)]
  sampled: list[list] = [[] for _ in prompts]
  for call in range(calls):
    out = generate(
      tparams,
      tcfg,
      batch,
      drafter=drafter,
      drafter_params=dparams,
      max_new_tokens=num_new,
      max_len=max(map(len, prompts)) + num_new + 4,
      seed=call,
      eos_id=list(stop_ids) or None,
      verifier=verifier,
      mesh=mesh,
      forward_rows=forward_rows,
      **knobs,
    )
    for i, row in enumerate(out.tokens):
      sampled[i % len(prompts)].append(row)
  sp = sampling.SamplingParams.create(**knobs)
  return [
    chi2_pvalue(got, sequence_distribution(tparams, tcfg, prompt, num_new, sp, stop_ids))
    for prompt, got in zip(prompts, sampled, strict=True)
  ]


def exact_pvalue(target, drafter, dparams, knobs, verifier=verify.verify, prompt=(1, 2, 3)):
  """``exact_pvalues`` for one prompt, three tokens, 20,000 samples."""
  return exact_pvalues(target, drafter, dparams, knobs, prompts=[prompt], verifier=verifier)[0]


# --- A random tree drafter -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RandomTreeDrafter(TokensOnly):
  """Proposes a tree whose children come from a random q per node.

  Every internal node gets its own random distribution q (through ``sampling.probs``, so top-k
  and top-p apply). ``mode``:

  * ``gumbel``: children drawn from q *without replacement* (Gumbel-top-k), labelled with q:
    what recursive rejection sampling needs (lossless);
  * ``top_one_hot``: q's top tokens in order, as deterministic candidates (``probs=None``):
    lossless too;
  * ``top_soft``: q's top tokens yet labelled with the soft q: a wrong pairing that the
    exact-distribution test must catch.

  With ``alt_tree`` (same node count) every row picks one of the two topologies at random each
  step: a dynamic tree, whose parents are data.
  """

  tree: trees.Tree
  spread: float = 1.0
  mode: str = "gumbel"
  alt_tree: trees.Tree | None = None
  name: str = "random_tree"

  def __post_init__(self):
    if self.alt_tree is not None and self.alt_tree.num_nodes != self.tree.num_nodes:
      raise ValueError("alt_tree must have as many nodes as tree.")
    if self.mode not in ("gumbel", "top_one_hot", "top_soft"):
      raise ValueError(f"mode={self.mode!r} is unknown.")

  @property
  def num_draft(self) -> int:
    return max(self.tree.max_depth, (self.alt_tree or self.tree).max_depth)

  @property
  def num_nodes(self) -> int:
    return self.tree.num_nodes

  @staticmethod
  def _parents_and_rank(tree: trees.Tree) -> np.ndarray:
    parents = np.asarray(tree.parents)
    rank = [int(np.sum(parents[:i] == parents[i])) for i in range(len(parents))]
    return np.stack([parents, np.asarray(rank)])

  def propose(self, params, state, ctx):
    b, v = ctx.tokens.shape[0], ctx.vocab_size
    key_q, key_g, key_t = jax.random.split(ctx.key, 3)
    layout_2xN = jnp.asarray(self._parents_and_rank(self.tree), jnp.int32)
    layout_Bx2xN = jnp.broadcast_to(layout_2xN, (b,) + layout_2xN.shape)
    if self.alt_tree is not None:
      alt_2xN = jnp.asarray(self._parents_and_rank(self.alt_tree), jnp.int32)
      pick_B = jax.random.bernoulli(key_t, 0.5, (b,))
      layout_Bx2xN = jnp.where(pick_B[:, None, None], alt_2xN, layout_Bx2xN)
    parents_BxN, rank_BxN = layout_Bx2xN[:, 0], layout_Bx2xN[:, 1]
    n1 = self.tree.num_nodes + 1
    logits_BxN1xV = self.spread * jax.random.normal(key_q, (b, n1, v))
    q_BxN1xV = sampling.probs(logits_BxN1xV, ctx.sampling)
    score_BxN1xV = jnp.log(q_BxN1xV)
    if self.mode == "gumbel":
      score_BxN1xV += jax.random.gumbel(key_g, (b, n1, v))
    order_BxN1xV = jnp.argsort(-score_BxN1xV, axis=-1)
    order_BxNxV = indexing.take_along(order_BxN1xV, parents_BxN[..., None], axis=1)
    tokens_BxN = indexing.take_along(order_BxNxV, rank_BxN[..., None], axis=2)[..., 0]
    probs = indexing.take_along(q_BxN1xV, parents_BxN[..., None], axis=1)
    draft = Draft(
      tokens=tokens_BxN.astype(jnp.int32),
      probs=None if self.mode == "top_one_hot" else probs,
      parents=parents_BxN,
    )
    return draft, state


# --- A drafter that records the target features it is handed --------------------------------


@dataclasses.dataclass(frozen=True)
class Recording(WithFeatures):
  """Wraps a drafter, asks the target for ``feature_layers``, and records on the host what its
  ``init`` and ``commit`` are handed: ``prefill`` (prompt lengths, features ``[B, P, F]``) and,
  per step, ``steps`` entries ``(length_before[B], length_after[B], n[B], features[B, D+1, F])``.
  Records carry their own lengths, so the order callbacks arrive in does not matter."""

  log: dict = dataclasses.field(default_factory=dict, compare=False, hash=False)

  def _record(self, key, *arrays):
    self.log.setdefault(key, []).append(tuple(None if a is None else np.array(a) for a in arrays))

  def init(self, params, prefill: Prefill):
    jax.debug.callback(self._record, "prefill", prefill.lengths, prefill.features)
    return self.inner.init(params, prefill), jnp.zeros_like(prefill.lengths)

  def propose(self, params, state, ctx):
    draft, inner = self.inner.propose(params, state[0], ctx)
    return draft, (inner, ctx.lengths)

  def commit(self, state, verdict: Verdict, ctx):
    inner, before = state
    jax.debug.callback(
      self._record, "steps", before, ctx.lengths, verdict.num_accepted, verdict.features
    )
    return self.inner.commit(inner, verdict, ctx), before


# --- Deliberately wrong verifiers (each must fail the exact-distribution test) ---------------


def resample_from_target(key, draft, p_BxK1xV, sp):
  """Wrong: on rejection, draws from p instead of the residual norm(max(p - q, 0))."""
  b, k = draft.tokens.shape
  key_accept, key_sample = jax.random.split(key)
  p_x = indexing.take_along(p_BxK1xV[:, :k], draft.tokens[..., None], axis=-1)[..., 0]
  q_x = 1.0
  if draft.probs is not None:
    q_x = indexing.take_along(draft.probs, draft.tokens[..., None], axis=-1)[..., 0]
  n_B = verify.num_accepted(jax.random.uniform(key_accept, (b, k)) * q_x < p_x)
  dist = indexing.take_along(p_BxK1xV, n_B[:, None, None], axis=1)[:, 0]
  return n_B, sampling.sample(key_sample, dist)


def accept_with_target_prob(key, draft, p_BxK1xV, sp):
  """Wrong: accepts x with probability p(x), ignoring q, then resamples from p itself.

  (Accepting with p(x) alone is the one-hot rule, lossless for any proposal drawn
  independently of the verifier when the rejected x is removed from p; keeping x in p is the
  bug.)"""
  return resample_from_target(key, draft.replace(probs=None), p_BxK1xV, sp)


def skip_q_renormalisation(key, draft, p_BxN1xV, sp):
  """Wrong: after a sibling is rejected, keeps using q instead of q without that token."""
  return verify.rejection_sample_tree(key, draft, p_BxN1xV, sp, renormalise=False)


def keep_rejected_candidate(key, draft, p_BxN1xV, sp):
  """Wrong: treats sampled children as deterministic candidates *and* keeps a rejected one in
  p' (accept x with p'(x), else try the next sibling against the same p')."""
  return verify.rejection_sample_tree(
    key, draft.replace(probs=None), p_BxN1xV, sp, remove_rejected=False
  )


def children_as_deterministic(key, draft, p_BxN1xV, sp):
  """Treats sampled children as deterministic candidates (one-hot q, the rejected one removed
  from p'): lossless, since each child is drawn without looking at the target; it only accepts
  less often than verifying with the children's q."""
  return verify.verify(key, draft.replace(probs=None), p_BxN1xV, sp)


def medusa_drafter(
  target_cfg, tree, num_heads: int, vocab_ids=None, sampled: bool = True, seed: int = 0,
  scale: float = 1.0, lookup: int = 0,
):  # fmt: skip
  """A Medusa drafter with random heads (their own random projections) over ``target_cfg``
  (``vocab_ids``: a reduced draft vocabulary; ``lookup``: a lookup branch of that many tokens),
  and its params."""
  from specjax.drafters import medusa

  v = target_cfg.vocab_size
  ids = jnp.arange(v, dtype=jnp.int32) if vocab_ids is None else jnp.asarray(vocab_ids, jnp.int32)
  heads = medusa.HeadsConfig(target_cfg.dim, num_heads, len(ids), v, own_proj=True)
  params = medusa.random_heads(heads, jax.random.key(seed), scale) | {"vocab_ids": ids}
  branch = PromptLookup(lookup, abstain=False) if lookup else None
  return medusa.Medusa(heads, tree, sampled, branch), params


def eagle_drafter(
  target, top_k=2, depth=2, total=3, vocab_ids=None, sampled=True, seed=0, features=("final",),
  lookup=0, architecture="specjax",
):  # fmt: skip
  """An EAGLE drafter with a random layer over the ``target`` (cfg, params) pair and its params
  (``vocab_ids``: a reduced draft vocabulary; ``lookup``: a lookup branch of that many tokens,
  from 1-gram matches; ``architecture``: specjax's, or the published EAGLE-1 / EAGLE-3's)."""
  from specjax.drafters import eagle

  tcfg, tparams = target
  ids = np.arange(tcfg.vocab_size) if vocab_ids is None else np.asarray(vocab_ids)
  size = 0 if vocab_ids is None else len(ids)
  cfg = eagle.EagleConfig(tcfg, tuple(features), size, architecture=architecture)
  params = eagle.init_params(cfg, jax.random.key(seed), tparams, ids)
  branch = PromptLookup(lookup, abstain=False) if lookup else None
  return eagle.Eagle(cfg, top_k, depth, total, sampled, branch), params


def rerank_by_own_q(drafter, params):
  """Wrong (the reference EAGLE-2 rerank with sampled children verified by their q): each
  sampled child scores with q of the token it drew, so which children are kept depends on the
  draws themselves and the kept ones are no longer samples of q."""
  from specjax.drafters import eagle

  @dataclasses.dataclass(frozen=True)
  class OwnScore(eagle.Eagle):
    def _children(self, logits_BxMxW, key, sp):
      tok, score, q = super()._children(logits_BxMxW, key, sp)
      own = jnp.log(indexing.take_along(q, tok, axis=-1))
      return tok, jnp.where(sampling.is_greedy(sp), score, own), q

  d = drafter
  return OwnScore(d.cfg, d.top_k, d.depth, d.total, d.sampled, d.lookup), params


def lookup_first(drafter, params):
  """Wrong: a sampled tree (EAGLE's or Medusa's) with its lookup branch moved in front of the
  sampled children. The verifier removes a rejected child's token from the next siblings' q,
  which is right for children drawn without replacement from that q, but the lookup guess was
  not drawn from it: after a rejected guess the children are verified against a q they were not
  drawn from."""

  @dataclasses.dataclass(frozen=True)
  class LookupFirst(type(drafter)):
    def _with_lookup(self, draft, ctx):
      d = super()._with_lookup(draft, ctx)
      k = self.lookup.num_draft
      n = d.tokens.shape[1] - k
      order = np.concatenate([n + np.arange(k), np.arange(n)])  # new node i <- old order[i]
      new_id = np.zeros(n + k + 1, np.int32)
      new_id[order + 1] = np.arange(1, n + k + 1)
      parents = jnp.asarray(new_id)[d.parents[:, order]]
      probs = None if d.probs is None else d.probs[:, order]
      return Draft(tokens=d.tokens[:, order], probs=probs, parents=parents)

  fields = {f.name: getattr(drafter, f.name) for f in dataclasses.fields(drafter)}
  return LookupFirst(**fields), params


def unconditioned_q(drafter, params):
  """Wrong: a DSpark tree whose children are drawn under their parent's token (the Markov
  bias), handed to the verifier with the q of the unbiased depth distribution: the tokens are
  not drawn from the q they are verified with."""
  from specjax.drafters import static_tree
  from specjax.drafters.dflash import model as dflash_model

  @dataclasses.dataclass(frozen=True)
  class UnconditionedQ(type(drafter)):
    def _draft(self, params, h_BxKxF, newest_B, sampled, ctx):
      drawn = super()._draft(params, h_BxKxF, newest_B, sampled, ctx)
      if drawn.probs is None:
        return drawn
      logits = dflash_model.head(params, h_BxKxF[:, self.cfg.first_slot :])
      told = static_tree.draft(self.tree, logits, True, ctx, params.get("vocab_ids"),
                               self.cfg.target.vocab_size)  # fmt: skip
      return drawn.replace(probs=told.probs)

  fields = {f.name: getattr(drafter, f.name) for f in dataclasses.fields(drafter)}
  return UnconditionedQ(**fields), params


def dflash_drafter(
  target, tree, block_size: int = 3, sampled: bool = True, seed: int = 0, lookup: int = 0,
  feature_layers: tuple = (0,), vocab_ids=None, markov_rank: int = 0,
  markov_head: str = "vanilla", sample_from_anchor: bool = False,
):  # fmt: skip
  """A DFlash drafter with random weights over ``target`` ((cfg, params)), drafting ``tree``
  from blocks of ``block_size`` (``vocab_ids``: a reduced draft vocabulary), and its params
  (the target's embedding and head rows included). ``markov_rank`` > 0: DSpark's Markov head
  of that rank and kind, its W2 random (trained heads start at zero) so that a node's token
  moves its children's distribution."""
  from specjax.drafters import dflash

  cfg, params = target
  v = 0 if vocab_ids is None else len(vocab_ids)
  dcfg = dflash.DFlashConfig(cfg, feature_layers, num_layers=1, block_size=block_size,
                             vocab_size=v, sample_from_anchor=sample_from_anchor,
                             markov_rank=markov_rank, markov_head=markov_head)  # fmt: skip
  dparams = dflash.model.init_params(dcfg, jax.random.key(seed))
  if markov_rank:
    shape = dparams["markov_w2"].shape
    dparams["markov_w1"] = jax.random.normal(jax.random.key(seed + 1), dparams["markov_w1"].shape)
    dparams["markov_w2"] = jax.random.normal(jax.random.key(seed + 2), shape) / np.sqrt(shape[1])
  if vocab_ids is not None:
    dparams["vocab_ids"] = jnp.asarray(vocab_ids, jnp.int32)
  branch = PromptLookup(lookup, abstain=False) if lookup else None
  drafter = dflash.DFlash(dcfg, tree, sampled, branch)
  return drafter, dflash.model.decode_params(dparams, params, cfg)


def peagle_drafter(
  target, tree, num_depths: int = 3, sampled: bool = True, seed: int = 0, lookup: int = 0,
  feature_layers: tuple = (0, 1), vocab_ids=None, mask_id: int = 0,
):  # fmt: skip
  """A P-EAGLE drafter with random weights over ``target`` ((cfg, params)), drafting ``tree``
  from blocks of ``num_depths`` rows (``vocab_ids``: a reduced draft vocabulary), and its
  params (the target's embedding included)."""
  from specjax.drafters import eagle, peagle

  cfg, params = target
  ids = np.arange(cfg.vocab_size) if vocab_ids is None else np.asarray(vocab_ids)
  size = 0 if vocab_ids is None else len(ids)
  ecfg = eagle.EagleConfig(cfg, tuple(feature_layers), size, architecture="eagle3")
  pcfg = peagle.PEagleConfig(ecfg, num_depths, mask_id)
  branch = PromptLookup(lookup, abstain=False) if lookup else None
  dparams = peagle.model.init_params(pcfg, jax.random.key(seed), params, ids)
  return peagle.PEagle(pcfg, tree, sampled, branch), dparams
