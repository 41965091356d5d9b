"""Draft trees: static topologies, and the masks and paths the decode loop derives from parents.

A tree has ``N + 1`` nodes. Node 0 is the root: the row's newest token, already emitted but not
yet in the target cache. Nodes ``1..N`` are draft tokens, numbered so that every parent comes
before its children (``parents[i] < i``). A node at depth d sits at position ``L + d`` where L
is the row's cache length, so sibling nodes share a position and the rotary embedding of every
root-to-node path is that of a plain sequence.

Two ways to describe a tree:

* ``Tree`` is static, hashable data (a drafter's config): ``Tree.from_paths`` takes paths of
  child choices, Medusa-style (``[[0], [1], [0, 0]]``: the root's first and second child, and
  the first child's first child), and ``Tree.from_spec(branching=(3, 2, 1))`` builds the full
  tree with 3 children at depth 1, 2 under each of those, then 1.
* A *dynamic* tree is a ``parents[B, N]`` array produced inside the jitted step (for drafters
  that grow trees by confidence). The decode loop only ever reads the parents array, so both
  kinds share every line: ``ancestors``, ``depths`` and ``path_to`` work on arrays.

A chain of K tokens is the tree with one branch (``Tree.chain(K)``).
"""

import dataclasses
import heapq
import math
import numbers
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax import indexing

# The most draft nodes a static tree may hold: far above any drafter's budget
# (config.drafter.max_nodes, 64 by default), low enough to refuse a typo before it builds millions.
MAX_NODES = 4096


def _is_int(value) -> bool:
  """An integer (numpy's too), not a bool or a float: ``drafters.base.is_integer``, restated
  because importing ``specjax.drafters`` from here would be circular (its drafters import
  this module)."""
  return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _check_size(num_nodes: int, what: str) -> None:
  if num_nodes > MAX_NODES:
    raise ValueError(
      f"{what} has {num_nodes} nodes, more than trees.MAX_NODES={MAX_NODES} (a drafter's "
      "budget is config.drafter.max_nodes, 64 by default): use a smaller tree."
    )


@dataclasses.dataclass(frozen=True)
class Tree:
  """A static tree: ``parents[i - 1]`` is the parent of node i (node 0, the root, has none)."""

  parents: tuple[int, ...]

  def __post_init__(self):
    for i, p in enumerate(self.parents, start=1):
      if not _is_int(p) or not 0 <= p < i:
        raise ValueError(
          f"tree node {i} has parent {p}: parents must be listed before their children "
          "(0 <= parent < node)."
        )

  @property
  def num_nodes(self) -> int:
    """Draft nodes, the root excluded."""
    return len(self.parents)

  @property
  def depth(self) -> np.ndarray:
    """``[N + 1]`` depth of every node (the root has depth 0)."""
    d = [0]
    for p in self.parents:
      d.append(d[p] + 1)
    return np.asarray(d, np.int32)

  @property
  def max_depth(self) -> int:
    return int(self.depth.max())

  @property
  def max_width(self) -> int:
    """The most nodes at any one depth."""
    return int(np.bincount(self.depth)[1:].max()) if self.parents else 0

  @property
  def is_chain(self) -> bool:
    return self.parents == tuple(range(self.num_nodes))

  def mask(self) -> np.ndarray:
    """``[N + 1, N + 1]`` bool: node i attends to node j iff j is i or one of its ancestors."""
    return np.asarray(ancestors(jnp.asarray(self.parents)[None]))[0]

  def paths(self) -> list[list[int]]:
    """Every root-to-leaf path, as lists of node ids (the root left out)."""
    children = {p for p in self.parents}
    out = []
    for leaf in range(1, self.num_nodes + 1):
      if leaf in children:
        continue
      path, node = [], leaf
      while node:
        path.append(node)
        node = self.parents[node - 1]
      out.append(path[::-1])
    return out

  def choices(self) -> list[list[int]]:
    """Every node's path of child choices from the root (Medusa's path list, nodes 1..N in
    order): ``Tree.from_paths(tree.choices())`` gives the tree back."""
    out: list[list[int]] = [[]]
    count: dict[int, int] = {}
    for p in self.parents:
      out.append(out[p] + [count.get(p, 0)])
      count[p] = count.get(p, 0) + 1
    return out[1:]

  def check_budget(self, max_depth: int, max_nodes: int) -> None:
    if self.max_depth > max_depth:
      raise ValueError(
        f"the draft tree is {self.max_depth} deep, more than the budget max_depth={max_depth}: "
        "use fewer levels or raise the budget."
      )
    if self.num_nodes > max_nodes:
      raise ValueError(
        f"the draft tree has {self.num_nodes} nodes, more than the budget max_nodes="
        f"{max_nodes}: use a narrower tree or raise the budget."
      )

  @classmethod
  def chain(cls, k: int) -> "Tree":
    """``k`` nodes, each the child of the one before (0: the root alone)."""
    if not _is_int(k) or k < 0:
      raise ValueError(f"a tree chain needs an integer k >= 0 nodes, got {k!r}.")
    _check_size(k, f"the chain of {k}")
    return cls(tuple(range(int(k))))

  def with_branch(self, k: int) -> "Tree":
    """This tree, then a chain of ``k`` more nodes from the root (the root's last child)."""
    if not _is_int(k) or k < 1:
      raise ValueError(f"a tree's extra branch needs an integer k >= 1 nodes, got {k!r}.")
    _check_size(self.num_nodes + k, "the tree with its branch")
    return Tree(self.parents + tuple(int(p) for p in branch_parents(self.num_nodes, k)))

  @classmethod
  def from_paths(cls, paths: Sequence[Sequence[int]]) -> "Tree":
    """Builds the tree holding every path of child choices (each path's prefixes included).

    Nodes are numbered breadth-first, children by choice index, so parents precede children.
    A path needs its prefixes' siblings to exist: ``[0, 1]`` without ``[0, 0]`` is malformed,
    as is a negative or non-integer choice.
    """
    if isinstance(paths, np.ndarray):
      paths = paths.tolist()
    if not isinstance(paths, (list, tuple)):
      raise ValueError(f"tree paths must be a list of paths (lists of choices), got {paths!r:.40}.")
    nodes: set[tuple[int, ...]] = set()
    for i, path in enumerate(paths):
      if not isinstance(path, (list, tuple, np.ndarray)):
        raise ValueError(
          f"tree path {i} is {path!r:.40}, not a list of choices: paths is a list of paths, "
          "e.g. [[0], [0, 0]]."
        )
      path = tuple(path)
      if not path:
        raise ValueError(f"tree path {i} is empty: every path needs at least one choice.")
      if any(not isinstance(c, int | np.integer) or c < 0 for c in path):
        raise ValueError(f"tree path {i} = {list(path)}: choices must be integers >= 0.")
      nodes.update(path[:d] for d in range(1, len(path) + 1))
      _check_size(len(nodes), "the tree of these paths")
    if not nodes:
      raise ValueError("tree paths are empty: give at least one path, e.g. [[0]].")
    for node in nodes:
      if node[-1] > 0 and node[:-1] + (node[-1] - 1,) not in nodes:
        raise ValueError(
          f"tree path {list(node)} has no sibling {list(node[:-1] + (node[-1] - 1,))}: child "
          "choices at each node must be 0, 1, 2, ... with none skipped."
        )
    order = sorted(nodes, key=lambda n: (len(n), n))
    index = {(): 0} | {n: i + 1 for i, n in enumerate(order)}
    return cls(tuple(index[n[:-1]] for n in order))

  @classmethod
  def from_accuracy(cls, accuracy, num_nodes: int) -> tuple["Tree", float]:
    """The ``num_nodes``-node tree with the largest expected accepted length (Medusa §2.3.3).

    ``accuracy[d][i]`` is how often depth ``d + 1``'s ``i``-th candidate is the right token
    (measured on held-out text); a node reached by child choices ``(c_1, ..., c_d)`` is taken
    to be accepted with probability ``prod_k accuracy[k - 1][c_k]`` (depths independent), and
    the expected accepted length is the sum over nodes. Grown greedily: the next node is the
    most probable child or next sibling of a node already in, which is optimal when accuracy
    falls with the rank. Returns the tree and its expected accepted length (root excluded).

    ``num_nodes`` is an upper bound: a table of D depths and R ranks holds R + R**2 + ... + R**D
    nodes in all, and a budget above that gives the whole table's tree (fewer nodes).
    """
    acc = np.asarray(accuracy, np.float64)
    if acc.ndim != 2 or acc.size == 0 or not ((acc >= 0) & (acc <= 1)).all():
      raise ValueError(
        f"tree accuracy must be a [depths, ranks] table of probabilities in [0, 1] (no nan), got "
        f"shape {acc.shape}."
      )
    if not _is_int(num_nodes) or not 1 <= num_nodes <= MAX_NODES:
      raise ValueError(
        f"tree num_nodes must be an integer in [1, trees.MAX_NODES={MAX_NODES}], got {num_nodes!r}."
      )
    depths, ranks = acc.shape
    prob = lambda path: float(np.prod([acc[d, c] for d, c in enumerate(path)]))  # noqa: E731
    heap, chosen, expected = [(-acc[0, 0], (0,))], [], 0.0
    while heap and len(chosen) < num_nodes:
      neg_p, path = heapq.heappop(heap)
      chosen.append(path)
      expected -= neg_p
      if path[-1] + 1 < ranks:
        sibling = path[:-1] + (path[-1] + 1,)
        heapq.heappush(heap, (-prob(sibling), sibling))
      if len(path) < depths:
        heapq.heappush(heap, (-prob(path + (0,)), path + (0,)))
    return cls.from_paths(chosen), expected

  @classmethod
  def from_spec(cls, branching: Sequence[int]) -> "Tree":
    """The full tree with ``branching[d]`` children under every node at depth d."""
    if isinstance(branching, np.ndarray):
      branching = branching.tolist()
    if (
      not isinstance(branching, (list, tuple))
      or not branching
      or any(not _is_int(b) or b < 1 for b in branching)
    ):
      raise ValueError(f"tree branching {branching!r:.40} must be a non-empty list of ints >= 1.")
    _check_size(sum(math.prod(branching[: d + 1]) for d in range(len(branching))), "the tree")
    paths, level = [], [()]
    for b in branching:
      level = [n + (c,) for n in level for c in range(b)]
      paths += level
    return cls.from_paths(paths)


# --- Array form: what the decode loop computes from parents[B, N] -----------------------------


def branch_parents(n: int, k: int) -> np.ndarray:
  """``[k]`` parents of a chain of ``k`` nodes appended to an ``n``-node tree as one more branch
  from the root: node n + 1 is the root's child, each next node the child of the one before."""
  return np.concatenate([[0], n + np.arange(1, k)]).astype(np.int32)


def full_parents(parents_BxN: jax.Array) -> jax.Array:
  """``[B, N + 1]`` parents with the root's (itself, 0) prepended."""
  return jnp.concatenate([jnp.zeros_like(parents_BxN[:, :1]), parents_BxN], axis=1)


def ancestors(parents_BxN: jax.Array) -> jax.Array:
  """``[B, N + 1, N + 1]`` bool: ``[b, i, j]`` iff node j is node i or one of its ancestors."""
  par = full_parents(parents_BxN)
  n1 = par.shape[1]
  node_BxN1 = jnp.broadcast_to(jnp.arange(n1), par.shape)
  anc = node_BxN1[..., None] == jnp.arange(n1)
  for _ in range(n1 - 1):  # walk one level up per pass; the root is its own parent
    node_BxN1 = indexing.take_along(par, node_BxN1, axis=1)
    anc |= node_BxN1[..., None] == jnp.arange(n1)
  return anc


def depths(ancestors_BxN1xN1: jax.Array) -> jax.Array:
  """``[B, N + 1]`` depth of every node: its number of proper ancestors."""
  return jnp.sum(ancestors_BxN1xN1, axis=-1) - 1


def path_to(ancestors_BxN1xN1, depth_BxN1, end_B, max_depth: int) -> jax.Array:
  """``[B, max_depth]`` the nodes at depths 1..max_depth on the root-to-``end`` path.

  Entries past the end node's depth are 0 (the root); callers mask them by that depth.
  """
  anc_BxN1 = indexing.take_along(ancestors_BxN1xN1, end_B[:, None, None], axis=1)[:, 0]
  d_D = jnp.arange(1, max_depth + 1)
  on_path_BxDxN1 = anc_BxN1[:, None, :] & (depth_BxN1[:, None, :] == d_D[:, None])
  return jnp.argmax(on_path_BxDxN1, axis=-1).astype(jnp.int32)
