"""What a decoding step costs on a device, and the speedup a drafter's τ is worth there.

A step of speculative decoding is a fixed list of forwards (static shapes: the same whatever
is accepted), ``step_work(drafter)``: e.g. a draft-model chain of K is the draft over 2 tokens,
K - 1 draft forwards over 1, and the target over K + 1. A ``Profile`` prices a forward of each
model over T tokens, plus a fixed per-step overhead (sampling, verification, bookkeeping), so

    predicted speedup = τ x step_seconds(AR) / step_seconds(drafter)

Two kinds of profile:

- ``measure`` (this machine): each forward timed on its own, jitted, batch 1, after a context
  of ``context`` cached tokens, as verification runs it (the cache read-only, its slots those
  of the decode). A drafter whose nodes form a tree (Medusa, EAGLE, branched lookup) is
  verified under a tree mask, which is data, not the causal mask XLA folds into the program:
  that forward (``target_tree``) is timed apart. For the target the cost of T tokens is the
  cheaper of one forward over T and T one-token forwards (a GEMM over T rows vs T
  matrix-vector products). Medusa and prompt lookup are timed as their whole ``propose``. The
  overhead is one AR step measured in decoding minus one target forward. A run at
  ``forward_rows`` (greedy bfloat16 on a CPU, so its text equals AR's at those rows) runs
  every target forward of a speculative step at its rows in one shape, steps with nothing to
  verify too: ``target_rows``, timed so; the speedup stays over one-row AR.
- ``roofline`` (a named chip, no measurement): a forward over T tokens reads the weights and
  the KV cache once and does 2 x params x T flops, so it takes max(bytes / bandwidth,
  flops / peak). Chips: ``CHIPS``, from their vendors' data sheets (bf16 dense peak, HBM
  bandwidth). It leaves out kernel-launch and host overhead, which dominate for small models
  on a GPU: the roofline is an upper bound on the speedup there.
"""

import dataclasses
import time
from collections.abc import Callable

import numpy as np

from specjax.drafters import family
from specjax.drafters.base import Forward, llama_sizes
from specjax.drafters.timing import llama_forward_seconds
from specjax.models.config import ModelConfig

# name: (HBM bytes/s, bf16 dense FLOP/s, source)
CHIPS = {
  "H100-SXM": (3.35e12, 989e12, "NVIDIA H100 data sheet (SXM5: 3.35 TB/s, 989 TFLOPS bf16 dense)"),
  "H200": (4.8e12, 989e12, "NVIDIA H200 data sheet (SXM: 4.8 TB/s, 989 TFLOPS bf16 dense)"),
  "TPU-v5e": (819e9, 197e12, "Google Cloud TPU v5e documentation (819 GB/s, 197 TFLOPS bf16)"),
  "TPU-v5p": (2765e9, 459e12, "Google Cloud TPU v5p documentation (2,765 GB/s, 459 TFLOPS bf16)"),
}


def verifies_tree(drafter) -> bool:
  """Whether ``drafter``'s drafts carry ``parents`` (verified under a tree mask)."""
  return drafter is not None and drafter.verifies_tree


def step_work(drafter) -> tuple[Forward, ...]:
  """The forwards of one decoding step with ``drafter`` (None: autoregressive), as its family
  record's ``price`` lists them."""
  if drafter is None:
    return (Forward("target", 1),)
  return family.of(drafter).need("price").forwards(drafter)


@dataclasses.dataclass(frozen=True)
class Profile:
  """Seconds per forward (``cost(model, tokens)``) and per step beyond forwards."""

  name: str
  cost: Callable[[str, int], float]
  overhead: float
  source: str

  def step_seconds(self, drafter, rows: int = 0) -> float:
    """One step with ``drafter`` (None: AR). ``rows`` > 0: every target forward runs at that
    many rows in one shape (``forward_rows``), priced as ``target_rows``."""

    def price(f: Forward) -> float:
      if rows and f.model.startswith("target"):
        return self.cost(ROWS_PART, rows)
      return self.cost(f.model, f.tokens)

    return self.overhead + sum(price(f) for f in step_work(drafter))

  def speedup(self, drafter, tau: float, abstained: float = 0.0, rows: int = 0) -> float:
    """τ x (one one-row AR step) / (the mean step with ``drafter``), where a fraction
    ``abstained`` of the steps had nothing to verify: a one-token forward, or with ``rows``
    the target's forward at those rows all the same."""
    ar = self.step_seconds(None)
    idle = (self.overhead + self.cost(ROWS_PART, rows)) if rows else ar
    return tau * ar / (abstained * idle + (1 - abstained) * self.step_seconds(drafter, rows))


# --- roofline ---------------------------------------------------------------------------------


def model_sizes(target_cfg: ModelConfig, drafter, dparams) -> dict[str, tuple[int, int]]:
  """Per model of a step: (parameters read, KV bytes per cached token)."""
  out = {"target": llama_sizes(target_cfg)}
  out["target_tree"] = out["target"]
  return out | ({} if drafter is None else family.of(drafter).need("price").sizes(drafter, dparams))


def roofline(chip: str, sizes: dict[str, tuple[int, int]], context: int = 256) -> Profile:
  """A named chip's profile from bandwidth and peak flops (bf16 weights and caches)."""
  if chip not in CHIPS:
    raise ValueError(f"unknown chip {chip!r}; known: {', '.join(CHIPS)}.")
  bandwidth, flops, source = CHIPS[chip]

  def cost(model: str, tokens: int) -> float:
    params, kv_per_token = sizes[model]
    bytes_read = 2 * params + kv_per_token * (context + tokens)
    return max(bytes_read / bandwidth, 2 * params * tokens / flops)

  return Profile(chip, cost, 0.0, source)


# --- measured ---------------------------------------------------------------------------------


TARGET_PARTS = {"causal": "target", "tree": "target_tree"}  # mask -> step_work's model name
ROWS_PART = "target_rows"  # the target's forward at a run's ``forward_rows`` (one shape)


def target_seconds(
  target, sizes, context: int, num_slots: int, repeats: int, masks=("causal", "tree")
) -> dict:
  """``{"target": {T: s}, "target_tree": {T: s}}``: the target's verify forwards, timed under
  each of ``masks``. ``"target"`` always holds T = 1 (an AR step: one token, no tree)."""
  by_mask = llama_forward_seconds(target.params, target.cfg, sorted(sizes), context, repeats,
                                  num_slots, tuple(masks))  # fmt: skip
  out = {TARGET_PARTS[m]: by_mask[m] for m in masks}
  out.setdefault("target", {1: by_mask[masks[0]][1]})
  return out


def rows_seconds(target, rows, context: int, max_len: int, repeats: int) -> dict:
  """``{"target_rows": {R: s}}``: the target's forward at each of ``rows`` as ``forward_rows``
  runs every forward of a speculative step (one attention sum over all the decode's
  ``max_len + R`` slots, path order), for ``Profile.speedup(..., rows=R)``; empty when no run
  forwards at fixed rows."""
  one = lambda r: llama_forward_seconds(target.params, target.cfg, [r], context, repeats,  # noqa: E731
                                        max_len + r, ("one_shape",))["one_shape"][r]  # fmt: skip
  return {ROWS_PART: {r: one(r) for r in sorted(rows)}} if rows else {}


def drafter_seconds(
  drafter, dparams, target_cfg: ModelConfig, context: int, repeats: int = 9, also=()
):
  """``{model: {T: seconds}}`` for the drafter's own forwards in ``step_work``, and those of
  the drafters ``also`` (the same weights in other shapes, e.g. EAGLE at other budgets with
  the same ``top_k``), each timed by its family record's ``price.timers``."""
  models = {}
  for f in (f for d in (drafter, *also) for f in step_work(d)):
    if not f.model.startswith("target"):
      models.setdefault(f.model, set()).add(f.tokens)
  timers = family.of(drafter).need("price").timers
  missing = sorted(set(models) - set(timers))
  if missing:
    raise ValueError(
      f"drafter {drafter.name!r} runs forwards {missing} that its family record's price.timers "
      "cannot time: give each a timer."
    )
  return {m: timers[m](drafter, dparams, target_cfg, context, sorted(n), repeats)
          for m, n in models.items()}  # fmt: skip


def measured(name: str, target_parts: dict, drafter_parts: dict, overhead: float) -> Profile:
  """A profile from timed forwards, ``{model: {T: seconds}}`` (interpolated in T); for the
  target (``target``, ``target_tree``), the cheaper of one forward over T and T one-token
  forwards."""
  tables = target_parts | drafter_parts

  def cost(model: str, tokens: int) -> float:
    table = tables[model]
    xs = sorted(table)
    t = float(np.interp(tokens, xs, [table[x] for x in xs]))
    return min(t, tokens * table[xs[0]]) if model in TARGET_PARTS.values() and xs[0] == 1 else t

  return Profile(name, cost, overhead, "timed on this machine (batch 1, jitted, median)")


# --- "auto": a drafter's budget for this machine --------------------------------------------------


def _context(config) -> int:
  return min(128, config.max_len // 2)


def _machine_target(config, target, sizes, repeats: int, options, rows=()) -> tuple[dict, float]:
  """The target's forwards over ``sizes`` tokens timed here (``target_seconds``), under the
  masks the drafters ``options`` verify with (a chain's causal one, a tree's), or with
  ``rows`` (``forward_rows`` of the options) at those rows in one shape, beside the one-row
  AR step; and the decode loop's per-step overhead beyond one forward."""
  context = _context(config)
  slots = config.max_len + max(sizes)
  masks = tuple(sorted({"tree" if verifies_tree(d) else "causal" for d in options}))
  target_s = target_seconds(target, {1} if rows else {1, *sizes}, context, slots, repeats, masks)
  target_s |= rows_seconds(target, rows, context, config.max_len, repeats)
  step = ar_step_seconds(config, target, context)
  return target_s, max(step - target_s["target"][1], 0.0)


def ar_step_seconds(config, target, context: int) -> float:
  """One AR step of the decode loop after ``context`` cached tokens: decodes of s and 2s
  tokens, the difference over s (their prefills cancel)."""
  from specjax.decode import generate

  prompt, s = [[1] * context], max(1, min(16, (config.max_len - context) // 2))

  def decode_seconds(n: int) -> float:
    t0 = time.perf_counter()
    generate(target.params, target.cfg, prompt, max_new_tokens=n, max_len=config.max_len)
    return time.perf_counter() - t0

  decode_seconds(s)  # compile (the budget is traced: one program for both)
  return (decode_seconds(2 * s) - decode_seconds(s)) / s


def auto(config, target, drafter, dparams, repeats: int = 5, forward_rows=lambda d: 0):
  """The drafter at the setting of its family's ``tune`` grid (read from ``auto_from``) whose
  predicted speedup over one-row AR is best on this machine: τ from the offline replay there,
  step costs from the target's and the drafter's forwards timed here; ``forward_rows(d)``:
  the rows every target forward of option ``d`` runs at (``build.forward_rows``; 0: its own),
  timed so. Prints the best three and the choice."""
  tune = family.of(drafter).need("tune")
  head = f"{drafter.name} {tune.field}=auto"
  grid = tune.grid(config, target.cfg.name)
  options = [tune.apply(drafter, g) for g in grid]
  verify = sorted({f.tokens for d in options for f in step_work(d) if f.model.startswith("target")})
  sizes = tune.timed(verify)
  rows = [forward_rows(d) for d in options]
  fits = [i for i, (d, r) in enumerate(zip(options, rows, strict=True))
          if not r or d.num_nodes + d.num_extra + 1 <= r]  # fmt: skip
  if not fits:
    raise ValueError(
      f"{head}: config.forward_rows={max(rows)} is fewer rows than any setting of the grid "
      "verifies: raise it, or set it to 'auto'."
    )
  grid, options, rows = ([x[i] for i in fits] for x in (grid, options, rows))
  shape = f"{sorted(set(rows))} rows in one shape" if any(rows) else f"{sizes} tokens"
  print(f"{head}: timing {len(grid)} settings' forwards here (the target over {shape}) ...")
  target_s, overhead = _machine_target(config, target, sizes, repeats, options,
                                       sorted(set(rows) - {0}))  # fmt: skip
  groups = {}
  for d in options:
    groups.setdefault(tune.group(d), []).append(d)
  profiles = {
    key: measured("this machine", target_s,
                  drafter_seconds(ds[0], dparams, target.cfg, _context(config), repeats, ds[1:]),
                  overhead)
    for key, ds in groups.items()
  }  # fmt: skip
  speed = [profiles[tune.group(d)].speedup(d, g["tau"], g.get("abstained", 0.0), r)
           for d, g, r in zip(options, grid, rows, strict=True)]  # fmt: skip
  order = sorted(range(len(grid)), key=lambda i: (speed[i], tune.prefer(grid[i])), reverse=True)
  table = ", ".join(f"{tune.label(grid[i])}: τ {grid[i]['tau']:.2f} → {speed[i]:.2f}x"
                    for i in order[:3])  # fmt: skip
  best = order[0]
  print(f"{head} (best of {len(grid)}, greedy τ): {table}; chose {tune.label(grid[best])}")
  if speed[best] < 1:
    print(f"{head}: every setting is predicted slower than AR on this machine.")
  return options[best]
