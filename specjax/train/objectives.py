"""What is trained and against what: the one interface a new drafter's training plugs into.

An ``Objective`` owns the trainable params and the loss; the train loop (``train/loop.py``)
owns everything else (mesh, optimiser, checkpoints, data order, logging). Medusa or EAGLE
heads train by supplying another objective, not another loop:

    init(key, frozen) -> params               trainable params (may read the frozen target)
    loss(params, frozen, batch, key) -> (scalar, {name: scalar})   pure, jit-able
    model_params(params, frozen) -> params    what the drafter decodes with
    rules, frozen_rules                       partition rules (see specjax/parallel.py)
    signature() -> dict                       shapes a checkpoint must match (JSON-able)
    drafter(config) -> Drafter                the drafter that decodes with model_params
    export(directory, params, target)         the trained drafter, in a format it loads from
    with_data(dataset, tokenizer) -> Objective  what the objective takes from the training data
    cached_features() -> tuple                target features its loss can read from the batch
                                              (``config.data.feature_cache``; () = none)

and as classmethods ``config()`` (its subsection's defaults), ``check(c)`` (the subsection's
fields, before anything loads), ``build(c, target_cfg)``, and optionally
``check_seq_len(c, seq_len)``: its sizes against ``config.data.seq_len``, whose rows must hold
a label for each (a head or depth that never sees one trains on nothing).

``frozen`` is the target's params: sharded like the trainable ones, never differentiated.
Objectives are chosen by name (``config.objective.name``) from ``registry()``: the
``objective`` of every drafter family record (``drafters/family.py``), so a drafter package
that declares one is trainable with no edit here. Each reads its own config subsection
(``config.objective.<name>``, defaults from its ``config()``) in ``build``. They live with their
drafters: ``DraftDistill`` (a small draft model distilled from the target, DistillSpec) in
``drafters/draft_model/objective.py``, ``MedusaHeads`` (Medusa-1 heads on the target's final
state) and ``EagleFeatures`` (EAGLE's layer on the target's features) in their packages.
"""

import importlib.util
import re
from pathlib import Path
from typing import Any, Protocol

import jax
import ml_collections

from specjax import parallel
from specjax.drafters import family
from specjax.drafters.draft_model.objective import DraftDistill
from specjax.models.config import ModelConfig
from specjax.typing import Params

__all__ = [
  "DraftDistill", "Objective", "build", "check", "check_target", "default_config", "registry",
  "run_output",
]  # fmt: skip


class Objective(Protocol):
  name: str
  rules: parallel.Rules
  frozen_rules: parallel.Rules

  def init(self, key: jax.Array, frozen: Params) -> Params: ...

  def loss(
    self, params: Params, frozen: Params, batch: dict[str, jax.Array], key: jax.Array
  ) -> tuple[jax.Array, dict[str, jax.Array]]: ...

  def model_params(self, params: Params, frozen: Params) -> Params: ...

  def signature(self) -> dict[str, Any]: ...

  def describe(self) -> str: ...

  def drafter(self, config: ml_collections.ConfigDict) -> Any: ...

  def export(self, directory: Path, params: Params, target) -> Path: ...

  def with_data(self, dataset, tokenizer) -> "Objective": ...

  def cached_features(self) -> tuple: ...


def registry() -> dict[str, type]:
  """``{objective name: class}``: the objective of every registered drafter family."""
  return {f.objective.name: f.objective for f in family.FAMILIES.values() if f.objective}


def default_config(name: str = "draft_distill") -> ml_collections.ConfigDict:
  """The ``objective`` config section: ``name`` and every registered objective's subsection."""
  c = ml_collections.ConfigDict()
  c.name = name  # one of registry()
  for key, cls in registry().items():
    c[key] = cls.config()
  return c


def _cls(config: ml_collections.ConfigDict) -> type:
  objectives = registry()
  if config.objective.name not in objectives:
    raise ValueError(
      f"config.objective.name={config.objective.name!r} is unknown; choose one of "
      f"{', '.join(objectives)}."
    )
  return objectives[config.objective.name]


def check(config: ml_collections.ConfigDict) -> None:
  """The chosen objective's own checks, before anything is loaded: its fields, and its sizes
  against the rows' ``config.data.seq_len`` (when the config has data) that its labels must fit
  in; an ``init_from`` naming a run (``"<experiment>:<variant>"``) is replaced by that run's
  output first."""
  name = config.objective.get("name")
  sub = config.objective.get(name) if name in registry() else None
  if sub is not None and sub.get("init_from"):
    sub.init_from = run_output(sub.init_from, f"config.objective.{name}.init_from")
  cls, c = _cls(config), config.objective[config.objective.name]
  cls.check(c)
  seq_len = config.get("data", {}).get("seq_len")
  if seq_len is not None and hasattr(cls, "check_seq_len"):
    cls.check_seq_len(c, seq_len)


def check_target(config: ml_collections.ConfigDict, target: ModelConfig) -> None:
  """The objective's checks against the target's sizes (``target``: from its header, see
  ``source.header_config``), before its weights load: the objective built and dropped."""
  build(config, target)


RUN = re.compile(r"([A-Za-z0-9_]+):([A-Za-z0-9_]+)")


def run_output(ref: str, field: str) -> str:
  """The trained drafter a run wrote (``<its workdir>/draft_final``), for ``ref`` =
  ``"<experiment>:<variant>"`` (``experiments/<experiment>/config.py``, read from the working
  directory, called with ``<variant>``), so a run that continues another names it rather than
  a path; any other ``ref`` (a path) is returned as it is."""
  match = RUN.fullmatch(ref)
  if match is None or Path(ref).exists():
    return ref
  experiment, variant = match.groups()
  path = Path("experiments") / experiment / "config.py"
  if not path.is_file():
    raise ValueError(
      f"{field}={ref!r} names no run: there is no {path} here (run from the repository root) "
      "and no such path."
    )
  spec = importlib.util.spec_from_file_location(f"_run_{experiment}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  try:
    c = module.get_config(variant)
  except ValueError as e:
    raise ValueError(f"{field}={ref!r}: {e}") from None
  if c.get("task") != "train" or not c.get("workdir"):
    raise ValueError(
      f"{field}={ref!r} is not a training run (task={c.get('task')!r}): name a variant that "
      "trains a drafter."
    )
  out = Path(c.workdir) / "draft_final"
  if not out.exists():
    raise ValueError(
      f"{field}={ref!r} is {out}, which does not exist yet: train it first "
      f"(python -m specjax.run --config={path}:{variant})."
    )
  return str(out)


def build(config: ml_collections.ConfigDict, target: ModelConfig) -> Objective:
  return _cls(config).build(config.objective[config.objective.name], target)
