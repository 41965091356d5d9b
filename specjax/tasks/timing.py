"""Timing several decoding modes on the same batches, in one process, with progress shown.

Every mode runs once first (compile and warm-up; the user is told what is compiling), then
``repeats`` timed passes interleave the modes, so a change of machine load hits every mode
alike. Each mode's steady time is the median of its timed passes.
"""

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from tqdm.auto import tqdm


def run_modes(
  modes: dict[str, Callable[[Any], Any]],
  batches: Sequence[Any],
  repeats: int,
  describe: str = "",
) -> dict[str, dict]:
  """``{mode: {"outs": last pass's outputs per batch, "first_pass_s", "compile_s", "steady_s",
  "steady_all_s"}}``. ``describe`` (e.g. the model and batch size) is printed with each
  compile message."""
  if repeats < 1:
    raise ValueError(f"benchmark.repeats must be >= 1, got {repeats}.")
  out = {}
  for mode, fn in modes.items():
    tqdm.write(f"compiling {mode}{f' ({describe})' if describe else ''}, then a first pass ...")
    t0 = time.perf_counter()
    outs = [fn(b) for b in tqdm(batches, desc=f"{mode}: first pass", unit="batch", leave=False)]
    out[mode] = {"outs": outs, "first_pass_s": time.perf_counter() - t0, "steady_all_s": []}
    tqdm.write(f"  {mode}: first pass {out[mode]['first_pass_s']:.1f} s")
  total = repeats * len(modes) * len(batches)
  with tqdm(total=total, desc="timed passes", unit="batch", leave=False) as bar:
    for _ in range(repeats):
      for mode, fn in modes.items():
        t0 = time.perf_counter()
        outs = []
        for b in batches:
          outs.append(fn(b))
          bar.update()
        out[mode]["steady_all_s"].append(time.perf_counter() - t0)
        out[mode]["outs"] = outs
  for timing in out.values():
    timing["steady_s"] = statistics.median(timing["steady_all_s"])
    timing["compile_s"] = max(timing["first_pass_s"] - timing["steady_s"], 0.0)
  return out
