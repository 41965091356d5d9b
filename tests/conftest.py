"""The test environment and the fixtures tests share.

Tests see one CPU device; a test that needs more, or a fresh JAX, starts a process
(``tests/train_worker.py``). Nothing here replaces a function of specjax or of an oracle:
tests load real models through ``registry.load``, the path a user's load takes (module
fixtures share a load within a file), and HF transformers and the reference implementations
read their files with their own code (tests/test_imports.py checks this file for it).
How to run the suite, its quick tier and its budget: ``docs/testing.md``.
"""

import contextlib
import fcntl
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Compiled programs persist across tests, workers and runs (a second run skips most compiles).
os.environ.setdefault(
  "JAX_COMPILATION_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".pytest_cache" / "xla")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# Tests compile far more than they run: XLA's backend optimisation is most of a compile, and the
# classic emitters compile a tiny model's loop in 0.65x the time; one codegen thread, as the
# xdist workers fill the cores. Measured in notes/testing-diary.md; train_worker.py passes these on.
os.environ.setdefault(
  "XLA_FLAGS",
  "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
  " --xla_cpu_parallel_codegen_split_count=1",
)
# dtype = auto on a CPU times the target in both dtypes and keeps the faster (specjax/precision.py);
# the suite pins float32 so that its results do not depend on the host. test_precision unpins
# it to test the measured choice itself.
os.environ.setdefault("SPECJAX_CPU_DTYPE", "float32")
# One torch thread (the HF oracle): the xdist workers already fill the cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import jax  # noqa: E402
import pytest  # noqa: E402
from jax import monitoring  # noqa: E402

from specjax.models import tiny  # noqa: E402

# --- whole files to the xdist workers, longest first -------------------------------------------

DURATIONS = Path(__file__).with_name("durations.json")


def pytest_collection_modifyitems(items):
  """Files go out in the order collected (pyproject: ``--dist loadfile
  --no-loadscope-reorder``), so the files that took longest in the recorded run go first and no
  long file is left for last on one worker. ``tests/durations.json`` is written by
  ``scripts/test_durations.py RUN.xml --record``; a file it lacks keeps its place after them."""
  try:
    seconds = json.loads(DURATIONS.read_text())
  except (OSError, ValueError):
    return
  items.sort(key=lambda item: -seconds.get(item.path.stem, 0.0))  # stable: a file stays whole


# --- where a test's time goes: JAX's own compile events, per test --------------------------------

_JAX_EVENTS = {
  "/jax/core/compile/backend_compile_duration": "xla_compile_s",
  "/jax/core/compile/jaxpr_trace_duration": "trace_s",
  "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
}
_spent = dict.fromkeys(_JAX_EVENTS.values(), 0.0) | {"xla_compiles": 0}


def _on_duration(event: str, seconds: float, **_) -> None:
  if (key := _JAX_EVENTS.get(event)) is not None:
    _spent[key] += seconds
    _spent["xla_compiles"] += key == "xla_compile_s"


monitoring.register_event_duration_secs_listener(_on_duration)
_SPENT_BEFORE = pytest.StashKey[dict]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
  item.stash[_SPENT_BEFORE] = dict(_spent)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  """Adds to the test's ``--junitxml`` record the seconds its process spent tracing, lowering
  and compiling, its markers, its xdist worker and when it ended (scripts/test_durations.py)."""
  if call.when == "teardown" and _SPENT_BEFORE in item.stash:
    before = item.stash[_SPENT_BEFORE]
    for key, value in _spent.items():
      item.user_properties.append((key, round(value - before[key], 3)))
    marks = sorted({m.name for m in item.iter_markers()} & {"slow", "real_model", "multiprocess"})
    item.user_properties.append(("marks", ",".join(marks)))
    item.user_properties.append(("worker", os.environ.get("PYTEST_XDIST_WORKER", "main")))
    item.user_properties.append(("ended", round(time.time(), 2)))
  yield


# --- compiled programs are dropped before they exhaust the process's memory maps -----------------

_MAX_REGIONS = 20_000  # a third of Linux's default vm.max_map_count (65,530)


@pytest.fixture(autouse=True)
def _drop_compiled_programs(request):
  """XLA's CPU backend maps each program's code in ~1,500-2,000 memory regions (a SmolLM2
  generate); kept for the whole suite they ran out and crashed the process. Programs are
  dropped past ``_MAX_REGIONS``, and after a test that monkeypatches (what it traced with a
  patched function must not serve a later test)."""
  yield
  try:
    with open("/proc/self/maps", "rb") as f:
      regions = sum(1 for _ in f)
  except OSError:  # not Linux
    regions = None
  if regions is None or regions > _MAX_REGIONS or "monkeypatch" in request.fixturenames:
    jax.clear_caches()


# --- shared models -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_pair():
  """Target and an independent draft, vocab 8: clearly different distributions."""
  return tiny.random_model(seed=0), tiny.random_model(seed=3)


@pytest.fixture(scope="session")
def small_target():
  """Vocab 64, 3 layers: long enough greedy runs to be non-trivial."""
  return tiny.random_model(seed=0, vocab_size=64, dim=32, num_layers=3)


@pytest.fixture
def _source_tree_kept():
  """The empty output directories ``build.check`` makes under experiments/ are removed again
  (the tree stays what git checked out); one such test at a time across workers (a lock)."""
  root, dirs = Path(__file__).resolve().parents[1] / "experiments", lambda: set(root.rglob("*/"))
  with open(Path(tempfile.gettempdir()) / "specjax-source-tree.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    before = dirs()
    yield
    for p in sorted(dirs() - before, key=lambda p: -len(p.parts)):  # the deepest first
      with contextlib.suppress(OSError):  # a directory something was written to stays
        p.rmdir()
