"""Shared fixtures (tiny random models, compiled once per session) and the test environment.

Tests see one CPU device unless a test asks for more in a subprocess. XLA compiles without
its backend optimisation and with its classic emitters (flags that tests/train_worker.py passes
on to the processes it starts), and torch (the HF oracle) runs one thread per worker.
Compiled programs go to a persistent XLA cache under ``.pytest_cache/xla`` (override with
JAX_COMPILATION_CACHE_DIR): a program compiled again (after a test that monkeypatches, or on the
other worker) is read from it, and a second run of the suite skips most compiles. The
subprocesses a test starts (CLI runs, multi-process workers) share a cache of their own, one per
worker for the session (tests/train_worker.py).
"""

import functools
import math
import os
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault(
  "JAX_COMPILATION_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".pytest_cache" / "xla")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# XLA's backend (LLVM) optimisation is most of a compile here, and tests compile far more than
# they run: without it a compile-bound test took 0.6x the time, and a real-model decode test
# 0.9x (cold cache, measured). XLA's MLIR fusion emitters compile each of a program's ~600
# fusions through its own pass pipeline; the classic emitters compile a tiny model's decode loop
# in 0.65x the time (test_decode + test_medusa, cold: 171 s -> 117 s wall), though a SmolLM2
# program in 1.4x. The suite passes either way. Benchmarks and experiments run outside the
# tests, with XLA's defaults.
# LLVM code generation runs unsplit: XLA splits a module to compile its parts on several
# threads, but the xdist workers already fill the cores, so the split is only more work (the
# carried-state exact-distribution tests, cold: 115.8 -> 110.5 s of CPU).
# tests/train_worker.py passes these flags on to the processes it starts.
os.environ.setdefault(
  "XLA_FLAGS",
  "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
  " --xla_cpu_parallel_codegen_split_count=1",
)
# One intra-op thread for torch (the HF oracle): the xdist workers already fill the cores, and
# torch's threads spinning on a busy core made HF generate ~4x slower here (measured).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import jax  # noqa: E402
import pytest  # noqa: E402
import train_worker  # noqa: E402
from jax import monitoring  # noqa: E402

from specjax.models import registry, tiny  # noqa: E402
from specjax.models.tokenizer import Tokenizer  # noqa: E402

# --- Python's cyclic garbage collector, tuned for a process that compiles (train_worker.py) ------


def pytest_collection_finish(session):
  train_worker.collect_less()


# --- whole files over the xdist workers, longest first ------------------------------------------

# xdist's loadfile hands out files with the most tests first, which left a file of few, long
# tests (test_real_models: 8 tests, ~180 s) for last on one worker while the other ran out of
# work (runs 33-34: 16-17 s apart). Files go out longest first instead (pyproject's
# --no-loadscope-reorder keeps this order): the files of 20 s or more, by their worker seconds
# in run 34 (docs/testing.md; scripts/test_durations.py prints them), then the rest, each under
# 15 s, in collection order. Replayed on runs 32-34, the workers end within 1 s of each other.
_LONGEST_FILES_FIRST = (
  "test_lossless", "test_real_models", "test_eagle", "test_sharded_decode", "test_peers",
  "test_run", "test_simulate", "test_checkpoint", "test_trees", "test_train", "test_decode",
  "test_medusa", "test_train_multiprocess", "test_interop_eagle", "test_distill",
  "test_data_files", "test_families", "test_prompt_lookup",
)  # fmt: skip


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(_LONGEST_FILES_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: each file's order


# --- where a test's time goes: JAX's own compile events, per test ------------------------------

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
  """Adds to the test's report (and so to ``--junitxml``) the seconds this process spent
  tracing, lowering and XLA-compiling over its setup, call and teardown: what
  ``scripts/test_durations.py`` groups by cause. A test's subprocesses are not counted here."""
  if call.when == "teardown" and _SPENT_BEFORE in item.stash:
    before = item.stash[_SPENT_BEFORE]
    for key, value in _spent.items():
      item.user_properties.append((key, round(value - before[key], 3)))
    marks = sorted({m.name for m in item.iter_markers()} & {"slow", "real_model", "multiprocess"})
    item.user_properties.append(("marks", ",".join(marks)))
    # which xdist worker ran it, and when it ended: the workers' balance (test_durations.py)
    item.user_properties.append(("worker", os.environ.get("PYTEST_XDIST_WORKER", "main")))
    item.user_properties.append(("ended", round(time.time(), 2)))
  yield


# --- large programs compile with XLA's fusion emitters -------------------------------------------

# The classic emitters (XLA_FLAGS above) compile a tiny model's program in 0.65x the time, but a
# real model's in 1.5-1.7x: a SmolLM2 AR loop took 9.2 s against 6.0 s, a prompt-lookup loop
# 15.2 s against 8.9 s (cold, one process; what each computes, and its run time, unchanged).
# So a program whose arguments hold at least this many bytes (real weights: SmolLM2's are
# ~540 MB; a tiny model's well under 1 MB) compiles with the fusion emitters. The option is
# part of the compile options, so the persistent cache keys the two kinds apart.
_LARGE_PROGRAM_BYTES = 32 << 20


def _argument_bytes(module) -> int:
  from jax._src.lib.mlir import ir

  total = 0
  for op in module.body.operations:
    if ir.StringAttr(op.attributes["sym_name"]).value != "main":
      continue
    for t in ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value).inputs:
      if isinstance(t, ir.RankedTensorType) and t.has_static_shape:
        width = getattr(t.element_type, "width", 32)  # float and integer types have one
        total += math.prod(t.shape) * max(width, 8) // 8
  return total


def _fusion_emitters_for_large_programs() -> None:
  """Wraps JAX's compile entry point (jax._src.compiler, pinned by pyproject's jax range); if
  it moves, programs compile as the flags above say, which is slower, not different."""
  try:
    from jax._src import compiler
  except ImportError:
    return
  plain = getattr(compiler, "compile_or_get_cached", None)
  if plain is None:
    return

  @functools.wraps(plain)
  def compile_or_get_cached(backend, computation, devices, compile_options, *args, **kwargs):
    try:
      if _argument_bytes(computation) >= _LARGE_PROGRAM_BYTES:
        overrides = dict(compile_options.env_option_overrides)
        overrides["xla_cpu_use_fusion_emitters"] = True
        compile_options.env_option_overrides = list(overrides.items())
    except Exception:  # noqa: BLE001 (a module this cannot read compiles as the flags say)
      pass
    return plain(backend, computation, devices, compile_options, *args, **kwargs)

  compiler.compile_or_get_cached = compile_or_get_cached


_fusion_emitters_for_large_programs()


# Linux's default vm.max_map_count is 65,530 regions per process. Programs are dropped past a
# third of it, checked after every test, so one more test (no test file has come near the
# other two thirds) stays under the limit.
_MAX_REGIONS = 20_000


def _mapped_regions() -> int | None:
  try:
    with open("/proc/self/maps", "rb") as f:
      return sum(1 for _ in f)
  except OSError:  # not Linux: clear every time
    return None


@pytest.fixture(autouse=True)
def _drop_compiled_programs(request):
  """Frees every compiled program once the process maps many memory regions.

  XLA's CPU backend maps each program's machine code in ~1,500-2,000 memory regions (a SmolLM2
  generate), and Linux allows 65,530 per process (vm.max_map_count): kept for the whole suite,
  they ran out and the process crashed inside XLA. Clearing after every test file instead cost
  the next file its traces and small compiles again (the persistent cache keeps compiles
  only), so programs are dropped only past ``_MAX_REGIONS``, and after any test that
  monkeypatches (what it traced with a patched function must not serve a later test)."""
  yield
  regions = _mapped_regions()
  if regions is None or regions > _MAX_REGIONS or "monkeypatch" in request.fixturenames:
    jax.clear_caches()


@pytest.fixture(autouse=True, scope="session")
def _one_real_model_load_per_worker():
  """``registry.load`` keeps the last model it loaded: the test files and the tasks they run
  (peers, distill, device_bench, the committed drafters) share one SmolLM2 parse per worker
  instead of one each (4-5 s apiece here). One model at most, so a worker holds no more than
  the largest one. What loading returns is still checked: test_checkpoint.py compares it with
  HF transformers' own reading of the same file."""
  load = registry.load
  registry.load = functools.lru_cache(maxsize=1)(load)
  yield
  registry.load = load


def _per_file(load, most: int):
  """``load(path, *rest)`` kept per file (same real path, size and mtime) and ``rest``, the
  ``most`` most recently used; a path that cannot be stat'ed is loaded every time, so it raises
  its own error."""
  kept = {}

  def cached(path, *rest):
    try:
      stat = os.stat(path)
    except (OSError, TypeError, ValueError):
      return load(path, *rest)
    key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns, *rest)
    if key not in kept:
      value = load(path, *rest)
      if len(kept) == most:
        kept.pop(next(iter(kept)))
    else:
      value = kept.pop(key)  # the least recently used goes first
    kept[key] = value
    return value

  return cached


@pytest.fixture(autouse=True, scope="session")
def _one_tokenizer_parse_per_file():
  """``Tokenizer.from_gguf`` of a path builds the BPE from the file's whole vocabulary and
  merges (1.5-2 s for SmolLM2, 3-4 s for Qwen here, with the parse), and tests of several files
  ask for the same one: one tokenizer per file serves a worker. A tokenizer is never changed
  after it is built (nothing in specjax or the tests assigns to one). Readers go through."""
  plain = Tokenizer.from_gguf.__func__
  built = _per_file(lambda path: plain(Tokenizer, path), 4)

  def from_gguf(cls, path_or_reader):
    if cls is Tokenizer and isinstance(path_or_reader, str | os.PathLike):
      return built(path_or_reader)
    return plain(cls, path_or_reader)

  Tokenizer.from_gguf = classmethod(from_gguf)
  yield
  Tokenizer.from_gguf = classmethod(plain)


@pytest.fixture(autouse=True, scope="session")
def _one_gguf_parse_per_file():
  """Every GGUF read parses the whole vocabulary and merges in Python: ~2 s for SmolLM2, ~6 s
  for Qwen2.5-Coder's 151,936 tokens here. specjax reads a file for a config check, its
  weights and its tokenizer (``checkpoint.open_gguf``), and HF transformers (the oracle) builds
  a ``gguf.GGUFReader`` for the config and another for the weights of each model it loads, and
  many tests read the same few files. Here one reader per file (same path, size and mtime; the
  four most recently used) serves specjax and HF alike; what each does with it is unchanged. A
  reader only reads. Files that fail to open go through every time, and raise their own errors.

  HF also builds gguf's tensor-name table (``gguf.get_tensor_name_map``) once per module of the
  model it loads, ~400 times for SmolLM2 at ~0.03 s each: one table per (architecture, layer
  count) serves them (10-14 s less per HF load here; the loaded weights are bit-identical).

  The shared reader is specjax's own (``checkpoint._reader_class``), which parses over a plain
  array view of the file's memory map rather than an ``np.memmap``: gguf slices it ~1.5 million
  times for Qwen's vocabulary, and every memmap slice runs Python-level bookkeeping (a Qwen
  parse took 6.1 s against gguf's own reader's 10.2 s, every field and tensor equal). HF reads
  through it as through gguf's."""
  import gguf

  from specjax.models import checkpoint

  plain = gguf.GGUFReader
  name_map = gguf.get_tensor_name_map
  gguf.get_tensor_name_map = functools.lru_cache(maxsize=8)(name_map)
  reader_class = checkpoint._reader_class
  specjax_reader = reader_class()  # a subclass of gguf's own reader, made before it is replaced

  def parse(path, mode):
    reader = specjax_reader.__new__(SharedReader)
    specjax_reader.__init__(reader, path, mode)
    return reader

  shared = _per_file(parse, 4)

  class SharedReader(specjax_reader):
    """``SharedReader(path)``: the one reader of ``path``, parsed by specjax's reader class
    (so it is also a reader of gguf's class, as HF and specjax check); a subclass constructs
    as gguf's reader does."""

    def __new__(cls, path, mode="r"):
      if cls is not SharedReader:
        return super().__new__(cls)
      return shared(path, mode)

    def __init__(self, path, mode="r"):
      if type(self) is not SharedReader:  # the shared reader is initialised once, by parse
        super().__init__(path, mode)

  gguf.GGUFReader = SharedReader
  checkpoint._reader_class = lambda: SharedReader  # open_gguf checks each file's tensors
  open_gguf = checkpoint.open_gguf
  checkpoint.open_gguf = _per_file(open_gguf, 4)  # and its checked reader is kept
  yield
  checkpoint.open_gguf = open_gguf
  checkpoint._reader_class = reader_class
  gguf.GGUFReader = plain
  gguf.get_tensor_name_map = name_map


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
