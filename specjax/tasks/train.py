"""task=train: distil a draft model from the target, then decode with it.

    python -m specjax.run --config=configs/train_tiny.py            # seconds, random target
    python -m specjax.run --config=configs/distill_draft_smollm2.py  # SmolLM2-135M

What is trained is ``config.objective.name`` from ``specjax.train.objectives.registry()``, with
its own subsection ``config.objective.<name>``. Order of work: every config field is checked
(and the mesh against the devices, after joining a multi-process run) before any model or text
is loaded; then the target is loaded and frozen, the data is read (``config.data.sources``:
corpora and/or self-distilled directories; a random target with no sources samples its own
text with ``specjax.decode.generate``), and ``specjax.train.loop.train`` runs. Process 0 then
exports the untrained and the trained drafter (``workdir/draft_init``, ``workdir/draft_final``:
for ``draft_distill``, HF-style directories the draft-model drafter loads), decodes the
config's prompts with each through the objective's drafter (tau, per-position alpha), and
writes ``workdir/train.json``; with ``config.record_to`` set (an experiment's committed
``results/<variant>/``), also ``train.json`` and ``metrics.jsonl`` there.
"""

import dataclasses
import json
import logging
import re
import time
from pathlib import Path

import jax
import ml_collections
import numpy as np
from absl import logging as absl_logging
from jax.experimental import multihost_utils

from specjax import build, metrics, parallel, profiling, results, simulate
from specjax.decode import generate
from specjax.drafters import artifact
from specjax.drafters.base import check_seed
from specjax.models import source
from specjax.train import corpora, data, features, files, loop, objectives, step

_SECTIONS = ("objective", "data", "train", "optim", "mesh", "distributed", "evaluate")


@dataclasses.dataclass(frozen=True)
class _Plan:
  mesh: parallel.MeshConfig
  distributed: parallel.DistributedConfig
  loop: loop.LoopConfig
  optim: step.OptimConfig


def plan(config: ml_collections.ConfigDict) -> _Plan:
  """The config's train fields as validated frozen objects; loads nothing."""
  missing = [k for k in _SECTIONS if k not in config]
  if missing:
    raise ValueError(
      f"config has no {', '.join(missing)} section(s) for task=train; start from "
      "configs/train_tiny.py or configs/distill_draft_smollm2.py."
    )
  t, d = config.train, config.data
  if d.seq_len < 2:
    raise ValueError(f"config.data.seq_len must be >= 2, got {d.seq_len}.")
  seed = d.get("seed", 0)
  check_seed(seed, "config.data.seed")
  build.check_integer(
    d.max_examples,
    "config.data.max_examples",
    0,
    "rows read or sampled, 0 = all; with config.data.files it does not apply",
  )
  objectives.check(config)
  profiling.check(config)
  if d.eval_examples < 0:
    raise ValueError(f"config.data.eval_examples must be >= 0, got {d.eval_examples}.")
  if 0 < d.eval_examples < t.global_batch:
    raise ValueError(
      f"config.data.eval_examples={d.eval_examples} is fewer than train.global_batch="
      f"{t.global_batch}: an evaluation takes whole global batches; set eval_examples >= "
      f"{t.global_batch} (or 0: no eval set)."
    )
  if d.eval_examples and t.eval_batches * t.global_batch > d.eval_examples:
    raise ValueError(
      f"config.train.eval_batches={t.eval_batches} global batches of {t.global_batch} take "
      f"{t.eval_batches * t.global_batch} rows, more than config.data.eval_examples="
      f"{d.eval_examples}: an evaluation would repeat rows; lower eval_batches (at most "
      f"{d.eval_examples // t.global_batch}) or raise eval_examples."
    )
  if d.get("files"):
    _check_files(config)
  for src in d.sources:
    if src in corpora.CORPORA:
      corpora.corpus_path(src)
    elif Path(src).is_dir():
      check_shards_target(config, src, data.read_manifest(src))
    else:
      raise ValueError(
        f"config.data.sources has {src!r}, which is neither a corpus "
        f"({', '.join(corpora.CORPORA)}) nor an existing self-distillation directory. Create it "
        "with the self_distill task, or fix the path."
      )
  if not d.sources and not d.get("files") and config.target.source != "random":
    raise ValueError(
      "config.data.sources is empty: name corpora or self-distilled directories (only a "
      "random target may sample its own training text)."
    )
  if not d.sources and not d.get("files") and (d.max_examples < 1 or d.seq_len < 5):
    raise ValueError(
      "a random target samples config.data.max_examples rows of config.data.seq_len tokens "
      f"(prompts of up to 4): need max_examples >= 1 and seq_len >= 5, got {d.max_examples} "
      f"and {d.seq_len}."
    )
  if not d.get("files") and d.max_examples and d.eval_examples >= d.max_examples:
    rows = "a random target samples" if not d.sources else "the sources give at most"
    raise ValueError(
      f"config.data.eval_examples={d.eval_examples} leaves no rows to train on: {rows} "
      f"config.data.max_examples={d.max_examples}; lower eval_examples or raise max_examples."
    )
  return _Plan(
    mesh=parallel.MeshConfig(**config.mesh),
    distributed=parallel.DistributedConfig(**config.distributed),
    loop=loop.LoopConfig(
      workdir=config.workdir,
      profile=config.get("profile") or "",
      profile_steps=config.get("profile_steps", 3),
      probe_every=_tau_every(config),
      **t,
    ),
    optim=step.OptimConfig(**config.optim),
  )


def warmup_note(p: _Plan) -> str | None:
  """A warmup longer than the run never reaches the learning rate set: said, not refused (a
  short smoke run of a long recipe's optimiser is common)."""
  o, steps = p.optim, p.loop.steps
  if o.warmup_steps <= steps:
    return None
  peak = float(o.schedule()(steps))
  return (
    f"note: config.optim.warmup_steps={o.warmup_steps} is longer than config.train.steps={steps}: "
    f"the learning rate reaches {peak:.3g}, not config.optim.learning_rate={o.learning_rate}."
  )


def _check_files(config: ml_collections.ConfigDict) -> None:
  """``config.data.files``: every record of this process's shard, with the target's tokenizer
  (from its header), before any weight loads."""
  d = config.data
  if config.target.source == "random":
    raise ValueError(
      "config.data.files needs a target with a tokenizer and a chat template; a random target "
      "has none: set config.data.files=()."
    )
  if d.get("feature_cache"):
    raise ValueError(
      "config.data.feature_cache keeps every row's target features; config.data.files streams "
      "its rows: set config.data.feature_cache=''."
    )
  model = source.peek(config.target)
  dist = config.distributed
  files.check_files(
    d,
    model.tokenizer if model is not None else None,
    process_index=dist.process_id if dist.num_processes > 1 else 0,
    process_count=max(dist.num_processes, 1),
  )


def check_shards_target(config: ml_collections.ConfigDict, src: str, manifest: dict) -> None:
  """Shards self-distilled by another target (another vocabulary or tokenizer: their ids mean
  other tokens) are refused, from the target's header, before it loads. Shards written before
  the manifest recorded its target's vocabulary are checked by their tokenizer alone."""
  made = manifest.get("target") or {
    "name": manifest.get("model"),
    "tokenizer_fingerprint": manifest.get("tokenizer_fingerprint"),
  }
  model = source.peek(config.target)
  cfg = source.header_config(config.target)
  fp = model.tokenizer.fingerprint() if model is not None and model.tokenizer else None
  vocab, made_fp = made.get("vocab_size"), made.get("tokenizer_fingerprint")
  if (vocab is not None and vocab != cfg.vocab_size) or (fp and made_fp and fp != made_fp):
    tok = lambda f: f"tokenizer {f[:12]}" if f else "no tokenizer"
    raise ValueError(
      f"config.data.sources has {src!r}, self-distilled by target {made.get('name')!r} "
      f"(vocabulary {vocab if vocab is not None else '?'}, {tok(made_fp)}), but config.target "
      f"is {cfg.name!r} (vocabulary {cfg.vocab_size}, {tok(fp)}): its token ids mean other "
      "tokens. Self-distil with this target (task=self_distill), or train the target that "
      "made them."
    )


def sample_dataset(model: build.Model, num_examples: int, seq_len: int, seed: int) -> data.Dataset:
  """The model's own text from short random prompts, sampled at temperature 1 (no tokenizer)."""
  rng = np.random.default_rng(seed)
  prompts = [
    rng.integers(0, model.cfg.vocab_size, size=rng.integers(1, 5)).tolist()
    for _ in range(num_examples)
  ]
  tokens = np.zeros((num_examples, seq_len), np.int32)
  mask = np.zeros((num_examples, seq_len), np.float32)
  batch = 64
  for i in range(0, num_examples, batch):
    rows = [prompts[j % num_examples] for j in range(i, i + batch)]
    out = generate(
      model.params,
      model.cfg,
      rows,
      max_new_tokens=[seq_len - len(p) for p in rows],
      max_len=seq_len,
      temperature=1.0,
      seed=seed + i,
    )
    for j, (p, new) in enumerate(zip(rows, out.tokens, strict=True)):
      if i + j < num_examples:
        tokens[i + j] = p + new
        mask[i + j, len(p) - 1 : seq_len - 1] = 1.0
  return data.Dataset(tokens, mask)


def _load_data(config, target: build.Model, objective=None):
  d = config.data
  if d.get("files"):  # streamed; eval rows held out from the records
    return files.load_files(d, target.tokenizer, state_dir=config.workdir or None)
  if d.sources:
    ds = data.load_dataset(
      tuple(d.sources),
      target.tokenizer,
      seq_len=d.seq_len,
      max_examples=d.max_examples or None,
      seed=d.seed,
    )
  else:
    ds = sample_dataset(target, d.max_examples, d.seq_len, d.seed)
  names = objective.cached_features() if objective is not None else ()
  if d.get("feature_cache") and names:  # the target's features of every row, from disk
    ds = features.attach(ds, target, names, d.feature_cache)
  return data.split(ds, d.eval_examples) if d.eval_examples else (ds, None)


def _tau(target: build.Model, drafter, params, req: build.Request) -> dict:
  outs = [
    generate(
      target.params, target.cfg, b, drafter=drafter, drafter_params=params, **req.generate_kwargs()
    )
    for b in req.batches()
  ]
  m = metrics.summarize(metrics.merge([o.counts for o in outs]))
  return {"tau": m["tau"], "alpha": m["alpha"], "tokens": m["tokens"]}


def _tau_every(config) -> int:
  every = config.get("evaluate", {}).get("tau_every", 0)
  if int(every) != every or every < 0:
    raise ValueError(f"config.evaluate.tau_every must be an integer >= 0 (0 = never), got {every}.")
  if every:
    _tau_temperatures(config)
  if every and config.distributed.num_processes > 1:
    raise ValueError(
      "config.evaluate.tau_every replays on one process; set it to 0 for a multi-process run."
    )
  return int(every)


def _tau_temperatures(config) -> tuple[float, ...]:
  temps = tuple(config.get("evaluate", {}).get("tau_temperatures", (0.0,)))
  if not temps or any(not isinstance(t, int | float) or not 0 <= t < float("inf") for t in temps):
    raise ValueError(
      "config.evaluate.tau_temperatures must list finite temperatures >= 0 (0: the simulator's "
      f"greedy τ; T > 0: a sampled decode), e.g. (0.0, 1.0); got {temps!r}."
    )
  return temps


def _tau_probe(config, target, objective, host_target):
  """τ of the drafter being trained, decoding the evaluate prompts as ``config.drafter`` says,
  at each of ``evaluate.tau_temperatures``: at 0 the simulator's greedy τ (``specjax.simulate``)
  over the prompts' greedy continuations (decoded here once, before training); at T > 0 a
  sampled decode of the prompts (the run's seed, top-k and top-p; the simulator replays greedy
  decoding only): ``params -> {"tau/simulated": τ, "tau/decoded_t1": τ, ...}``."""
  drafter = objective.drafter(config)
  temps = _tau_temperatures(config)
  at = {}
  for t in temps:
    at[t] = config.copy_and_resolve_references()
    at[t].temperature = float(t)
  sampled = {t: build.request(at[t], target) for t in temps if t > 0}
  rows = None
  if 0 in temps:
    simulate.check_supported(drafter)
    req = build.request(at[0], target)
    batches = req.batches()
    outs = [generate(target.params, target.cfg, b, **req.generate_kwargs()) for b in batches]
    prompts = [p for b in batches for p in b]
    rows = list(zip(prompts, [r for o in outs for r in o.tokens], strict=True))
    rows = rows[: len(req.prompts)]  # not a last batch's cycled fill

  def probe(params) -> dict:
    dparams = objective.model_params(jax.device_get(params), host_target)
    out = {}
    if rows is not None:
      out["tau/simulated"] = simulate.replay(target, drafter, dparams, rows).tau
    for t, req in sampled.items():
      out[f"tau/decoded_t{t:g}"] = _tau(target, drafter, dparams, req)["tau"]
    return out

  return probe


def _quiet_orbax(record: logging.LogRecord) -> bool:
  """Drops orbax's per-save INFO lines (a dozen per checkpoint); keeps its warnings."""
  return record.levelno >= logging.WARNING or "orbax" not in record.pathname


# What a run writes in its workdir (and reads back when it resumes); dot files are its lock and
# the temporary names of files being written.
RUN_FILES = (
  "checkpoints",
  "metrics.jsonl",
  "tensorboard",
  "draft_init",
  "draft_final",
  "train.json",
)


def check_workdir(workdir: str, *also: str) -> None:
  """A workdir is new, empty, or a training run's: one holding anything else (the user's own
  files) is refused, as the run would append to them or replace them. ``also``: other paths the
  run writes (``record_to``, ``profile``), the run's own where they lie inside it."""
  path = Path(workdir)
  if not path.is_dir():
    return
  own = set(RUN_FILES)
  for other_path in filter(None, also):
    if Path(other_path).resolve().is_relative_to(path.resolve()):
      own |= set(Path(other_path).resolve().relative_to(path.resolve()).parts[:1])
  other = sorted(
    e.name
    for e in path.iterdir()
    if not (e.name in own or e.name.startswith(".") or _DATA_STATE.fullmatch(e.name))
  )
  if other:
    named = ", ".join(other[:5]) + (", ..." if len(other) > 5 else "")
    raise ValueError(
      f"config.workdir={workdir!r} holds files a training run does not write ({named}): give "
      "the run a new or empty directory (nothing there was touched)."
    )


_DATA_STATE = re.compile(r"data_state\.\d+\.jsonl")  # a streamed run's position per process


def is_run(directory) -> bool:
  """Whether ``directory`` is a training run's workdir (its checkpoints or initial drafter)."""
  return any((Path(directory) / name).is_dir() for name in ("checkpoints", "draft_init"))


def check_record_to(record_to: str, workdir: str) -> None:
  """``record_to`` receives the run's ``train.json`` and ``metrics.jsonl`` (an experiment's
  committed results/<variant>/ that an earlier run recorded to is replaced): another run's
  workdir, or files of those names that are not a training record, are refused, untouched."""
  path = Path(record_to)
  if not record_to or path.resolve() == Path(workdir).resolve() or not path.is_dir():
    return
  field = f"config.record_to={record_to!r}"
  if is_run(path):
    raise ValueError(
      f"{field} is another training run's workdir: its train.json and metrics.jsonl would be "
      "replaced; record to a new directory or an experiment's results folder."
    )
  record = path / "train.json"
  try:
    ours = not record.exists() or {"config", "train_s"} <= set(json.loads(record.read_text()))
  except (OSError, ValueError, TypeError):
    ours = False
  if not ours or ((path / "metrics.jsonl").exists() and not record.exists()):
    theirs = "train.json" if not ours else "metrics.jsonl"
    raise ValueError(
      f"{field} holds a {theirs} that is not a training run's record: it would be replaced; "
      "record to a new directory (nothing there was touched)."
    )


def run(config: ml_collections.ConfigDict) -> dict:
  absl_logging.get_absl_handler().addFilter(_quiet_orbax)
  p = plan(config)
  parallel.initialize(p.distributed)
  if (note := warmup_note(p)) and jax.process_index() == 0:
    print(note)
  mesh = parallel.make_mesh(p.mesh)
  parallel.batch_size_per_shard(p.loop.global_batch, mesh)
  build.check(config)
  objectives.check_target(config, source.header_config(config.target))
  check_workdir(config.workdir, config.get("record_to") or "", config.get("profile") or "")
  check_record_to(config.get("record_to") or "", config.workdir)
  with loop.workdir_lock(Path(config.workdir) if config.workdir else None):
    pass  # another run on this workdir is refused now, not after the set-up; train holds it

  t0 = time.perf_counter()
  target = source.load(config.target)
  objective = objectives.build(config, target.cfg)
  train_ds, eval_ds = _load_data(config, target, objective)
  stats = train_ds.head(4096) if isinstance(train_ds, files.FileDataset) else train_ds
  objective = objective.with_data(stats, target.tokenizer)
  host_target = jax.device_get(target.params)
  streamed = isinstance(train_ds, files.FileDataset)
  rows = train_ds.describe() if streamed else f"{len(train_ds)} train"
  print(
    f"target {target.cfg.name} ({target.cfg.num_params() / 1e6:.1f} M params), "
    f"{objective.name}: {objective.describe()}, {rows} / "
    f"{len(eval_ds) if eval_ds else 0} eval rows of {train_ds.seq_len} tokens, mesh "
    f"{dict(mesh.shape)} over {jax.process_count()} process(es); setup "
    f"{time.perf_counter() - t0:.1f} s"
  )
  meta = {"data": {k: config.data[k] for k in ("seq_len", "seed", "max_examples")}}
  t_train = time.perf_counter()
  setup = {"target": artifact.fingerprint(target)}  # a resume with other weights is refused
  probe = _tau_probe(config, target, objective, host_target) if p.loop.probe_every else None
  result = loop.train(
    objective, host_target, train_ds, eval_ds, p.loop, p.optim, mesh, meta=meta, setup=setup,
    probe=probe,
  )  # fmt: skip
  train_s = time.perf_counter() - t_train

  final = result.state.params
  if jax.process_count() > 1:
    final = multihost_utils.process_allgather(final, tiled=True)
  final = objective.model_params(jax.device_get(final), host_target)
  if jax.process_index() != 0:
    return {}
  init = objective.model_params(
    step.initial_params(host_target, seed=p.loop.seed, objective=objective), host_target
  )
  workdir = Path(config.workdir)
  record = {
    "config": config.to_dict(),
    "train_s": train_s,
    "resumed_from": result.start_step,
    "last": [r for r in result.history if "loss" in r][-1:],
    "eval": [r for r in result.history if "eval/loss" in r][-1:],
  }
  for name, params in (("draft_init", init), ("draft_final", final)):
    objective.export(workdir / name, params, target)
  if config.evaluate.enabled:
    drafter = objective.drafter(config)
    req = build.request(config, target)
    record["decode"] = {
      "init": _tau(target, drafter, init, req),
      "final": _tau(target, drafter, final, req),
    }
    for k, v in record["decode"].items():
      print(f"draft {k}: tau {v['tau']:.3f}  alpha {[round(a, 3) for a in v['alpha']]}")
    simulated = [r["tau/simulated"] for r in result.history if r.get("step") == p.loop.steps
                 and "tau/simulated" in r]  # fmt: skip
    if simulated and config.temperature == 0:
      decoded = record["decode"]["final"]["tau"]
      record["tau_check"] = {"simulated": simulated[-1], "decoded": decoded}
      print(
        f"tau at step {p.loop.steps}: simulated {simulated[-1]:.3f}, decoded {decoded:.3f} "
        f"({abs(simulated[-1] / decoded - 1):.1%} apart)"
      )
  path = results.write_json(workdir / "train.json", record)
  print(f"wrote {path} and {workdir}/draft_init, {workdir}/draft_final")
  if config.get("record_to"):  # e.g. an experiment's committed results/<variant>/
    record_to = Path(config.record_to)
    results.write_json(record_to / "train.json", record)
    results.write_text(record_to / "metrics.jsonl", (workdir / "metrics.jsonl").read_text())
    print(f"and the record and its metrics to {record_to}/")
  return record
