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
- stateless drafters (prompt lookup): ``propose`` itself, once per root.

``offline_drafts`` returns those proposals; ``hits`` compares them with the text;
``accepted_lengths`` walks the tree; ``walk`` replays decoding: after the prefill's token, each
step moves past its accepted drafts and the target's token, so the number of target calls, and τ,
are what batch-1 greedy decoding of the same prompts does (up to ties in floating point; a root
where the drafter abstains is a one-token step). ``replay`` does all of it for some rows and
``tau_by_chain_length`` gives τ for every chain length at once. EAGLE-2's dynamic trees are not
simulated (their shape depends on the draft's scores off the accepted path).
"""

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax import sampling
from specjax.drafters import draft_model, eagle, medusa, prompt_lookup
from specjax.drafters.base import DraftContext
from specjax.models import llama
from specjax.trees import Tree


def node_tree(drafter) -> Tree:
  """The static tree a drafter verifies (a chain unless it says otherwise)."""
  if isinstance(drafter, medusa.Medusa):
    return drafter.tree
  if isinstance(drafter, eagle.Eagle):
    return Tree.chain(drafter.depth)
  return getattr(drafter, "tree", None) or Tree.chain(drafter.num_draft)


def check_supported(drafter) -> None:
  """One clear error for a drafter the simulator cannot replay offline."""
  if isinstance(drafter, eagle.Eagle) and not (
    drafter.top_k == 1 and drafter.total == drafter.depth
  ):
    raise ValueError(
      f"drafter.eagle top_k={drafter.top_k}, total={drafter.total}: EAGLE-2 dynamic trees are "
      "not simulated offline (their shape depends on draft scores off the accepted path); "
      "simulate the chain (top_k = 1, total = depth)."
    )
  if getattr(drafter, "num_extra", 0) or drafter.name not in (
    "prompt_lookup", "draft_model", "medusa", "eagle",
  ):  # fmt: skip
    raise ValueError(
      f"drafter.name={drafter.name!r}: offline acceptance is simulated for prompt_lookup, "
      "draft_model, medusa and eagle chains."
    )


ABSTAINED = -1  # the token of every node at a root where the drafter abstained


def offline_drafts(target, drafter, dparams, row: Sequence[int], first_root: int) -> np.ndarray:
  """``[R, N]`` the tokens ``drafter`` proposes at roots ``first_root .. len(row) - 2`` given
  the text ``row`` (greedy candidates: each node's top-ranked choice; ``ABSTAINED`` at every
  node where the drafter abstains)."""
  check_supported(drafter)
  x = jnp.asarray(row, jnp.int32)[None]
  roots = np.arange(first_root, len(row) - 1)
  tree = node_tree(drafter)
  depth_N = np.asarray(tree.depth[1:])
  if isinstance(drafter, draft_model.DraftModel):
    logits, _ = llama.logits_of(dparams, drafter.cfg, x)
    argmax_S = np.asarray(jnp.argmax(logits[0], -1))
    idx = np.minimum(roots[:, None] + depth_N[None] - 1, len(row) - 1)
    return argmax_S[idx]
  if isinstance(drafter, medusa.Medusa):
    _, (f,) = llama.logits_of(target.params, target.cfg, x, (llama.FINAL,))
    rank_N = np.asarray(medusa._ranks(tree))
    logits_SxHxW = medusa.head_logits(dparams, f[0][roots - 1])
    _, top = jax.lax.top_k(logits_SxHxW, int(rank_N.max()) + 1)
    return np.asarray(dparams["vocab_ids"][top[:, depth_N - 1, rank_N]])
  if isinstance(drafter, eagle.Eagle):
    return _eagle_chain(target, drafter, dparams, x, roots)
  return _stateless(drafter, dparams, x, roots, target.cfg.vocab_size)


def _eagle_chain(target, drafter, p, x_1xS, roots) -> np.ndarray:
  """Depth j of the chain rooted at r: rollout step j from pair r - 1 (see the objective)."""
  s = x_1xS.shape[1]
  _, feats = llama.logits_of(target.params, target.cfg, x_1xS, drafter.feature_layers)
  f_in = jnp.concatenate(feats, axis=-1)[:, :-1]
  t = s - 1
  positions = jnp.arange(t)[None]
  shift = lambda a, j: jnp.pad(a[:, j : j + t], [(0, 0), (0, t - a[:, j : j + t].shape[1])])  # noqa: E731
  x = eagle.inputs(p, x_1xS[:, 1:], eagle.fuse(p, f_in))
  attn = llama.attention_inputs(jnp.zeros((1,), jnp.int32), llama.causal_mask(t), 0, 0, False)
  out, k1, v1 = eagle.layer(p, drafter.cfg, x, positions, None, None, attn)
  picks, rolled = [], []
  for j in range(1, drafter.depth + 1):
    if j > 1:
      x = eagle.inputs(p, shift(x_1xS, j), out)
      out, k, v = eagle.rollout_layer(p, drafter.cfg, x, positions + j - 1, (k1, v1), rolled)
      rolled.append((k, v))
    picks.append(p["vocab_ids"][jnp.argmax(eagle.logits(p, out)[0], -1)])
  return np.asarray(jnp.stack(picks, -1))[roots - 1]


def _stateless(drafter, dparams, x_1xS, roots, vocab_size: int) -> np.ndarray:
  """``propose`` at every root at once: the text repeated, one row per root."""
  r = len(roots)
  ctx = DraftContext(
    tokens=jnp.tile(x_1xS, (r, 1)),
    lengths=jnp.asarray(roots, jnp.int32),
    key=jax.random.key(0),
    sampling=sampling.SamplingParams.create(temperature=0.0),
    vocab_size=vocab_size,
  )
  draft, _ = drafter.propose(dparams, None, ctx)
  tokens = np.asarray(draft.tokens)
  if draft.abstain is not None:  # an abstaining row verifies nothing: a one-token forward
    tokens = np.where(np.asarray(draft.abstain)[:, None], ABSTAINED, tokens)
  return tokens


def hits(drafts_RxN: np.ndarray, row: Sequence[int], first_root: int, tree: Tree) -> np.ndarray:
  """``[R, N]`` whether node n at root r proposes the text's token at ``r + depth(n)``."""
  text = np.asarray(row)
  roots = np.arange(first_root, first_root + len(drafts_RxN))
  at = roots[:, None] + np.asarray(tree.depth[1:])[None]
  inside = at < len(text)
  return inside & (drafts_RxN == text[np.minimum(at, len(text) - 1)])


def accepted_lengths(hits_RxN: np.ndarray, tree: Tree) -> np.ndarray:
  """``[R]`` the depth of the deepest node whose whole path hits (0: nothing accepted)."""
  r, n = hits_RxN.shape
  ok = np.ones((r, n + 1), bool)  # node 0, the root, is always in
  depth = np.asarray(tree.depth)
  best = np.zeros(r, int)
  for i, p in enumerate(tree.parents, start=1):  # parents come before children
    ok[:, i] = ok[:, p] & hits_RxN[:, i - 1]
    best = np.where(ok[:, i], np.maximum(best, depth[i]), best)
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
  return node_tree(drafter).is_chain and isinstance(
    drafter, (draft_model.DraftModel, eagle.Eagle, prompt_lookup.PromptLookup)
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
  tree, tokens, calls, abstained = node_tree(drafter), 0, 0, 0
  for prompt, new in rows:
    text = list(prompt) + list(new)
    drafts = offline_drafts(target, drafter, dparams, text, len(prompt))
    acc = accepted_lengths(hits(drafts, text, len(prompt), tree), tree)
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
  tree = node_tree(longest)
  tokens, calls = 0, np.zeros(k_max + 1, int)
  for prompt, new in rows:
    text = list(prompt) + list(new)
    drafts = offline_drafts(target, longest, dparams, text, len(prompt))
    acc = accepted_lengths(hits(drafts, text, len(prompt), tree), tree)
    tokens += len(new)
    for k in range(1, k_max + 1):
      calls[k] += walk(np.minimum(acc, k), len(new))[0]
  return {k: tokens / calls[k] for k in range(1, k_max + 1)}
