"""A static tree drafted from per-depth distributions, in one call: Medusa's heads and a block
drafter's positions (DFlash) each give one distribution per depth d, computed in one forward
and the same whatever tokens were drafted above, so every node at depth d draws from q_d.

Node (depth d, rank r) is its parent's r-th child and takes depth d's r-th candidate under that
parent. ``sampled=False``: each depth's top-ranked tokens, deterministic (``Draft.probs=None``,
one-hot q), lossless at any temperature. ``sampled=True``: under every parent its children are
drawn without replacement from q_d (Gumbel-top-k, fresh noise per parent) and verified with q_d
by recursive rejection sampling (each rank's q is q_d before the verifier's renormalisation):
the output is exactly the target's at any temperature, top-k or top-p. At temperature 0 the
draw is the top-k and the verifier greedy.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax import sampling
from specjax.drafters import curves, family, prompt_lookup
from specjax.drafters.base import Draft, DraftContext, check_auto_from
from specjax.trees import Tree


class OnStaticTree:
  """What a drafter drafting one static tree per step (fields ``tree`` and ``lookup``: a
  prompt-lookup branch or None) shares: the verified nodes, one draft call per step, the lookup
  branch's guess after the tree's nodes (in decoding and in replay)."""

  @property
  def nodes(self) -> Tree:
    """The tree verified each step: the drafter's, then the lookup branch if there is one."""
    return self.tree if self.lookup is None else self.tree.with_branch(self.lookup.num_draft)

  @property
  def num_draft(self) -> int:
    return self.nodes.max_depth

  @property
  def num_nodes(self) -> int:
    return self.nodes.num_nodes

  @property
  def verifies_tree(self) -> bool:
    """A chain without a lookup branch goes to the chain verifier."""
    return not (self.tree.is_chain and self.lookup is None)

  def draft_calls_per_step(self) -> int:
    return 1

  def _finish(self, draft: Draft, ctx: DraftContext) -> Draft:
    """``draft`` with the lookup branch, if any, or without parents when the chain verifier
    takes it."""
    if self.lookup is not None:
      return self._with_lookup(draft, ctx)
    return draft if self.verifies_tree else draft.replace(parents=None)

  def _with_lookup(self, draft: Draft, ctx: DraftContext) -> Draft:
    """The lookup chain after the tree's nodes (node ids ``tree.num_nodes + 1 ..``)."""
    return prompt_lookup.with_branch(draft, self.lookup, ctx)

  def replayed(self, tokens_RxN, target, x_1xS, roots_R, row_len):
    """Replay's drafts: the tree's tokens at every root, the lookup branch's guess after."""
    if self.lookup is not None:
      guess, _, _ = self.lookup.teacher_forced_drafts(target, None, x_1xS, roots_R, row_len)
      tokens_RxN = jnp.concatenate([tokens_RxN, guess], axis=1)
    return tokens_RxN, None, jnp.zeros(roots_R.shape, bool)


def add_fields(c, chain: bool) -> None:
  """A static-tree drafter's config fields (``chain``: a block drafter, whose default tree is
  a chain over every depth and whose tree may be ``"auto"``; else the caller sets
  ``tree_spec``)."""
  if chain:
    c.tree_spec = ()  # top-k per depth; () and no tree_paths: a chain over every depth
    # "auto": the tree of auto_from's block_grid (chains and trees of this drafter, their
    # greedy τ replayed by task=cost_model) predicted fastest where it runs.
    c.tree = ""
    c.auto_from = ""
  c.tree_paths = ()  # paths of child ranks, e.g. ((0,), (1,), (0, 0)); overrides tree_spec
  c.candidates = "auto"  # auto (sampled iff temperature > 0) | top_k | sampled
  prompt_lookup.add_branch_fields(c)


# -- tree = "auto": the block drafters' grid --


def caterpillar(depth: int) -> Tree:
  """A chain of ``depth`` with each depth's second candidate beside it (2 x depth nodes)."""
  chain = [(0,) * d for d in range(1, depth + 1)]
  return Tree.from_paths(chain + [(0,) * (d - 1) + (1,) for d in range(1, depth + 1)])


def swept_trees(num_draft: int) -> list[Tree]:
  """The trees ``task=cost_model`` replays for a block drafting ``num_draft`` positions:
  chains of every length, then caterpillars of depth 2 and more."""
  return [Tree.chain(k) for k in range(1, num_draft + 1)] + [
    caterpillar(k) for k in range(2, num_draft + 1)
  ]


def check_auto(c, config, field: str, name: str) -> None:
  """``config.drafter.<name>``'s ``tree``: "" or "auto" (with a trained ``path`` and an
  ``auto_from`` holding its grid, and no ``tree_spec`` / ``tree_paths`` beside it)."""
  if c.tree == "":
    return
  if c.tree != "auto":
    raise ValueError(
      f"{field}.tree={c.tree!r}: '' (the tree of tree_spec or tree_paths) or 'auto' (with "
      "auto_from) to pick the tree for this machine."
    )
  if c.tree_spec or c.tree_paths:
    raise ValueError(f"{field}.tree='auto' picks the tree: leave tree_spec and tree_paths empty.")
  holds = f"with a {name} variant of this drafter (it holds τ for every tree)"
  target = check_auto_from(c, field, holds, config, knob="tree")
  if not c.path:
    raise ValueError(f"{field}.tree='auto' picks a tree for a trained drafter: set path.")
  curves.block_grid(c.auto_from, name, target, c.path, int(c.lookup))


def tune(name: str, depths) -> family.Tune:
  """The family record's ``tune`` of a block drafter (``depths(drafter)``: the positions its
  block drafts): ``tree = "auto"`` weighs every tree of ``swept_trees`` (with the drafter's
  lookup branch), as ``task=cost_model`` replayed them into ``block_grid``."""

  def grid(config, target_name: str) -> list[dict]:
    c = config.drafter[name]
    grid = curves.block_grid(c.auto_from, name, target_name, c.path, int(c.lookup))
    return curves.within_budget(grid, config, name, "tree of its block_grid", "nodes")

  def sweep(drafter, dparams, cm, replay):
    del cm
    out = []
    for tree in swept_trees(depths(drafter)):
      d = dataclasses.replace(drafter, tree=tree)
      out.append({"tree_paths": tree.choices(), "chain": tree.is_chain, "nodes": d.num_nodes,
                  "depth": d.num_draft, "tau": replay(d, dparams).tau})  # fmt: skip
    return drafter, out

  def group(drafter):
    """A Markov head draws level by level (its cost grows with the tree): timed per shape."""
    cfg = drafter.cfg
    return (drafter.tree.max_depth, width(drafter.tree)) if getattr(cfg, "markov_rank", 0) else None

  return family.Tune(
    field="tree",
    grid=grid,
    label=lambda g: (
      f"{'chain' if g['chain'] else 'tree'} of {len(g['tree_paths'])}"
      + (f" + lookup {g['lookup']}" if g["lookup"] else "")
    ),  # fmt: skip
    prefer=lambda g: (-g["nodes"], -g["depth"]),
    apply=lambda d, g: dataclasses.replace(d, tree=Tree.from_paths(g["tree_paths"])),
    group=group,
    sweep=family.Sweep(
      key="block_grid",
      run=sweep,
      tag=lambda c: {"family": name, "path": c.path, "lookup": int(c.lookup)},
    ),
  )


def parse(c, num_draft: int, field: str, deeper: str) -> Tree:
  """The tree of a block drafter's config section ``c``: ``tree_paths`` (paths of child ranks)
  or ``tree_spec`` (top-k per depth); neither, a chain over all ``num_draft`` drafted
  positions; ``tree = "auto"``, a one-node chain until ``costmodel.auto`` picks. One error
  naming the field for a malformed tree or one deeper than the block (``deeper``: what would
  make the block deeper)."""
  if c.get("tree") == "auto":
    return Tree.chain(1)  # until ``auto`` picks from the grid (every tree there is deeper or wider)
  try:
    if c.tree_paths:
      tree = Tree.from_paths([list(p) for p in c.tree_paths])
    elif c.tree_spec:
      tree = Tree.from_spec(tuple(c.tree_spec))
    else:
      tree = Tree.chain(num_draft)
  except (TypeError, ValueError) as e:
    which = "tree_paths" if c.tree_paths else "tree_spec"
    raise ValueError(f"{field}.{which}: {e}") from None
  if tree.max_depth > num_draft:
    raise ValueError(
      f"{field}: the tree is {tree.max_depth} deep but a block drafts {num_draft} positions: "
      f"use a shallower tree or {deeper}."
    )
  return tree


def ranks(tree: Tree) -> tuple[int, ...]:
  """Each node's index among its parent's children (nodes 1..N)."""
  seen: dict[int, int] = {}
  out = []
  for p in tree.parents:
    out.append(seen.get(p, 0))
    seen[p] = out[-1] + 1
  return tuple(out)


def width(tree: Tree) -> int:
  """The most children any node has: candidates drawn per depth (or per parent)."""
  return max(ranks(tree)) + 1


def parents(tree: Tree, batch: int) -> jax.Array:
  """``[B, N]`` the tree's parents, the same for every row."""
  return jnp.broadcast_to(jnp.asarray(tree.parents, jnp.int32), (batch, tree.num_nodes))


def draft(
  tree: Tree,
  logits_BxDxW: jax.Array,
  sampled: bool,
  ctx: DraftContext,
  vocab_ids: jax.Array | None = None,
  vocab_size: int = 0,
) -> Draft:
  """The tree's tokens (and, sampled, each node's q) from ``logits[b, d - 1]``, depth d's
  logits over W draft tokens: the target's ids ``vocab_ids`` (None: W is the target's whole
  vocabulary). With a reduced vocabulary q is zero outside it (``vocab_size``: the target's)."""
  b = logits_BxDxW.shape[0]
  # Only the tree's depths are ranked: XLA turns a top-k whose result is sliced (a 1-chain
  # reading one block position of eight) into a sort of every position (10 ms on a CPU).
  logits_BxDxW = logits_BxDxW[:, : tree.max_depth]
  depth_N = np.asarray(tree.depth[1:]) - 1  # the depth (0-based) of every node
  rank_N = np.asarray(ranks(tree))
  k = width(tree)
  to_target = (lambda ids: ids) if vocab_ids is None else (lambda ids: vocab_ids[ids])
  if not sampled:
    _, top_BxDxC = jax.lax.top_k(logits_BxDxW, k)
    return Draft(tokens=to_target(top_BxDxC[:, depth_N, rank_N]), parents=parents(tree, b))
  q_BxDxW = sampling.probs(logits_BxDxW, ctx.sampling)
  parent_N = np.asarray(tree.parents)
  inner = sorted(set(parent_N.tolist()))  # nodes with children
  row_of = {p: i for i, p in enumerate(inner)}
  depth_I = np.asarray(tree.depth)[inner]  # children of a depth-d node come from depth d + 1
  greedy = sampling.is_greedy(ctx.sampling)
  if greedy is True:  # static temperature 0: each depth's top tokens, no draw
    scores_BxIxW = logits_BxDxW[:, depth_I]
  else:
    gumbel_BxIxW = jax.random.gumbel(ctx.key, (b, len(inner), q_BxDxW.shape[-1]))
    scores_BxIxW = jnp.where(
      greedy, logits_BxDxW[:, depth_I], jnp.log(q_BxDxW[:, depth_I]) + gumbel_BxIxW
    )
  _, top_BxIxC = jax.lax.top_k(scores_BxIxW, k)
  parent_row_N = np.asarray([row_of[p] for p in parent_N])
  tokens_BxN = to_target(top_BxIxC[:, parent_row_N, rank_N])
  q_BxNxW = _over_vocab(q_BxDxW[:, depth_N], vocab_ids, vocab_size)
  return Draft(tokens=tokens_BxN, probs=q_BxNxW, parents=parents(tree, b))


def _over_vocab(q_BxNxW, vocab_ids, vocab_size: int):
  """q over the target's vocabulary: zero outside a reduced draft vocabulary ``vocab_ids``."""
  if vocab_ids is None or q_BxNxW.shape[-1] >= vocab_size:
    return q_BxNxW
  q_BxNxV = jnp.zeros(q_BxNxW.shape[:2] + (vocab_size,), q_BxNxW.dtype)
  return q_BxNxV.at[:, :, vocab_ids].set(q_BxNxW)


def draft_by_parent(tree: Tree, children_logits, root_B, state_BxS, sampled: bool, ctx,
                    vocab_ids=None, vocab_size: int = 0) -> Draft:  # fmt: skip
  """``draft`` where a node's children draw from a distribution that depends on the node
  (DSpark's Markov head: its token biases the next position's logits), level by level:
  ``children_logits(level, tokens [B, I], states [B, I, S]) -> (logits [B, I, W], states)``
  gives the children's logits of the I nodes at ``level`` that have children, from their
  tokens (target ids; the root's is ``root_B``) and the states their parents left (the root's
  ``state_BxS``); a child inherits its parent's returned state. Sampled: children are drawn
  without replacement from their parent's q (Gumbel-top-k, fresh noise per parent), and that
  q is each child's, so the tree verifier's recursive rejection stays exact."""
  b = root_B.shape[0]
  parent_N, rank_N = np.asarray(tree.parents), np.asarray(ranks(tree))
  depth = np.asarray(tree.depth)
  k = width(tree)
  to_target = (lambda ids: ids) if vocab_ids is None else (lambda ids: vocab_ids[ids])
  tokens, states, q = {0: root_B}, {0: state_BxS}, {}
  greedy = sampling.is_greedy(ctx.sampling) if sampled else True
  for level in range(tree.max_depth):
    inner = sorted({int(p) for p in parent_N if depth[p] == level})
    logits_BxIxW, st_BxIxS = children_logits(
      level, jnp.stack([tokens[n] for n in inner], 1), jnp.stack([states[n] for n in inner], 1)
    )
    if sampled:
      q_BxIxW = sampling.probs(logits_BxIxW, ctx.sampling)
    if greedy is True:
      scores = logits_BxIxW
    else:
      gumbel = jax.random.gumbel(jax.random.fold_in(ctx.key, level), q_BxIxW.shape)
      scores = jnp.where(greedy, logits_BxIxW, jnp.log(q_BxIxW) + gumbel)
    _, top_BxIxC = jax.lax.top_k(scores, k)
    kids = [(i, c) for i, n in enumerate(inner) for c in np.flatnonzero(parent_N == n) + 1]
    row_C, node_C = np.asarray(kids).T  # node c's parent is parent_N[c - 1], at row i
    # One gather of the level's picks: XLA turns a top-k whose result is sliced into a sort.
    picked_BxC = to_target(top_BxIxC[:, row_C, rank_N[node_C - 1]])
    for j, (i, c) in enumerate(kids):
      tokens[c] = picked_BxC[:, j]
      states[c] = st_BxIxS[:, i]
      if sampled:
        q[c] = q_BxIxW[:, i]
  nodes = range(1, tree.num_nodes + 1)
  tokens_BxN = jnp.stack([tokens[c] for c in nodes], 1)
  if not sampled:
    return Draft(tokens=tokens_BxN, parents=parents(tree, b))
  q_BxNxW = _over_vocab(jnp.stack([q[c] for c in nodes], 1), vocab_ids, vocab_size)
  return Draft(tokens=tokens_BxN, probs=q_BxNxW, parents=parents(tree, b))
