"""task=cost_model: τ and speedup predicted offline, next to measured decoding, per drafter.

    python -m specjax.run --config=experiments/cost_model/config.py

1. Measured decoding (the ``sweep`` task's loop, greedy, batch 1): AR and every variant in
   ``sweep.variants`` on every category, interleaved timed passes, texts checked equal to AR.
2. Predicted τ (``specjax/simulate.py``): one teacher-forced pass of each drafter over the AR
   text gives its proposals at every root; replaying the steps gives the target calls.
3. This machine's profile (``specjax/costmodel.py``): the target's forward over T = 1..max
   tokens, each drafter's own forwards, and the per-step overhead (AR step minus one target
   forward), all timed here; the predicted speedup is τ_predicted x AR step / drafter step.
4. The same τ priced on named chips (roofline, ``cost_model.chips``).
   Every forward is timed ``cost_model.repeats`` times (default 15), the median kept.
5. For chain drafters, τ for every chain length K = 1..``cost_model.max_k`` from one offline
   pass of the longest chain (``tau_by_k``): what ``num_draft = "auto"`` picks K from.
6. For every variant whose family record's ``tune`` has a ``sweep``: its settings replayed
   and priced here and on the chips, what that drafter's ``auto`` picks from. Prompt lookup:
   every (K, min_ngram) (``lookup_grid``: τ, the share of one-token steps); EAGLE: its
   drafter at every tree budget (top_k, depth, total) of ``cost_model.eagle_budgets``
   (``eagle_grid``); a block drafter (DFlash, P-EAGLE): every tree of
   ``static_tree.swept_trees`` with the variant's lookup branch (``block_grid``).

Writes ``cost_model.json`` (and the sweep's ``sweep.json``) and prints the table.

``cost_model.reuse_sweep`` (a ``sweep.json`` of an earlier run of the same config) skips step
1: its measured decoding is read back, and only the AR texts are decoded again (untimed;
greedy, so the same tokens, checked), so steps 2-6 can be redone in minutes.
"""

import json
import statistics
from pathlib import Path

import ml_collections
import numpy as np
from tqdm import tqdm

from specjax import build, costmodel, results, simulate
from specjax.drafters import FAMILIES, artifact, family
from specjax.measure import sweep
from specjax.measure.machine import machine

COLUMNS = (
  "variant",
  "tau",
  "predicted_tau",
  "tau_error",
  "speedup",
  "predicted_speedup",
  "speedup_error",
)


def _reused_sweep(config, path: str) -> dict | None:
  """``cost_model.reuse_sweep``: the record of an earlier run's measured decoding (its
  ``sweep.json``), so that the prediction can be redone (another profile, a fixed simulator)
  without the 40 minutes of timed decoding; a clear error unless it decoded this config."""
  if not path:
    return None
  field = "config.cost_model.reuse_sweep"
  if not Path(path).is_file():
    raise ValueError(f"{field}={path!r} is not a file: give a sweep.json of task=cost_model.")
  fix = "give a finished run's sweep.json, or run without reuse_sweep to measure this config"
  record = artifact.read_json(Path(path), field, fix)
  differ = sweep.differing_fields(record, config)
  if differ:
    raise ValueError(
      f"{field}={path!r} was measured with other config.{', config.'.join(differ)}: run "
      "without reuse_sweep to measure this config."
    )
  runs = record.get("runs")
  if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
    raise ValueError(f"{field}={path!r} has no list of runs: {fix}.")
  have = {(r.get("category"), r.get("variant")) for r in runs}
  for category in config.sweep.categories:  # every row the prediction is set beside
    for variant in ("ar", *config.sweep.variants):
      if (category, variant) not in have:
        raise ValueError(f"{field}={path!r} has no {variant!r} row of {category!r}: {fix}.")
  return record


def _ar_step(record: dict) -> float:
  """The median AR step of a sweep record (seconds)."""
  return statistics.median(
    r["steady_s"] / r["target_calls"] for r in record["runs"] if r["variant"] == "ar"
  )


def _check_same_speed(record: dict, now: float, tolerance: float = 0.2) -> None:
  """A reused sweep's speedups are priced with forwards timed now: the machine must run an AR
  step (``now``, seconds: ``sweep.timed_ar_rows``, timed as the sweep timed it) as fast as when
  the sweep was measured (within ``tolerance``), or the prediction mixes two machines (another
  host, or a busy one)."""
  then = _ar_step(record)
  if not 1 - tolerance <= now / then <= 1 + tolerance:
    raise ValueError(
      f"config.cost_model.reuse_sweep: an AR step takes {1e3 * now:.3g} ms here now and took "
      f"{1e3 * then:.3g} ms when that sweep was measured; the prediction would mix two "
      "machines: run without reuse_sweep (or on an idle machine)."
    )


def _sweeps(variants, drafters, target, rows, cm) -> list[tuple]:
  """``[(tune, base drafter, its params, settings)]``: each swept grid of the variants, once
  per (list, tag): the last variant with a tag gives the drafter replayed."""
  todo = {}
  for name, (d, dp) in drafters.items():
    tune = family.of(d).tune
    if tune is None or tune.sweep is None:
      continue
    tag = tune.sweep.tag(variants[name].drafter[d.name])
    todo[tune.sweep.key, json.dumps(tag, sort_keys=True)] = (tune, d, dp, tag)
  out = []
  for tune, d, dp, tag in tqdm(todo.values(), desc="sweeps", unit="grid", disable=not todo):
    base, grid = tune.sweep.run(d, dp, cm, lambda d, dp: simulate.replay(target, d, dp, rows))
    out.append((tune, base, dp, [tag | g for g in grid]))
  return out


def run(config: ml_collections.ConfigDict) -> dict:
  cm = config.cost_model
  variants = sweep.check(config)
  unknown = [c for c in cm.chips if c not in costmodel.CHIPS]
  if unknown:
    raise ValueError(f"config.cost_model.chips has {unknown}; known: {', '.join(costmodel.CHIPS)}.")
  for field, least, what in (("context", 0, "cached tokens behind each timed forward"),
                             ("max_k", 1, "the longest chain replayed"),
                             ("repeats", 1, "timed runs of each forward")):  # fmt: skip
    build.check_integer(cm.get(field, least), f"config.cost_model.{field}", least, what)
  if config.temperature != 0 or tuple(config.sweep.get("temperatures") or (0,)) != (0,):
    raise ValueError("task=cost_model simulates greedy decoding: set temperature = 0.")
  if config.sweep.get("resume") and not cm.get("reuse_sweep"):  # every AR row is replayed
    raise ValueError(
      "task=cost_model does not resume a sweep (config.sweep.resume): set it False, or give "
      "a finished run's sweep.json as config.cost_model.reuse_sweep."
    )
  reused = _reused_sweep(config, cm.get("reuse_sweep", ""))
  target = build.target(config)
  drafters = {name: build.drafter(c, target) for name, c in variants.items()}
  for d, _ in drafters.values():
    simulate.check_supported(d)
  if reused:  # the decoding measured by an earlier run; the AR texts decoded again (greedy)
    (record, (ar_rows, now)) = reused, sweep.timed_ar_rows(config, target)
    for (_, _, category), rows in ar_rows.items():
      ar = next(r for r in record["runs"] if r["category"] == category and r["variant"] == "ar")
      if sum(len(new) for _, new in rows) != ar["tokens"]:
        raise RuntimeError(f"{cm.reuse_sweep}: AR decodes {category!r} differently now.")
    _check_same_speed(record, now)
  else:
    record, ar_rows = sweep.measure(config, target, drafters)
  runs = {(r["category"], r["variant"]): r for r in record["runs"]}

  predicted, by_k = {}, {}  # (category, variant) -> predicted tau; variant -> {K: tau}
  for (_, _, category), rows in tqdm(ar_rows.items(), desc="simulate", unit="category"):
    for name, (d, dp) in drafters.items():
      predicted[category, name] = simulate.replay(target, d, dp, rows)
  every_row = [row for rows in ar_rows.values() for row in rows]
  k_max = cm.get("max_k", 8)
  for name, (d, dp) in drafters.items():
    if simulate.is_chain(d):  # tau for every chain length: what num_draft = "auto" reads
      by_k[name] = simulate.tau_by_chain_length(target, d, dp, every_row, k_max)
  swept = _sweeps(variants, drafters, target, every_row, cm)

  sizes = {1} | {f.tokens for d, _ in drafters.values() for f in costmodel.step_work(d)
                 if f.model.startswith("target")}  # fmt: skip
  for tune, base, _, grid in swept:
    sizes |= {f.tokens for g in grid for f in costmodel.step_work(tune.apply(base, g))
              if f.model.startswith("target")}  # fmt: skip
  sizes = sorted(sizes)
  slots = config.max_len + max(sizes)  # the decode's cache: its attention window
  repeats = cm.get("repeats", 15)  # timed rounds per forward (the median is kept)
  # A variant run at forward_rows (greedy bfloat16 on a CPU): every target forward at its rows.
  rows_of = {name: build.forward_rows(config, d) for name, (d, _) in drafters.items()}
  every_rows = set(rows_of.values()) | {build.forward_rows(config, tune.apply(base, g))
                                        for tune, base, _, grid in swept for g in grid}  # fmt: skip
  target_s = costmodel.target_seconds(target, sizes, cm.context, slots, repeats)
  target_s |= costmodel.rows_seconds(target, every_rows - {0}, cm.context, config.max_len,
                                     repeats)  # fmt: skip
  ar_step = _ar_step(record)
  overhead = max(ar_step - target_s["target"][1], 0.0)
  parts, here = {}, {}  # per variant: its forwards timed here, and the profile pricing its steps
  for name, (d, dp) in drafters.items():
    parts[name] = costmodel.drafter_seconds(d, dp, target.cfg, cm.context, repeats)
    here[name] = costmodel.measured("this machine", target_s, parts[name], overhead)
  sizes_by_model = {}
  for d, dp in drafters.values():
    sizes_by_model |= costmodel.model_sizes(target.cfg, d, dp)
  chips = {chip: costmodel.roofline(chip, sizes_by_model, cm.context) for chip in cm.chips}
  for tune, base, dp, grid in swept:  # every setting priced here and on the chips
    options = [tune.apply(base, g) for g in grid]
    groups = {}
    for d in options:
      groups.setdefault(tune.group(d), []).append(d)
    profiles = {
      key: costmodel.measured("this machine", target_s, costmodel.drafter_seconds(
        ds[0], dp, target.cfg, cm.context, repeats, ds[1:]), overhead)
      for key, ds in groups.items()
    }  # fmt: skip
    for d, g in zip(options, grid, strict=True):
      abstained = g.get("abstained", 0.0)
      n = build.forward_rows(config, d)
      g["predicted_speedup"] = profiles[tune.group(d)].speedup(d, g["tau"], abstained, n)
      for chip, prof in chips.items():
        g[f"{chip}_speedup"] = prof.speedup(d, g["tau"], abstained)

  table = []
  cats = list(config.sweep.categories)
  for name, (d, _) in drafters.items():
    replays = {c: predicted[c, name] for c in cats}
    # Here at the run's rows; a chip (bfloat16 on an accelerator) verifies at its own rows.
    price = lambda prof, r, d=d, n=rows_of[name]: prof.speedup(d, r.tau, r.abstained / r.calls, n)  # noqa: E731
    tau = np.mean([runs[c, name]["tau"] for c in cats])
    tau_p = np.mean([r.tau for r in replays.values()])
    speed = np.mean([runs[c, name]["speedup"] for c in cats])
    speed_p = np.mean([price(here[name], r) for r in replays.values()])
    row = {
      "variant": name,
      "tau": float(tau),
      "predicted_tau": float(tau_p),
      "tau_error": float(tau_p / tau - 1),
      "speedup": float(speed),
      "predicted_speedup": float(speed_p),
      "speedup_error": float(speed_p / speed - 1),
      "step_ms": 1e3 * here[name].step_seconds(d, rows_of[name]),
      "forward_rows": rows_of[name],
      "abstained_calls": sum(r.abstained for r in replays.values()),
      "drafter": config.sweep.variants[name].to_dict(),
      "tau_by_k": by_k.get(name),
      "per_category": {
        c: {
          "tau": runs[c, name]["tau"],
          "predicted_tau": r.tau,
          "speedup": runs[c, name]["speedup"],
          "predicted_speedup": price(here[name], r),
        }
        for c, r in replays.items()
      },  # fmt: skip
    }
    for chip, prof in chips.items():
      row[f"{chip}_speedup"] = float(np.mean([price(prof, r, n=0) for r in replays.values()]))
      # One step with the drafter over one AR step: prices any measured τ for this drafter.
      row[f"{chip}_step_vs_ar"] = prof.step_seconds(d) / prof.step_seconds(None)
    table.append(row)
  out = {
    "config": config.to_dict(),
    "machine": machine(),
    "target": target.cfg.name,
    "sweep_reused": cm.get("reuse_sweep", "") or None,
    "ar_step_ms": 1e3 * ar_step,
    "overhead_ms": 1e3 * overhead,
    "target_forward_ms": {t: 1e3 * s for t, s in target_s["target"].items()},
    "target_tree_forward_ms": {t: 1e3 * s for t, s in target_s["target_tree"].items()},
    "target_rows_forward_ms": {t: 1e3 * s for t, s in target_s.get("target_rows", {}).items()},
    "drafter_forward_ms": {
      name: {m: {t: 1e3 * s for t, s in v.items()} for m, v in models.items()}
      for name, models in parts.items()
    },
    "chips": {c: costmodel.CHIPS[c][2] for c in cm.chips},
    "rows": table,
  }
  for f in FAMILIES.values():  # every sweep's list, empty where no variant had one
    if f.tune is not None and f.tune.sweep is not None:
      out[f.tune.sweep.key] = []
  for tune, _, _, grid in swept:
    out[tune.sweep.key] += grid
  cols = COLUMNS + tuple(f"{c}_speedup" for c in cm.chips)
  print(results.table(table, cols))
  print(f"wrote {results.write_json(f'{config.output_dir}/cost_model.json', out)}")
  return out
