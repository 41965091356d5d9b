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

from specjax import decode
from specjax.drafters import family
from specjax.trees import Tree


def replay_of(drafter) -> family.Replay:
  """How ``drafter`` is replayed (its family record's ``replay``); one clear error for a
  drafter the simulator cannot replay offline."""
  record = family.FAMILIES.get(drafter.name)
  if drafter.num_extra or record is None or record.replay is None:
    able = [n for n, f in family.FAMILIES.items() if f.replay is not None and n != "none"]
    raise ValueError(
      f"drafter.name={drafter.name!r}: offline acceptance is simulated for drafters whose family "
      f"record gives a replay ({', '.join(able)})."
    )
  return record.replay


def node_tree(drafter) -> Tree | None:
  """The static tree a drafter verifies (its replay's ``tree``); None for EAGLE-2's dynamic
  trees (one per step)."""
  return replay_of(drafter).tree(drafter)


def check_supported(drafter) -> None:
  """One clear error for a drafter the simulator cannot replay offline."""
  replay_of(drafter)


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
  """``(tokens [R, N], parents [R, N] or None, abstain [R])`` at every root, in one program:
  its family record's ``replay.drafts``."""
  target = types.SimpleNamespace(cfg=cfg, params=tparams)
  return replay_of(drafter).drafts(drafter, target, dparams, x_1xS, roots_R, row_len)


def node_depths(parents_RxN: np.ndarray) -> np.ndarray:
  """``[R, N + 1]`` each node's depth (the root's 0) in every row's tree; parents come before
  their children, as in every tree a drafter proposes. On the host: these are a few hundred
  small integers per replayed text."""
  parents_RxN = np.asarray(parents_RxN)
  r, n = parents_RxN.shape
  rows = np.arange(r)
  depth = np.zeros((r, n + 1), np.int32)
  for i in range(1, n + 1):
    depth[:, i] = depth[rows, parents_RxN[:, i - 1]] + 1
  return depth


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
  chain = replay_of(drafter).chain
  if chain is None:
    raise ValueError(f"drafter {drafter.name!r} has no chain-length sweep (its replay's chain).")
  return chain(drafter, k)


def is_chain(drafter) -> bool:
  """Whether τ for every chain length comes from one replay (``tau_by_chain_length``)."""
  tree = node_tree(drafter)
  return tree is not None and tree.is_chain and replay_of(drafter).chain is not None


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
  K-chain's, abstentions included). A drafter whose chains end sooner (a block drafter's
  positions: its replay's ``longest``) stops there."""
  if (cap := replay_of(drafter).longest) is not None:
    k_max = min(k_max, cap(drafter))
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
