"""task=sweep: AR vs several drafters, per prompt category and batch size, in one process.

For every temperature in ``sweep.temperatures`` (default: ``config.temperature`` alone), every
batch size in ``sweep.batch_sizes`` and every category in ``sweep.categories``
(name -> prompts), the target runs autoregressively and with every drafter variant in
``sweep.variants`` (name -> ``drafter`` config overrides) on the same prompts (and, with
``sweep.draft_ar`` naming a draft-model variant, that draft alone as AR: the cost ratio c =
AR tokens/s / draft tokens/s). Each run is
done once to compile and ``benchmark.repeats`` more times; the median is the steady time.
Speedups are ratios of times measured in this process. Greedy runs also check that every
variant's text equals AR's. Writes ``sweep.json`` (every measurement) and prints one table.
All modes of a category are compiled first and their timed passes interleaved, so a change of
machine load during the run hits AR and the drafters alike. A variant may set its own verifier
(``{"verifier": "typical", "typical": {"epsilon": ...}, ...}``: Medusa's lossy rule beside the
lossless one); ``sweep.log_likelihood`` adds each run's mean log-probability per new token under
the target (temperature 1, teacher-forced, untimed): the quality side of a lossy verifier.
``sweep.resume`` keeps the jobs that an interrupted run of the same config finished (its
``sweep.json``: written after every job) and measures only the rest; each job's speedups are
ratios within that job, so kept and new jobs compare alike.
"""

import copy
import functools
import json
from pathlib import Path

import jax
import ml_collections
import numpy as np
from tqdm import tqdm

from specjax import build, costmodel, decode, metrics, placement, results
from specjax.decode import generate
from specjax.drafters import default_config as drafter_defaults
from specjax.measure import timing
from specjax.measure.machine import machine
from specjax.models import llama, source

COLUMNS = (
  "batch",
  "category",
  "variant",
  "tau",
  "calls_per_token",
  "tokens_per_s",
  "speedup",
  "identical",
)


# Variant keys that set the verifier (top-level config) rather than the drafter.
VERIFIER_KEYS = ("verifier", "typical")

# What a sweep.json read back (resumed, or reused by task=cost_model) must share with the
# config: everything that shapes its decoding or its timing.
SAME_DECODING = ("target", "drafter", "sweep", "max_new_tokens", "max_len", "temperature",
                 "top_k", "top_p", "seed", "dtype", "mesh", "chat", "stop_at_eos", "verifier",
                 "typical", "benchmark", "forward_rows")  # fmt: skip
# Their values in records written before the field existed.
BEFORE_FIELD = {"forward_rows": 0}
VERIFY_CONTEXT = 128  # cached tokens before each timed verify forward (verify_cost)


def default_config() -> ml_collections.ConfigDict:
  """The ``sweep`` config section's defaults; a config adds ``categories`` and ``variants``."""
  c = ml_collections.ConfigDict()
  c.batch_sizes = (1,)
  c.verify_sizes = ()  # verify forwards to time (tokens), none by default
  c.resume = False  # True: keep the jobs an interrupted run of this config left in sweep.json
  return c


def _with_defaults(saved: dict, defaults: dict, now: dict) -> dict:
  """``saved`` with the keys it lacks, of those ``now`` has, taken from ``defaults`` (nested):
  a record written before a drafter option existed decoded as that option's default does."""
  out = dict(saved)
  for k, v in now.items():
    if k not in out and k in defaults:
      out[k] = defaults[k]
    elif all(isinstance(x.get(k), dict) for x in (out, defaults)) and isinstance(v, dict):
      out[k] = _with_defaults(out[k], defaults[k], v)
  return out


def differing_fields(record: dict, config: ml_collections.ConfigDict) -> list[str]:
  """The ``SAME_DECODING`` fields where the config ``record`` was measured with differs from
  ``config``, ``sweep.resume`` aside (how a run started, not what it decodes)."""
  as_json = lambda c: json.loads(json.dumps(c.to_dict(), default=str))  # noqa: E731
  now = as_json(config)
  then = dict(record.get("config", {}))
  then["drafter"] = _with_defaults(
    then.get("drafter", {}), as_json(drafter_defaults()), now.get("drafter", {})
  )
  for c in (now, then):
    c["sweep"] = {k: v for k, v in (c.get("sweep") or {}).items() if k != "resume"}
  old = lambda c, k: c.get(k, BEFORE_FIELD.get(k))  # noqa: E731
  differ = [k for k in SAME_DECODING if old(then, k) != old(now, k)]
  # The dtype used, not only the one asked for: auto may choose another now (another machine,
  # $SPECJAX_CPU_DTYPE), and rows of two dtypes would be compared as one run's.
  was = record.get("dtype", {}).get("dtype") if isinstance(record.get("dtype"), dict) else None
  if was and "dtype" not in differ and (used := build.dtype(config)) != was:
    differ.append(f"dtype ({now.get('dtype', 'auto')} chose {was} then, {used} now)")
  return differ


def _job(temperature, batch_size: int, category: str) -> tuple:
  return float(temperature), int(batch_size), category


def _resumed(config: ml_collections.ConfigDict) -> dict | None:
  """``sweep.resume``: what an earlier run of this config wrote to ``output_dir/sweep.json``,
  as ``{"record": that record, "jobs": (temperature, batch, category) -> that job's runs}``
  (only this config's jobs); None without the option or the file. A file measured with another
  config is an error, raised before any model loads."""
  path = Path(config.output_dir) / "sweep.json"
  if not config.sweep.get("resume") or not path.is_file():
    return None
  try:
    record = json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(
      f"config.sweep.resume: {path} is not a sweep's JSON ({e.msg} at line {e.lineno}): move it "
      "away (or set config.output_dir elsewhere) to measure afresh."
    ) from None
  differ = differing_fields(record, config)
  if differ:
    raise ValueError(
      f"config.sweep.resume: {path} was measured with other config.{', config.'.join(differ)}: "
      "move it away (or set config.output_dir elsewhere) to measure this config afresh."
    )
  done, wanted = {}, set(_jobs(config))
  for r in record["runs"]:  # runs written before they named their temperature ran the config's
    job = _job(r.get("temperature", record["config"]["temperature"]), r["batch"], r["category"])
    if job in wanted:
      done.setdefault(job, []).append(r | {"temperature": job[0]})
  for job, runs in list(done.items()):  # a job lacking a row is measured again, whole
    if missing := sorted(_modes(config, runs) - {r["variant"] for r in runs}):
      print(
        f"note: T={job[0]:g} B={job[1]} {job[2]} lacks its {', '.join(missing)} row(s) in {path}: "
        "measuring that job again (config.sweep.resume)"
      )
      del done[job]
  return {"record": record, "jobs": done}


def _modes(config, runs: list[dict]) -> set[str]:
  """The rows a finished job holds: AR, every variant (and the draft alone, with
  ``sweep.draft_ar``), and AR at each forward rows a variant's text was checked against."""
  modes = {"ar", *config.sweep.variants} | ({"draft_ar"} if config.sweep.get("draft_ar") else set())
  return modes | {f"ar_rows_{r['forward_rows']}" for r in runs if r.get("forward_rows")}


def _nothing_left(config, kept: dict | None) -> bool:
  """Whether a resumed run has every job (and the verify cost, if asked for) already."""
  if kept is None:
    return False
  verify_done = not config.sweep.verify_sizes or "verify_cost" in kept["record"]
  return verify_done and all(job in kept["jobs"] for job in _jobs(config))


def variant_config(config, overrides: dict, name: str = "") -> ml_collections.ConfigDict:
  """``config`` with a variant's overrides: ``verifier``/``typical`` at the top level (e.g.
  Medusa's typical acceptance for one variant), every other key under ``config.drafter``, where
  each must name a field it has (a misspelt one would measure the default under its label)."""
  c = copy.deepcopy(config)
  overrides = dict(overrides)
  top = {k: overrides.pop(k) for k in VERIFIER_KEYS if k in overrides}
  if unknown := _unknown_field(c.drafter, overrides, "drafter"):
    raise ValueError(
      f"config.sweep.variants[{name!r}] sets {unknown}, which config has no field of: check its "
      f"spelling (a variant's keys are config.drafter's, or {', '.join(VERIFIER_KEYS)})."
    )
  with c.unlocked():
    c.drafter.update(overrides)
    c.update(top)
  return c


def _unknown_field(section, overrides: dict, path: str) -> str | None:
  """The first key of ``overrides`` (nested dicts followed) that ``section`` has no field of."""
  for key, value in overrides.items():
    if key not in section:
      return f"{path}.{key}"
    nested = isinstance(section[key], ml_collections.ConfigDict) and isinstance(
      value, (dict, ml_collections.ConfigDict)
    )
    if nested and (unknown := _unknown_field(section[key], value, f"{path}.{key}")):
      return unknown
  return None


def check_sizes(sizes, field: str, verify: bool = False) -> None:
  """``sizes``: one or more integers >= 1 (batch sizes), or with ``verify`` increasing token
  counts from 1, the one-token forward every verify forward is compared with."""
  sizes = tuple(sizes or ())
  ints = all(isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in sizes)
  if verify and not (ints and sizes and sizes[0] == 1 and list(sizes) == sorted(set(sizes))):
    raise ValueError(
      f"{field}={sizes} must list token counts in increasing order from 1 (the one-token forward "
      "each is compared with), e.g. (1, 4, 16)."
    )
  if not (ints and sizes):
    raise ValueError(f"{field}={sizes} must list one or more batch sizes >= 1, e.g. (1, 4).")


def check_verify_fits(config: ml_collections.ConfigDict, sizes, context: int = VERIFY_CONTEXT):
  """``verify_cost``'s largest forward against a device's memory, from the target's header:
  its weights, a cache of the slots it times (``verify_cost``), and the forward's logits and
  attention scores."""
  cfg = source.header_config(config.target)
  t, slots = max(sizes), max(config.max_len, context) + max(sizes) + 1
  one = {"data": 1, "fsdp": 1, "tensor": 1}
  weights = llama.param_shapes(cfg, build.dtype(config))
  fp = decode.footprint(cfg, weights, decode.AUTOREGRESSIVE, None, 1, slots, one)
  fp.parts["verify forward's logits and scores"] = 4 * t * (cfg.vocab_size + cfg.num_heads * slots)
  try:
    placement.check_fits(fp, config.get("device_memory_gib", 0.0),
                         fix="lower the largest of config.sweep.verify_sizes")  # fmt: skip
  except ValueError as e:
    raise ValueError(f"a verify forward of {t} tokens: {e} (config.sweep.verify_sizes)") from None


def check(config: ml_collections.ConfigDict) -> dict:
  """The variants' configs (name -> config), every field checked before any model loads."""
  variants = {
    name: variant_config(config, dict(o), name) for name, o in config.sweep.variants.items()
  }
  if not variants or not config.sweep.categories:
    raise ValueError("config.sweep.variants and config.sweep.categories must be non-empty.")
  for name, prompts in config.sweep.categories.items():
    if not prompts:
      raise ValueError(
        f"config.sweep.categories[{name!r}] has no prompts: give it at least one, or remove it."
      )
  check_sizes(config.sweep.get("batch_sizes"), "config.sweep.batch_sizes")
  if config.sweep.get("verify_sizes"):
    check_sizes(config.sweep.verify_sizes, "config.sweep.verify_sizes", verify=True)
    check_verify_fits(config, config.sweep.verify_sizes)
  draft_ar = config.sweep.get("draft_ar")
  if draft_ar and (draft_ar not in variants or variants[draft_ar].drafter.name != "draft_model"):
    raise ValueError(
      f"config.sweep.draft_ar={draft_ar!r} must name a draft_model variant of config.sweep."
      f"variants ({', '.join(variants)}), or be empty."
    )
  temperatures = tuple(config.sweep.get("temperatures") or (config.temperature,))
  if any(isinstance(t, bool) or not isinstance(t, (int, float)) for t in temperatures) or not all(
    0 <= t < float("inf") for t in temperatures
  ):
    raise ValueError(
      f"config.sweep.temperatures={temperatures} must be finite numbers >= 0 (0 = greedy)."
    )
  if twice := [t for i, t in enumerate(temperatures) if t in temperatures[:i]]:
    raise ValueError(
      f"config.sweep.temperatures={temperatures} lists {twice[0]} twice (every job would run "
      "twice): list each temperature once."
    )
  for name, c in variants.items():
    try:
      build.check(c)
    except ValueError as e:
      raise ValueError(_variants_error(str(e), name, config.sweep.variants[name])) from None
  return variants


def _variants_error(message: str, name: str, overrides) -> str:
  """A variant's error naming the variant's field: a variant's keys are config.drafter's, so
  config.drafter.X is config.sweep.variants[name].X; config.verifier and config.typical are the
  variant's where it sets them. Errors of the rest of the config are left as they are."""
  where = f"config.sweep.variants[{name!r}]"
  message = message.replace("config.drafter.", f"{where}.")
  for key in VERIFIER_KEYS:
    if key in overrides:
      message = message.replace(f"config.{key}", f"{where}.{key}")
  return message


def run(config: ml_collections.ConfigDict) -> dict:
  variants = check(config)
  kept = _resumed(config)
  if _nothing_left(config, kept):  # its tables again; no model loads
    record = kept["record"]
    print(f"every job is in {config.output_dir}/sweep.json already (config.sweep.resume)")
    if record.get("summary") != (summary := _summary(record["runs"])):  # of the rows there
      record["summary"] = summary
      path = results.write_json(f"{config.output_dir}/sweep.json", record)
      print(f"note: its summary did not match its rows: rewrote it in {path}")
    _print_tables(config, record)
    return record
  target = build.target(config)
  drafters = {name: build.drafter(c, target) for name, c in variants.items()}
  record, _ = measure(config, target, drafters, kept)
  return record


@functools.partial(jax.jit, static_argnames="cfg")
def _log_probs(params, tokens_BxT, *, cfg):
  return jax.nn.log_softmax(llama.logits_of(params, cfg, tokens_BxT)[0])


def token_log_probs(target, rows, length: int) -> list[np.ndarray]:
  """Per row of ``rows`` (``(prompt ids, new ids)``), the log-probability the target gives each
  new token at temperature 1, teacher-forced: one forward per row, each padded to ``length``
  so that one program serves every row (causal: the padding after a row changes nothing)."""
  out = []
  for prompt, new in rows:
    text = list(prompt) + list(new)
    if len(text) > length:
      raise ValueError(f"a row of {len(text)} tokens does not fit length={length}.")
    x = np.asarray([text + [0] * (length - len(text))], np.int32)
    logp_TxV = np.asarray(_log_probs(target.params, x, cfg=target.cfg)[0])
    out.append(logp_TxV[np.arange(len(prompt) - 1, len(text) - 1), list(new)])
  return out


def log_likelihood(target, rows, length: int) -> float:
  """Mean log-probability per new token that the target gives ``rows`` (``token_log_probs``)."""
  per_row = token_log_probs(target, rows, length)
  return float(sum(r.sum() for r in per_row)) / max(sum(len(r) for r in per_row), 1)


def _jobs(config) -> list[tuple]:
  """``(temperature, batch size, category)`` of every job, in the order they run."""
  temperatures = tuple(config.sweep.get("temperatures") or (config.temperature,))
  return [
    _job(temp, b, cat)
    for temp in temperatures
    for b in config.sweep.batch_sizes
    for cat in config.sweep.categories
  ]


def _request(config, target, temperature, batch_size: int, category: str) -> build.Request:
  c = copy.deepcopy(config)
  with c.unlocked():
    c.prompts = tuple(config.sweep.categories[category])
    c.batch_size = batch_size
    c.temperature = float(temperature)
  return build.request(c, target)


def _rows(batches, outs) -> list[tuple]:
  """``(prompt ids, new ids)`` of every row of ``batches``, decoded as ``outs``."""
  prompts = [p for batch in batches for p in batch]
  return list(zip(prompts, [row for out in outs for row in out.tokens], strict=True))


def ar_rows(config, target) -> dict:
  """The AR rows ``measure`` returns, decoded again untimed (greedy jobs: the same tokens)."""
  out = {}
  for temperature, batch_size, category in _jobs(config):
    req = _request(config, target, temperature, batch_size, category)
    kw = req.generate_kwargs()
    outs = [generate(target.params, target.cfg, b, **kw) for b in req.batches()]
    out[(temperature, batch_size, category)] = _rows(req.batches(), outs)
  return out


def timed_ar_rows(config, target) -> tuple[dict, float]:
  """``ar_rows`` and the median AR step (seconds), timed as ``measure`` times AR (each job
  compiled, then ``benchmark.repeats`` timed passes; a step is a pass over its target calls):
  what an earlier sweep's AR steps are compared with."""
  out, steps = {}, []
  for temperature, batch_size, category in _jobs(config):
    req = _request(config, target, temperature, batch_size, category)
    kw = req.generate_kwargs()
    modes = {"ar": lambda b, kw=kw: generate(target.params, target.cfg, b, **kw)}
    describe = f"{category}, batch {batch_size}, temperature {temperature:g}"
    t = timing.run_modes(modes, req.batches(), config.benchmark.repeats, describe)["ar"]
    out[(temperature, batch_size, category)] = _rows(req.batches(), t["outs"])
    calls = metrics.summarize(metrics.merge([o.counts for o in t["outs"]]))["target_calls"]
    steps.append(t["steady_s"] / calls)
  return out, float(np.median(steps))


def measure(config, target, drafters: dict, kept: dict | None = None) -> tuple[dict, dict]:
  """Decodes and times every job but those ``kept`` holds (``_resumed``: an earlier run's,
  taken as they are, with its verify cost); returns the record (also written as
  ``sweep.json``) and the AR rows of the jobs it measured, per ``(temperature, batch,
  category)``: ``(prompt ids, new ids)`` for every row."""
  verifiers = {
    name: build.verifier(variant_config(config, dict(config.sweep.variants.get(name, {}))))
    for name in drafters
  }
  ar_rows = {}
  record = {"config": config.to_dict(), "machine": machine(), "runs": []}
  record["dtype"] = build.dtype_choice(config)  # how the run's dtype was chosen
  earlier, kept_jobs = (kept["record"], kept["jobs"]) if kept else ({}, {})
  if kept_jobs:  # the machines the kept jobs ran on, newest first
    machines = [earlier.get("machine"), *earlier.get("kept", {}).get("machines", [])]
    unique = list({json.dumps(m, sort_keys=True): m for m in machines}.values())
    record["kept"] = {"jobs": len(kept_jobs), "machines": unique}
  if config.sweep.verify_sizes:
    record["verify_cost"] = earlier.get("verify_cost") or verify_cost(
      target, config.sweep.verify_sizes, config.max_len
    )
    print(results.table(record["verify_cost"], ("tokens", "ms", "vs_1_token")))
  for job in tqdm(_jobs(config), desc="sweep", unit="category"):
    temperature, batch_size, category = job
    if job in kept_jobs:
      record["runs"] += kept_jobs[job]
      tqdm.write(f"  T={temperature:g} B={batch_size} {category}: kept from the earlier run")
      continue
    req = _request(config, target, temperature, batch_size, category)
    kw = req.generate_kwargs()
    modes = {"ar": lambda b, kw=kw: generate(target.params, target.cfg, b, **kw)}
    # Each drafter at its forward rows (build.forward_rows: auto is its rows per step in
    # bfloat16 greedy on a CPU), checked against AR at the same rows; "ar" stays the speed
    # baseline.
    reference = {}
    for name, (d, dp) in drafters.items():
      vc = variant_config(config, dict(config.sweep.variants.get(name, {})))
      rows = build.forward_rows(vc, d, temperature)
      vkw = kw | {"forward_rows": rows}
      reference[name] = "ar" if rows == kw["forward_rows"] else f"ar_rows_{rows}"
      if reference[name] not in modes:
        modes[reference[name]] = lambda b, vkw=vkw: generate(target.params, target.cfg, b, **vkw)
      modes[name] = lambda b, d=d, dp=dp, v=verifiers[name], vkw=vkw: generate(
        target.params, target.cfg, b, drafter=d, drafter_params=dp, verifier=v, **vkw
      )
    if config.sweep.get("draft_ar"):  # the draft model alone, as AR: its cost ratio c
      d, dp = drafters[config.sweep.draft_ar]
      modes["draft_ar"] = lambda b, d=d, dp=dp, kw=kw: generate(dp, d.cfg, b, **kw)
    texts = {}
    describe = f"{category}, batch {batch_size}, temperature {temperature:g}"
    timed = timing.run_modes(modes, req.batches(), config.benchmark.repeats, describe)
    for mode, t in timed.items():
      outs = t.pop("outs")
      texts[mode] = [row for out in outs for row in out.tokens]
      if mode == "ar":
        ar_rows[(temperature, batch_size, category)] = _rows(req.batches(), outs)
      m = metrics.summarize(metrics.merge([out.counts for out in outs]))
      run_ = {"temperature": temperature, "batch": batch_size, "category": category}
      run_ |= {"variant": mode} | m | t
      run_["tokens_per_s"] = m["tokens"] / t["steady_s"]
      if config.sweep.get("log_likelihood"):
        run_["log_likelihood"] = log_likelihood(target, _rows(req.batches(), outs), req.max_len)
      record["runs"].append(run_)
      tqdm.write(
        f"  T={temperature:g} B={batch_size} {category} {mode}: tau {m['tau']:.2f}, "
        f"{run_['tokens_per_s']:.1f} tok/s"
      )
    ar = record["runs"][-len(modes)]
    for run_ in record["runs"][-len(modes) :]:
      run_["speedup"] = run_["tokens_per_s"] / ar["tokens_per_s"]
      if req.temperature == 0 and run_["variant"] in {"ar", *reference}:
        same_rows = reference.get(run_["variant"], "ar")
        run_["identical"] = texts[run_["variant"]] == texts[same_rows]
        if same_rows != "ar":
          run_["forward_rows"] = int(same_rows.rsplit("_", 1)[1])
    record["summary"] = _summary(record["runs"])
    results.write_json(f"{config.output_dir}/sweep.json", record)  # partial results survive
    # Each category pads its prompts differently, so no later job reuses these programs; with a
    # dozen variants the compiled code of every job would exhaust the process's memory maps.
    jax.clear_caches()
  record["summary"] = _summary(record["runs"])
  _print_tables(config, record)
  path = results.write_json(f"{config.output_dir}/sweep.json", record)
  print(f"wrote {path}")
  return record, ar_rows


def _print_tables(config, record: dict) -> None:
  """Every run, then the per-variant means."""
  print(results.table([_with_calls(r) for r in record["runs"]], COLUMNS))
  cols = ("batch", "variant", "mean_speedup", "mean_tau")
  cols += ("mean_log_likelihood",) if config.sweep.get("log_likelihood") else ()
  several = len(config.sweep.get("temperatures") or ()) > 1
  print(results.table(record["summary"], (("temperature",) if several else ()) + cols))


def markdown(record: dict) -> str:
  """A sweep record as Markdown, per batch size (and temperature, when it ran several): the
  per-variant means, then every run; then the verify cost if it was timed (what experiment
  READMEs show)."""
  runs, out = record["runs"], []
  key = lambda r: (r.get("temperature", 0.0), r["batch"])  # noqa: E731
  keys = sorted({key(r) for r in runs})
  several_temperatures = len({t for t, _ in keys}) > 1
  loglik = ("log_likelihood",) if "log_likelihood" in runs[0] else ()
  for temp, b in keys:
    out += [f"### Batch {b}" + (f", temperature {temp:g}" if several_temperatures else ""), ""]
    summary = [s for s in record["summary"] if key(s) == (temp, b)]
    cols = ("variant", "mean_tau", "mean_speedup") + tuple(f"mean_{c}" for c in loglik)
    out += [results.markdown_table(summary, cols), ""]
    rows = [_with_calls(r) for r in runs if key(r) == (temp, b)]
    cols = ("category", "variant", "tau", "calls_per_token", "tokens_per_s", "speedup")
    out += [results.markdown_table(rows, cols + loglik + ("identical",)), ""]
  if record.get("verify_cost"):
    out += ["Verify cost (one target forward over T tokens, batch 1):", ""]
    out += [results.markdown_table(record["verify_cost"], ("tokens", "ms", "vs_1_token")), ""]
  return "\n".join(out)


def mean_rows(name: str, record: dict, log_likelihood: bool = False) -> list[dict]:
  """One row per (temperature, batch, variant) of a sweep record named ``name``: its means
  over the prompt categories, and ``identical``, how many of its greedy categories decoded AR's
  text (``"k/n"``; empty where sampled). AR (1 and 1 by definition) is left out unless the
  sweep measured the text's log-likelihood, whose column ``log_likelihood`` adds."""
  rows = []
  for s in record["summary"]:
    if s["variant"] == "ar" and "mean_log_likelihood" not in s:
      continue
    t = s.get("temperature", record["config"]["temperature"])
    same = [
      r["identical"]
      for r in record["runs"]
      if "identical" in r
      and (r.get("temperature", record["config"]["temperature"]), r["batch"], r["variant"])
      == (t, s["batch"], s["variant"])
    ]
    row = {"sweep": name, "T": t, "batch": s["batch"], "variant": s["variant"],
           "mean_tau": s["mean_tau"], "mean_speedup": s["mean_speedup"]}  # fmt: skip
    if log_likelihood:
      row["mean_log_likelihood"] = s.get("mean_log_likelihood", "")
    row["identical"] = f"{sum(same)}/{len(same)}" if same and t == 0 else ""
    rows.append(row)
  return rows


def _with_calls(run_: dict) -> dict:
  """A run as its table row: target calls per token under the column's short name."""
  return run_ | {"calls_per_token": run_["target_calls_per_token"]}


def _summary(runs: list[dict]) -> list[dict]:
  """Per temperature, batch size and variant: the mean over categories of speedup and tau (and
  of the log-likelihood, when it was measured)."""
  out = []
  key = lambda r: (r.get("temperature", 0.0), r["batch"], r["variant"])  # noqa: E731
  # AR first, then the variants in the order they ran (a set's order would vary by process).
  keys = sorted(dict.fromkeys(map(key, runs)), key=lambda k: (k[0], k[1], k[2] != "ar"))
  for temp, b, v in keys:
    sel = [r for r in runs if key(r) == (temp, b, v)]
    row = {"temperature": temp, "batch": b, "variant": v}
    for name in ("speedup", "tau", "log_likelihood"):
      if name in sel[0]:
        row[f"mean_{name}"] = sum(r[name] for r in sel) / len(sel)
    out.append(row)
  return out


def verify_cost(
  target,
  sizes,
  max_len: int,
  context: int = VERIFY_CONTEXT,
  repeats: int = 9,
  mask: str = "causal",
) -> list[dict]:
  """Milliseconds for one batch-1 target forward over T new tokens after ``context`` cached
  ones, per T in ``sizes``: what a T-node chain (``mask="causal"``) or tree (``"tree"``) costs
  to verify, relative to one token. Timed as the decode loop runs it
  (``costmodel.llama_forward_seconds``: a read-only cache of the decode's slots, every T
  interleaved in rounds)."""
  slots = max(max_len, context) + max(sizes) + 1
  secs = costmodel.llama_forward_seconds(
    target.params, target.cfg, sizes, context, repeats, slots, (mask,)
  )[mask]
  out = [{"tokens": t, "ms": 1e3 * secs[t]} for t in sizes]
  for row in out:
    row["vs_1_token"] = row["ms"] / out[0]["ms"]
  return out


def run_verify_cost(config: ml_collections.ConfigDict) -> list[dict]:
  """task=verify_cost: only the forward-cost table of ``sweep.verify_sizes``; writes JSON."""
  build.check(config)  # the output directory and lengths too, before the timing
  check_sizes(config.sweep.get("verify_sizes"), "config.sweep.verify_sizes", verify=True)
  check_verify_fits(config, config.sweep.verify_sizes)
  target = build.target(config)
  rows = verify_cost(target, config.sweep.verify_sizes, config.max_len)
  print(results.table(rows, ("tokens", "ms", "vs_1_token")))
  record = {"config": config.to_dict(), "machine": machine(), "verify_cost": rows}
  print(f"wrote {results.write_json(f'{config.output_dir}/verify_cost.json', record)}")
  return rows
