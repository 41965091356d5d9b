"""Shared fixtures: tiny random models, compiled once per session."""

import os

# Tests must see one CPU device unless a test asks for more in a subprocess.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

from specjax import testing  # noqa: E402


@pytest.fixture(scope="session")
def tiny_pair():
  """Target and an independent draft, vocab 8: clearly different distributions."""
  target = testing.tiny_model(seed=0)
  draft = testing.tiny_model(seed=3)
  return target, draft


@pytest.fixture(scope="session")
def small_target():
  """Vocab 64, 3 layers: long enough greedy runs to be non-trivial."""
  return testing.tiny_model(seed=0, vocab_size=64, dim=32, num_layers=3)
