"""The τ simulator: greedy acceptance from teacher-forced passes, no speculative decoding.

At temperature 0 a step accepts the longest path of the draft tree whose every token equals
the target's greedy choice. Given the target's own greedy text (``x``: prompt + continuation),
a drafter's proposal at every root r (the newest committed token, ``x[r]``) can be computed
from ``x[:r + 1]`` alone, in one batched teacher-forced pass, because along an accepted path
the context the drafter sees *is* the text:

- draft model: node n's token is the draft's argmax after ``x[:r + n]`` (one draft forward
  over the whole text gives every root's chain at once);
- Medusa: head d's rank-c candidate from the target's final feature at ``r - 1``;
- EAGLE chains: the drafter's rollout on its own features from pair ``r - 1`` (the training-
  time test's forward, whose step j is exactly what decoding computes for depth j);
- EAGLE-2 dynamic trees: the drafter's own ``propose``, one row per root, over a draft cache
  of the text's pairs (the teacher-forced features) cut at the root: what decoding's cache holds
  there, with its lookup branch if it has one (lookup reads the text up to the root). The
  tree's shape depends on draft scores off the accepted path, but only the drafter's, never
  the target's, so it too is a function of the text;
- stateless drafters (prompt lookup): ``propose`` itself, once per root.

``offline_drafts`` returns those proposals with each root's tree (``parents``: the same for
every root of a static tree); ``hits`` compares them with the text; ``accepted_lengths`` walks
the trees; ``walk`` replays decoding: after the prefill's token, each step moves past its
accepted drafts and the target's token, so the number of target calls, and τ, are what batch-1
greedy decoding of the same prompts does (up to ties in floating point; a root where the
drafter abstains is a one-token step). ``replay`` does all of it for some rows,
``tau_by_chain_length`` gives τ for every chain length at once and ``tau_by_budget`` for
EAGLE-2 at every tree budget.
"""

import dataclasses
import functools
import types
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax import decode, sampling, trees
from specjax.drafters import draft_model, eagle, medusa, prompt_lookup
from specjax.drafters.base import DraftContext, Prefill
from specjax.models import llama
from specjax.models.cache import KVCache
from specjax.trees import Tree


def _eagle_is_chain(drafter) -> bool:
  return drafter.top_k == 1 and drafter.total == drafter.depth and drafter.lookup is None


def node_tree(drafter) -> Tree | None:
  """The static tree a drafter verifies (a chain unless it says otherwise); None for EAGLE-2's
  dynamic trees (one per step)."""
  if isinstance(drafter, medusa.Medusa):
    return drafter.nodes
  if isinstance(drafter, eagle.Eagle):
    return Tree.chain(drafter.depth) if _eagle_is_chain(drafter) else None
  return getattr(drafter, "tree", None) or Tree.chain(drafter.num_draft)


def check_supported(drafter) -> None:
  """One clear error for a drafter the simulator cannot replay offline."""
  if getattr(drafter, "num_extra", 0) or drafter.name not in (
    "prompt_lookup", "draft_model", "medusa", "eagle",
  ):  # fmt: skip
    raise ValueError(
      f"drafter.name={drafter.name!r}: offline acceptance is simulated for prompt_lookup, "
      "draft_model, medusa and eagle."
    )


ABSTAINED = -1  # the token of every node at a root where the drafter abstained


def offline_drafts(
  target, drafter, dparams, row: Sequence[int], first_root: int
) -> tuple[np.ndarray, np.ndarray]:
  """``([R, N] tokens, [R, N] parents)``: the tree ``drafter`` proposes at each root
  ``first_root .. len(row) - 2`` given the text ``row`` (greedy candidates: each node's
  top-ranked choice; ``ABSTAINED`` at every node where the drafter abstains).

  The text is padded to a power-of-two length and the roots to a power-of-two count, so one
  compiled program serves every row of a bucket: the models are causal and every drafter reads
  the text only up to its root, so the padding changes no proposal."""
  check_supported(drafter)
  roots = np.arange(first_root, len(row) - 1)
  tree = node_tree(drafter)
  if not len(roots):  # a text with at most one new token: no step to replay
    n = drafter.num_nodes if tree is None else tree.num_nodes
    return np.zeros((0, n), np.int32), np.zeros((0, n), np.int32)
  x = np.zeros((1, decode.bucket(len(row))), np.int32)
  x[0, : len(row)] = row
  padded = np.full(decode.bucket(len(roots), 1), roots[-1])
  padded[: len(roots)] = roots
  tokens, parents, abstain = _drafts(
    target.params, dparams, jnp.asarray(x), jnp.asarray(padded, jnp.int32),
    jnp.asarray(len(row), jnp.int32), cfg=target.cfg, drafter=drafter,
  )  # fmt: skip
  tokens, abstain = np.asarray(tokens)[: len(roots)], np.asarray(abstain)[: len(roots)]
  tokens = np.where(abstain[:, None], ABSTAINED, tokens)
  if tree is None:  # EAGLE-2: a tree of its own at every root
    return tokens, np.asarray(parents)[: len(roots)]
  return tokens, np.broadcast_to(np.asarray(tree.parents), tokens.shape)


@functools.partial(jax.jit, static_argnames=("cfg", "drafter"))
def _drafts(tparams, dparams, x_1xS, roots_R, row_len, *, cfg, drafter):
  """``(tokens [R, N], parents [R, N] or None, abstain [R])`` at every root, in one program."""
  target = types.SimpleNamespace(cfg=cfg, params=tparams)
  no_abstain = jnp.zeros(roots_R.shape, bool)
  tree = node_tree(drafter)
  if tree is None:
    return (*_eagle_tree(target, drafter, dparams, x_1xS, roots_R), no_abstain)
  depth_N = np.asarray(tree.depth[1:])
  if isinstance(drafter, draft_model.DraftModel):
    logits, _ = llama.logits_of(dparams, drafter.cfg, x_1xS)
    argmax_S = jnp.argmax(logits[0], -1)
    return (
      argmax_S[jnp.minimum(roots_R[:, None] + depth_N[None] - 1, row_len - 1)],
      None,
      no_abstain,
    )
  if isinstance(drafter, medusa.Medusa):
    _, (f,) = llama.logits_of(tparams, cfg, x_1xS, (llama.FINAL,))
    heads = drafter.tree  # the heads' nodes (the lookup branch, if any, comes after them)
    head_N, rank_N = np.asarray(heads.depth[1:]) - 1, np.asarray(medusa._ranks(heads))
    logits_RxHxW = medusa.head_logits(dparams, f[0][roots_R - 1])
    _, top = jax.lax.top_k(logits_RxHxW, int(rank_N.max()) + 1)
    tokens = dparams["vocab_ids"][top[:, head_N, rank_N]]
    if drafter.lookup is not None:  # its guess at every root, after the heads' nodes
      guess, _, _ = _stateless(drafter.lookup, None, x_1xS, roots_R, cfg.vocab_size)
      tokens = jnp.concatenate([tokens, guess], axis=1)
    return tokens, None, no_abstain
  if isinstance(drafter, eagle.Eagle):
    return _eagle_chain(target, drafter, dparams, x_1xS, roots_R), None, no_abstain
  return _stateless(drafter, dparams, x_1xS, roots_R, cfg.vocab_size)


def _eagle_chain(target, drafter, p, x_1xS, roots_R) -> jax.Array:
  """Depth j of the chain rooted at r: rollout step j from pair r - 1 (see the objective)."""
  s = x_1xS.shape[1]
  _, feats = llama.logits_of(target.params, target.cfg, x_1xS, drafter.feature_layers)
  f_in = jnp.concatenate(feats, axis=-1)[:, :-1]
  t = s - 1
  positions = jnp.arange(t)[None]
  shift = lambda a, j: jnp.pad(a[:, j : j + t], [(0, 0), (0, t - a[:, j : j + t].shape[1])])  # noqa: E731
  x = eagle.inputs(p, drafter.cfg, x_1xS[:, 1:], eagle.fuse(p, f_in))
  attn = llama.attention_inputs(jnp.zeros((1,), jnp.int32), llama.causal_mask(t), 0, 0, False)
  out, k1, v1 = eagle.layer(p, drafter.cfg, x, positions, None, None, attn)
  picks, rolled = [], []
  for j in range(1, drafter.depth + 1):
    if j > 1:
      x = eagle.inputs(p, drafter.cfg, shift(x_1xS, j), out)
      out, k, v = eagle.rollout_layer(p, drafter.cfg, x, positions + j - 1, (k1, v1), rolled)
      rolled.append((k, v))
    picks.append(p["vocab_ids"][jnp.argmax(eagle.logits(p, out)[0], -1)])
  return jnp.stack(picks, -1)[roots_R - 1]


def _eagle_tree(target, drafter, p, x_1xS, roots_R) -> tuple[jax.Array, jax.Array]:
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
  state = eagle.EagleState(
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


def _stateless(drafter, dparams, x_1xS, roots_R, vocab_size: int):
  """``propose`` at every root at once: the text repeated, one row per root."""
  r = roots_R.shape[0]
  ctx = DraftContext(
    tokens=jnp.tile(x_1xS, (r, 1)),
    lengths=roots_R,
    key=jax.random.key(0),
    sampling=sampling.SamplingParams.create(temperature=0.0),
    vocab_size=vocab_size,
  )
  draft, _ = drafter.propose(dparams, None, ctx)
  abstain = jnp.zeros((r,), bool) if draft.abstain is None else draft.abstain
  return draft.tokens, None, abstain


def node_depths(parents_RxN: np.ndarray) -> np.ndarray:
  """``[R, N + 1]`` each node's depth (the root's 0) in every row's tree."""
  return np.asarray(trees.depths(trees.ancestors(jnp.asarray(parents_RxN, jnp.int32))))


def hits(
  drafts_RxN: np.ndarray, parents_RxN: np.ndarray, row: Sequence[int], first_root: int
) -> np.ndarray:
  """``[R, N]`` whether node n at root r proposes the text's token at ``r + depth(n)``."""
  text = np.asarray(row)
  roots = np.arange(first_root, first_root + len(drafts_RxN))
  at = roots[:, None] + node_depths(parents_RxN)[:, 1:]
  inside = at < len(text)
  return inside & (drafts_RxN == text[np.minimum(at, len(text) - 1)])


def accepted_lengths(hits_RxN: np.ndarray, parents_RxN: np.ndarray) -> np.ndarray:
  """``[R]`` the depth of the deepest node whose whole path hits (0: nothing accepted)."""
  r, n = hits_RxN.shape
  rows = np.arange(r)
  ok = np.ones((r, n + 1), bool)  # node 0, the root, is always in
  depth = node_depths(parents_RxN)
  best = np.zeros(r, int)
  for i in range(1, n + 1):  # parents come before children
    ok[:, i] = ok[rows, parents_RxN[:, i - 1]] & hits_RxN[:, i - 1]
    best = np.where(ok[:, i], np.maximum(best, depth[:, i]), best)
  return best


def walk(accepted_R: np.ndarray, new_tokens: int, abstained_R=None) -> tuple[int, int]:
  """``(target calls, calls where the drafter abstained)`` greedy decoding makes for
  ``new_tokens`` tokens. The prefill is one call and emits the first token; ``accepted_R[i]`` is
  the acceptance at root ``prompt length + i`` (the first root is that token), and each later
  call emits its accepted drafts plus one token."""
  pos, calls, abstained = 1, 1, 0
  while pos < new_tokens:
    abstained += bool(abstained_R is not None and abstained_R[pos - 1])
    pos += int(accepted_R[pos - 1]) + 1
    calls += 1
  return calls, abstained


def acceptance_by_depth(accepted_R: np.ndarray, depth: int) -> list[float]:
  """P(depth d accepted | depth d - 1 accepted) over every root: the chain's n-α."""
  out = []
  for d in range(1, depth + 1):
    reached = np.sum(accepted_R >= d - 1)
    out.append(float(np.sum(accepted_R >= d) / reached) if reached else 0.0)
  return out


def with_chain_length(drafter, k: int):
  """The same chain drafter drafting ``k`` tokens per step."""
  if isinstance(drafter, eagle.Eagle):
    return dataclasses.replace(drafter, depth=k, total=k)
  return dataclasses.replace(drafter, num_draft=k)


def is_chain(drafter) -> bool:
  tree = node_tree(drafter)
  return (
    tree is not None
    and tree.is_chain
    and isinstance(drafter, (draft_model.DraftModel, eagle.Eagle, prompt_lookup.PromptLookup))
  )


@dataclasses.dataclass(frozen=True)
class Replay:
  """What greedy decoding of some rows does, replayed: tokens, target calls, and the calls
  where the drafter abstained (one-token forwards, priced as AR steps)."""

  tokens: int
  calls: int
  abstained: int = 0

  @property
  def tau(self) -> float:
    return self.tokens / self.calls


def replay(target, drafter, dparams, rows, chain_length: int | None = None) -> Replay:
  """Replays greedy decoding of ``rows`` (``(prompt ids, the target's greedy new ids)``);
  ``chain_length``: as if a chain drafter stopped after that many tokens."""
  tokens, calls, abstained = 0, 0, 0
  for prompt, new in rows:
    text = list(prompt) + list(new)
    drafts, parents = offline_drafts(target, drafter, dparams, text, len(prompt))
    acc = accepted_lengths(hits(drafts, parents, text, len(prompt)), parents)
    if chain_length is not None:
      acc = np.minimum(acc, chain_length)
    c, a = walk(acc, len(new), (drafts == ABSTAINED).all(axis=1))
    tokens, calls, abstained = tokens + len(new), calls + c, abstained + a
  return Replay(tokens, calls, abstained)


def tau_by_chain_length(target, drafter, dparams, rows, k_max: int) -> dict[int, float]:
  """``{K: τ}`` for K = 1..k_max from one offline pass of the k_max-long chain: a K-chain
  accepts min(a, K) where the longest accepts a (its proposals' first K tokens are the
  K-chain's, abstentions included)."""
  longest = with_chain_length(drafter, k_max)
  tokens, calls = 0, np.zeros(k_max + 1, int)
  for prompt, new in rows:
    text = list(prompt) + list(new)
    drafts, parents = offline_drafts(target, longest, dparams, text, len(prompt))
    acc = accepted_lengths(hits(drafts, parents, text, len(prompt)), parents)
    tokens += len(new)
    for k in range(1, k_max + 1):
      calls[k] += walk(np.minimum(acc, k), len(new))[0]
  return {k: tokens / calls[k] for k in range(1, k_max + 1)}


def tau_by_budget(target, drafter, dparams, rows, budgets) -> list[dict]:
  """``[{top_k, depth, total, tau}]``: EAGLE-2 with the same weights at every tree budget
  ``(top_k, depth, total)`` in ``budgets``, each replayed over ``rows``."""
  out = []
  for top_k, depth, total in budgets:
    d = dataclasses.replace(drafter, top_k=top_k, depth=depth, total=total)
    tau = replay(target, d, dparams, rows).tau
    out.append({"top_k": top_k, "depth": depth, "total": total, "tau": tau})
  return out
