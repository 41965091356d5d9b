"""EAGLE-2's dynamic tree under static shapes: the budget ``(top_k, depth, total)`` and what
``Eagle.propose`` grows a tree with in one step: the ``Pool`` of every node offered so far
and the ``Expanded`` nodes fed through the layer (the package docstring walks the step).
"""

import jax
import jax.numpy as jnp
from flax import struct

from specjax import indexing
from specjax.drafters.base import is_integer
from specjax.drafters.eagle.model import FIELD


def pool_size(top_k: int, depth: int) -> int:
  """Nodes offered per step: the root's top_k children, then top_k^2 per further level."""
  return top_k + (depth - 1) * top_k**2


def check_shape(top_k, depth, total) -> None:
  """The tree budget ``(top_k, depth, total)``: one clear error naming the field."""
  for f, value in (("top_k", top_k), ("depth", depth), ("total", total)):
    if not is_integer(value) or value < 1:  # 12.0 failed in the compile; True was 1
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
    parent_score = indexing.take_along(self.score_BxP, frontier_BxK, axis=1)
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
    parent_BxK = indexing.take_along(parent_BxP, frontier_BxK, axis=1)
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
