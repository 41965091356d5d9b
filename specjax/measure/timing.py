"""Timing several decoding modes on the same batches, in one process, with progress shown.

Every mode runs once first (compile and warm-up; the user is told what is compiling), then
``repeats`` timed passes interleave the modes batch by batch: every mode decodes batch 1, then
every mode batch 2, and so on, with the order rotated per batch so that no mode always runs
first. On a machine whose speed drifts (other tenants, throttling), the modes' times for one
batch are taken seconds apart, so a ratio of two modes' times cancels the drift; timing each
mode's whole pass in turn would put minutes between them. Each mode's steady time is the median
over passes of its summed batch times.
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
  names = list(modes)
  total = repeats * len(modes) * len(batches)
  with tqdm(total=total, desc="timed passes", unit="batch", leave=False) as bar:
    for _ in range(repeats):
      seconds = dict.fromkeys(names, 0.0)
      outs = {mode: [] for mode in names}
      for i, b in enumerate(batches):
        for mode in names[i % len(names) :] + names[: i % len(names)]:
          t0 = time.perf_counter()
          outs[mode].append(modes[mode](b))
          seconds[mode] += time.perf_counter() - t0
          bar.update()
      for mode in names:
        out[mode]["steady_all_s"].append(seconds[mode])
        out[mode]["outs"] = outs[mode]
  for timing in out.values():
    timing["steady_s"] = statistics.median(timing["steady_all_s"])
    timing["compile_s"] = max(timing["first_pass_s"] - timing["steady_s"], 0.0)
  return out
