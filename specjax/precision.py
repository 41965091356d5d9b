"""``dtype = "measure"``: float32 or bfloat16 weights, chosen by timing this machine.

Whether bfloat16 pays on a CPU depends on the CPU: products of bfloat16 weights (accumulated in
float32) cost 0.66-0.97x the float32 ones for 2-16 rows on this project's 2-core AVX2 machine,
and less than one float32 row on another (experiments/verify_cost). So the choice is measured,
not read from the backend's name: the target's forward over T = 1, 2 and 8 tokens after
128 cached ones, in both dtypes, on the model's own shapes (its first ``LAYERS`` layers and its
head, constant weights: a product's time does not depend on the values). The dtypes alternate
round by round and each cell is the median of its rounds, so a slow spell of a shared machine
lands on both alike. bfloat16 is chosen only where it wins by ``MARGIN``:

* a speculative run (mostly verify forwards of several tokens): bfloat16's time over
  float32's, at the median of T > 1, at most ``MARGIN``, and one token (AR and abstaining
  steps) no more than ``1 / MARGIN`` slower;
* autoregression alone: one token at most ``MARGIN``.

What bfloat16 costs besides speed: a one-token forward (a matrix-vector product) and a T-token
verify (a matrix product) sum in different orders, and every layer's input is rounded to
bfloat16 again, so the two drift apart by a rounding here and there. Greedy speculative text
then differs from bfloat16 AR's at near-ties: on 10 of 12 prompt/drafter pairs of 64 tokens
here (experiments/verify_cost). Sampling stays exact for the verify forward's distribution.
``forward_rows`` (``decode.generate``) runs every forward at one shape, and then a chain's
bfloat16 greedy text equals AR's at the same ``forward_rows`` token for token, chains and
trees (each tree node reads its ancestors in AR's order), at the cost of AR steps as wide as
a verify. Hence ``measure`` is opt-in, never the default.

The choice and the ratios are printed, and kept per machine and model shape in
``$SPECJAX_CACHE/dtype.json`` (default ``~/.cache/specjax``), so later runs on the machine start
at once. On an accelerator ``measure`` is bfloat16 without timing, as ``auto`` is.
"""

import dataclasses
import json
import os
import platform
import statistics
from pathlib import Path

import jax
import jax.numpy as jnp

from specjax import results
from specjax.costmodel import llama_forward_seconds
from specjax.models import llama
from specjax.models.config import ModelConfig

SIZES = (1, 2, 8)  # tokens per timed forward
LAYERS = 2  # of the model's layers timed (with the head); the ratio is what is used
ROUNDS = 3  # alternations of the two dtypes; each times every size `REPEATS` times
REPEATS = 3
MARGIN = 0.9  # bfloat16 must cost at most this fraction of float32 to be chosen
CONTEXT = 128


def cache_path() -> Path:
  return Path(os.environ.get("SPECJAX_CACHE", "~/.cache/specjax")).expanduser() / "dtype.json"


def _cpu() -> str:
  try:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def key(cfg: ModelConfig) -> str:
  """The machine and the model's shapes: what the timings depend on."""
  shape = (cfg.vocab_size, cfg.dim, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads,
           cfg.head_dim, cfg.ffn_dim, cfg.tie_embeddings)  # fmt: skip
  return f"{_cpu()} x{os.cpu_count()} | jax {jax.__version__} | {shape}"


def decide(ratios: dict[int, float], speculative: bool) -> str:
  """``bfloat16`` or ``float32`` from ``{T: bfloat16 seconds / float32 seconds}``."""
  if not speculative:
    return "bfloat16" if ratios[1] <= MARGIN else "float32"
  wide = statistics.median(r for t, r in ratios.items() if t > 1)
  return "bfloat16" if wide <= MARGIN and ratios[1] <= 1 / MARGIN else "float32"


def ratios(cfg: ModelConfig) -> dict[int, float]:
  """``{T: bfloat16 / float32 seconds}`` of the forward over T tokens, timed here."""
  small = dataclasses.replace(cfg, num_layers=min(cfg.num_layers, LAYERS))
  shapes = llama.param_shapes(small)
  params = {d: jax.tree.map(lambda s, d=d: jnp.full(s.shape, 0.01, d), shapes)
            for d in (jnp.float32, jnp.bfloat16)}  # fmt: skip
  cells = {d: {t: [] for t in SIZES} for d in params}
  for _ in range(ROUNDS):
    for d, p in params.items():
      got = llama_forward_seconds(p, small, SIZES, CONTEXT, REPEATS)["causal"]
      for t in SIZES:
        cells[d][t].append(got[t])
  f32, bf16 = (cells[d] for d in params)
  return {t: statistics.median(bf16[t]) / statistics.median(f32[t]) for t in SIZES}


_CHOSEN: dict[tuple, str] = {}


def choose(cfg: ModelConfig, speculative: bool) -> str:
  """The dtype for ``cfg`` on this machine: measured once per machine and model shape, then
  read from the cache; printed with its reason the first time a process asks."""
  if jax.default_backend() != "cpu":
    return "bfloat16"
  k = key(cfg)
  if (k, speculative) in _CHOSEN:
    return _CHOSEN[k, speculative]
  path = cache_path()
  try:
    known = json.loads(path.read_text()) if path.is_file() else {}
  except (OSError, ValueError):
    known = {}  # an unreadable cache is measured again and rewritten
  where = f"cached in {path}"
  if k not in known or set(map(int, known[k])) != set(SIZES):
    print(f"dtype measure: timing {cfg.name}'s forward in float32 and bfloat16 (10-30 s "
          "once per machine and model)...", flush=True)  # fmt: skip
    known[k] = {str(t): r for t, r in ratios(cfg).items()}
    try:
      results.write_json(path, known)
    except OSError as e:
      where = f"not cached: {e}"
  got = {int(t): r for t, r in known[k].items()}
  choice = decide(got, speculative)
  shown = ", ".join(f"T={t}: {r:.2f}" for t, r in sorted(got.items()))
  run = "a speculative run" if speculative else "autoregression"
  print(f"dtype measure: {choice} for {run} (bfloat16 / float32 forward time here, {shown}; "
        f"bfloat16 needs <= {MARGIN}; {where})", flush=True)  # fmt: skip
  _CHOSEN[k, speculative] = choice
  return choice
