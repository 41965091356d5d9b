"""``dtype = "auto"`` on a CPU: float32 or bfloat16 weights, chosen by timing this machine.

Whether bfloat16 pays on a CPU depends on the CPU: products of bfloat16 weights (accumulated in
float32) cost 0.66-0.97x the float32 ones for 2-16 rows on an AVX2-only EPYC, less than one
float32 row on a Xeon with AMX-BF16 (experiments/verify_cost). So the choice is measured, not
read from the backend's name: the target's forward over T = 1, 2 and 8 tokens after 128 cached
ones, in both dtypes, on the model's own shapes (every layer and the head, constant weights: a
product's time does not depend on the values), and bfloat16's 8 rows as ``forward_rows`` runs
them (one attention sum over every slot of the cache). The dtypes alternate round by round
and each cell is the median of its rounds, so a slow spell of a shared machine lands on both
alike. bfloat16 is chosen only where it wins by ``MARGIN``:

* a greedy speculative run (on a CPU in bfloat16 every forward runs at the drafter's rows, see
  below): bfloat16's one-shape 8-row forward over float32's 8-row verify at most ``MARGIN``;
* a sampled speculative run (mostly verify forwards of several tokens): bfloat16's time over
  float32's, at the median of T > 1, at most ``MARGIN``, and one token (AR and abstaining
  steps) no more than ``1 / MARGIN`` slower;
* autoregression alone: one token at most ``MARGIN``.

A drafter that often abstains (prompt lookup) runs its abstaining steps at its rows too in a
greedy bfloat16 run, which the rule does not weigh: the benchmark's one-row AR beside it shows
what that costs.

What bfloat16 costs besides speed: a one-token forward (a matrix-vector product) and a T-token
verify (a matrix product) sum in different orders, and every layer's input is rounded to
bfloat16 again, so the two drift apart by a rounding here and there, and greedy speculative
text would leave bfloat16 AR's at near-ties (10 of 12 prompt/drafter pairs of 64 tokens:
experiments/verify_cost). Hence ``forward_rows = "auto"`` (``build.forward_rows``): a greedy
speculative run in bfloat16 on a CPU runs every forward at the drafter's rows per step, and
its text equals AR's at those rows token for token, chains and trees (``decode.generate``).
Sampling is exact for the verify forward's distribution either way.

The choice and the ratios are printed, and kept per machine and model shape in
``$SPECJAX_CACHE/dtype.json`` (default ``~/.cache/specjax``), so later runs on the machine start
at once. ``$SPECJAX_CPU_DTYPE`` (float32 or bfloat16) pins the CPU's choice without timing (the
test suite pins float32, so its results do not depend on the host). On an accelerator ``auto``
is bfloat16 without timing. ``dtype = "measure"`` is the same as ``auto`` (the name of this
choice before it was the default).
"""

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
ONE_SHAPE = "8_one_shape"  # the 8-row forward as forward_rows runs it (every slot, path order)
CELLS = (*map(str, SIZES), ONE_SHAPE)  # the ratios measured: bfloat16 time / float32 time
ROUNDS = 3  # alternations of the two dtypes; each times every size `REPEATS` times
REPEATS = 3
MARGIN = 0.9  # bfloat16 must cost at most this fraction of float32 to be chosen
CONTEXT = 128  # cached tokens before the timed ones
SLOTS = 512  # the cache's slots (what a one-shape forward reads)


PIN = "SPECJAX_CPU_DTYPE"  # float32 | bfloat16: the CPU's choice, without timing
PINNABLE = ("float32", "bfloat16")


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


def decide(ratios: dict[str, float], speculative: bool, greedy: bool = False) -> str:
  """``bfloat16`` or ``float32`` from ``{cell: bfloat16 seconds / float32 seconds}``
  (``CELLS``). A greedy speculative run in bfloat16 runs at one shape (``forward_rows``), so
  its verify is the one-shape forward, weighed against float32's verify of as many rows."""
  if not speculative:
    return "bfloat16" if ratios["1"] <= MARGIN else "float32"
  if greedy:
    return "bfloat16" if ratios[ONE_SHAPE] <= MARGIN else "float32"
  wide = statistics.median(r for t, r in ratios.items() if t in CELLS[1 : len(SIZES)])
  return "bfloat16" if wide <= MARGIN and ratios["1"] <= 1 / MARGIN else "float32"


def ratios(cfg: ModelConfig) -> dict[str, float]:
  """``{cell: bfloat16 / float32 seconds}`` of the target's forward over T tokens after
  ``CONTEXT`` cached ones (every layer and the head, constant weights), timed here; the
  one-shape cell is bfloat16's 8 rows as ``forward_rows`` runs them over float32's 8 rows as
  a verify runs them."""
  shapes = llama.param_shapes(cfg)
  params = {d: jax.tree.map(lambda s, d=d: jnp.full(s.shape, 0.01, d), shapes)
            for d in (jnp.float32, jnp.bfloat16)}  # fmt: skip
  cells = {d: {c: [] for c in CELLS} for d in params}
  for _ in range(ROUNDS):
    for d, p in params.items():
      got = llama_forward_seconds(p, cfg, SIZES, CONTEXT, REPEATS, SLOTS)["causal"]
      for t in SIZES:
        cells[d][str(t)].append(got[t])
      if d == jnp.bfloat16:  # the 8 rows as forward_rows runs them
        wide = (SIZES[-1],)
        got = llama_forward_seconds(p, cfg, wide, CONTEXT, REPEATS, SLOTS, ("one_shape",))
        cells[d][ONE_SHAPE].append(got["one_shape"][SIZES[-1]])
  f32, bf16 = (cells[d] for d in params)
  f32[ONE_SHAPE] = f32[str(SIZES[-1])]
  return {c: statistics.median(bf16[c]) / statistics.median(f32[c]) for c in CELLS}


_CHOSEN: dict[tuple, dict] = {}


def pinned() -> str | None:
  """``$SPECJAX_CPU_DTYPE`` when set (a value other than float32 or bfloat16 is one error)."""
  value = os.environ.get(PIN, "")
  if value and value not in PINNABLE:
    raise ValueError(f"${PIN}={value!r}: set it to float32 or bfloat16, or unset it to measure.")
  return value or None


def choose(cfg: ModelConfig, speculative: bool, greedy: bool = False) -> str:
  """The dtype for ``cfg`` on this machine: measured once per machine and model shape, then
  read from the cache; printed with its reason the first time a process asks."""
  return choice(cfg, speculative, greedy)["dtype"]


def choice(cfg: ModelConfig, speculative: bool, greedy: bool = False) -> dict:
  """``{"dtype", "how", "ratios"}``: the dtype ``choose`` returns, how it was chosen
  (accelerator, pinned, measured or cached) and the measured bfloat16 / float32 forward time
  ratios per token count (empty when nothing was timed). Benchmarks record it."""
  if jax.default_backend() != "cpu":
    return {"dtype": "bfloat16", "how": f"{jax.default_backend()}: bfloat16", "ratios": {}}
  if pin := pinned():
    return {"dtype": pin, "how": f"pinned by ${PIN}", "ratios": {}}
  k = key(cfg)
  if (k, speculative, greedy) in _CHOSEN:
    return _CHOSEN[k, speculative, greedy]
  path = cache_path()
  try:
    known = json.loads(path.read_text()) if path.is_file() else {}
  except (OSError, ValueError):
    known = {}  # an unreadable cache is measured again and rewritten
  how = f"measured, cached in {path}"
  if k not in known or set(known[k]) != set(CELLS):
    print(f"dtype auto: timing {cfg.name}'s forward in float32 and bfloat16 (up to a minute "
          "once per machine and model)...", flush=True)  # fmt: skip
    known[k] = ratios(cfg)
    try:
      results.write_json(path, known)
    except OSError as e:
      how = f"measured, not cached: {e}"
  got = {c: known[k][c] for c in CELLS}
  chosen = decide(got, speculative, greedy)
  label = {ONE_SHAPE: f"T={SIZES[-1]} at one shape"}
  shown = ", ".join(f"{label.get(c, f'T={c}')}: {r:.2f}" for c, r in got.items())
  run = ("a greedy speculative run (bfloat16's at one shape)" if greedy and speculative
         else "a speculative run" if speculative else "autoregression")  # fmt: skip
  print(f"dtype auto: {chosen} for {run} (bfloat16 / float32 forward time here, {shown}; "
        f"bfloat16 needs <= {MARGIN}; {how})", flush=True)  # fmt: skip
  _CHOSEN[k, speculative, greedy] = {"dtype": chosen, "how": how, "ratios": got}
  return _CHOSEN[k, speculative, greedy]
