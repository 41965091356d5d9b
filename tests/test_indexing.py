"""specjax.indexing: the decode loop's gathers, promised in bounds."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import indexing

X = jnp.arange(60.0).reshape(3, 4, 5)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_in_range_indices_give_numpys_values_negative_ones_from_the_end(axis):
  n = X.shape[axis]
  idx = np.array([[0, n - 1], [-1, -n]])
  assert np.array_equal(indexing.take(X, idx, axis), np.take(np.asarray(X), idx, axis=axis))
  shape = list(X.shape)
  shape[axis] = 2
  along = np.random.default_rng(axis % 3).integers(-n, n, shape)
  want = np.take_along_axis(np.asarray(X), along, axis=axis)
  assert np.array_equal(indexing.take_along(X, along, axis), want)


def _ops(fn, *args) -> int:
  text = jax.jit(fn).lower(*args).as_text()
  return sum(1 for line in text.splitlines() if "stablehlo." in line and " = " in line)


def test_the_gather_has_no_bounds_checks():
  """What the helpers are for: a fraction of the default gather's operations (fewer
  operations in every decode loop's program, a shorter compile)."""
  idx = jnp.zeros((3, 4, 1), jnp.int32)
  default = _ops(lambda x, i: jnp.take_along_axis(x, i, axis=2), X, idx)
  assert _ops(lambda x, i: indexing.take_along(x, i, 2), X, idx) <= default // 2
