"""Gathers whose indices are in range by construction.

``jnp.take_along_axis`` and ``jnp.take`` check every index against the axis by default (mode
"fill": indices past the end give NaN or the type's minimum) and so lower to about twenty HLO
operations around a two-operation gather. specjax's indices are lengths, accepted counts, tree
parents and top-k slots, in range by construction, and a decode loop makes about a hundred such
gathers once its ``cond`` branches are counted: without the checks a tiny EAGLE loop's
optimised HLO has 5,889 instructions instead of 8,005, and four tiny loops compile in 0.93x the
CPU time (notes/testing-diary.md, the tenth run). These helpers promise the gather in
bounds.
Negative indices still count from the end, as in NumPy.
"""

import jax
import jax.numpy as jnp


def _wrapped(indices: jax.Array, size: int) -> jax.Array:
  return jnp.where(indices < 0, indices + size, indices)


def take_along(x: jax.Array, indices: jax.Array, axis: int) -> jax.Array:
  """``jnp.take_along_axis(x, indices, axis)`` for indices in ``[-n, n)`` along ``axis``."""
  wrapped = _wrapped(jnp.asarray(indices), x.shape[axis])
  return jnp.take_along_axis(x, wrapped, axis=axis, mode="promise_in_bounds")


def take(x: jax.Array, indices: jax.Array, axis: int) -> jax.Array:
  """``jnp.take(x, indices, axis)`` for indices in ``[-n, n)`` along ``axis``."""
  axis = axis % x.ndim
  wrapped = _wrapped(jnp.asarray(indices), x.shape[axis])
  return x.at[(slice(None),) * axis + (wrapped,)].get(mode="promise_in_bounds")
