"""Shared fixtures (tiny random models, compiled once per session) and the test environment.

Tests see one CPU device unless a test asks for more in a subprocess, XLA compiles without
its backend optimisation (as tests/train_worker.py's workers do), and torch (the HF oracle)
runs one thread per worker. Compiled programs go to a persistent XLA cache under
``.pytest_cache/xla`` (override with JAX_COMPILATION_CACHE_DIR): the subprocesses a test starts
(CLI runs, multi-process workers) reuse what another process already compiled, and a second run
of the suite skips most compiles.
"""

import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault(
  "JAX_COMPILATION_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".pytest_cache" / "xla")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
# XLA's backend (LLVM) optimisation is most of a compile here, and tests compile far more than
# they run: without it a compile-bound test took 0.6x the time, and a real-model decode test
# 0.9x (cold cache, measured); the suite passes with and without it. Benchmarks and
# experiments run outside the tests, with XLA's defaults.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")
# One intra-op thread for torch (the HF oracle): the xdist workers already fill the cores, and
# torch's threads spinning on a busy core made HF generate ~4x slower here (measured).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import jax  # noqa: E402
import pytest  # noqa: E402

from specjax.models import tiny  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _drop_compiled_programs():
  """Frees every compiled program after each test module.

  XLA's CPU backend maps each program's machine code in ~1,500-2,000 memory regions (a SmolLM2
  generate), and Linux allows 65,530 per process (vm.max_map_count): kept for the whole suite,
  they ran out and the process crashed inside XLA. Programs a later module needs come back from
  the persistent cache."""
  yield
  jax.clear_caches()


@pytest.fixture(scope="session")
def tiny_pair():
  """Target and an independent draft, vocab 8: clearly different distributions."""
  target = tiny.random_model(seed=0)
  draft = tiny.random_model(seed=3)
  return target, draft


@pytest.fixture(scope="session")
def small_target():
  """Vocab 64, 3 layers: long enough greedy runs to be non-trivial."""
  return tiny.random_model(seed=0, vocab_size=64, dim=32, num_layers=3)
