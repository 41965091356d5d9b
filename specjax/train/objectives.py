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

``frozen`` is the target's params: sharded like the trainable ones, never differentiated.
Objectives are chosen by name (``config.objective.name``) from ``REGISTRY``; each reads its own
config subsection (``config.objective.<name>``, defaults from its ``config()``) in ``build``.
``DraftDistill`` distils a small Llama-family draft model from the target by forward KL over
every counted position of target-written text (DistillSpec). ``MedusaHeads`` trains Medusa
heads on the frozen target's final hidden states against its own predictions (Medusa-1).
``MedusaHeads`` and ``EagleFeatures`` (EAGLE's layer on the target's features) live with their
drafters, ``drafters/medusa/objective.py`` and ``drafters/eagle/objective.py``.
"""

import dataclasses
import importlib.util
import re
from pathlib import Path
from typing import Any, Protocol

import jax
import ml_collections

from specjax import losses, parallel
from specjax.drafters.draft_model import DraftModel
from specjax.drafters.eagle.objective import EagleFeatures
from specjax.drafters.medusa.objective import MedusaHeads
from specjax.models import llama
from specjax.models.config import ModelConfig
from specjax.train import export
from specjax.typing import Params

EMBED_MODES = ("random", "copy", "frozen")


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


def full_logits(params: Params, cfg: ModelConfig, tokens_BxT: jax.Array) -> jax.Array:
  """Causal logits over whole sequences: one forward into an empty cache of exactly T slots."""
  return llama.logits_of(params, cfg, tokens_BxT)[0]


@dataclasses.dataclass(frozen=True)
class DraftDistill:
  """Draft model ``draft_cfg`` trained to match target ``target_cfg``'s next-token distribution.

  ``embed``: ``random`` (own embedding, trained), ``copy`` (initialised from the target's
  embedding and head, trained), or ``frozen`` (the target's embedding and head, not trained:
  fewer trainable params, less optimiser state). ``copy`` and ``frozen`` need the draft's
  ``dim`` to equal the target's.
  """

  target_cfg: ModelConfig
  draft_cfg: ModelConfig
  temperature: float = 1.0
  embed: str = "copy"
  init_std: float = 0.02  # embedding std for embed = random
  token_loss: str = "kl"  # losses.TOKEN_LOSSES, at ``temperature``
  name: str = "draft_distill"
  rules: parallel.Rules = llama.RULES
  frozen_rules: parallel.Rules = llama.RULES

  @staticmethod
  def config() -> ml_collections.ConfigDict:
    """``config.objective.draft_distill``: the draft's shape and the KL temperature."""
    c = ml_collections.ConfigDict()
    c.name = "tiny-draft"  # the exported draft's name
    c.num_layers = 1
    c.dim = 0  # 0 = the target's (needed by embed = copy | frozen)
    c.num_heads = 4
    c.num_kv_heads = 2
    c.ffn_dim = 128
    c.head_dim = 0  # 0 = dim // num_heads
    c.embed = "copy"  # random | copy (target's embedding, trained) | frozen (not trained)
    c.temperature = 1.0  # the loss at this temperature
    c.loss = "kl"  # forward KL, or another of specjax.losses.TOKEN_LOSSES
    return c

  @classmethod
  def check(cls, c: ml_collections.ConfigDict) -> None:
    if c.embed not in EMBED_MODES:
      raise ValueError(
        f"config.objective.draft_distill.embed={c.embed!r} is unknown; choose one of "
        f"{', '.join(EMBED_MODES)}."
      )
    losses.check_token_loss(c.loss, "config.objective.draft_distill.loss")

  @classmethod
  def build(cls, c: ml_collections.ConfigDict, target: ModelConfig) -> "DraftDistill":
    draft_cfg = dataclasses.replace(
      target,
      dim=c.dim or target.dim,
      num_layers=c.num_layers,
      num_heads=c.num_heads,
      num_kv_heads=c.num_kv_heads,
      ffn_dim=c.ffn_dim,
      head_dim=c.head_dim,
      name=c.name,
    )
    return cls(target, draft_cfg, temperature=c.temperature, embed=c.embed, token_loss=c.loss)

  def describe(self) -> str:
    d = self.draft_cfg
    return f"draft {d.num_layers} layers x {d.dim} ({d.num_params() / 1e6:.1f} M params)"

  def drafter(self, config: ml_collections.ConfigDict) -> DraftModel:
    return DraftModel(self.draft_cfg, config.drafter.draft_model.num_draft)

  def export(self, directory: Path, params: Params, target) -> Path:
    """An HF-style directory that ``drafter.draft_model.model.source=safetensors`` loads."""
    return export.save_model(directory, self.draft_cfg, params, target.tokenizer)

  def with_data(self, dataset, tokenizer) -> "DraftDistill":
    return self

  def cached_features(self) -> tuple:
    return ()

  def __post_init__(self):
    if self.draft_cfg.vocab_size != self.target_cfg.vocab_size:
      raise ValueError(
        f"draft.vocab_size ({self.draft_cfg.vocab_size}) != target vocab_size "
        f"({self.target_cfg.vocab_size}): a draft must share the target's tokenizer."
      )
    if self.embed not in EMBED_MODES:
      raise ValueError(f"draft.embed={self.embed!r} is unknown; choose one of {EMBED_MODES}.")
    if self.embed != "random" and self.draft_cfg.dim != self.target_cfg.dim:
      raise ValueError(
        f"draft.embed={self.embed!r} reuses the target's embedding, so draft.dim must be "
        f"{self.target_cfg.dim} (got {self.draft_cfg.dim}); or set draft.embed='random'."
      )
    if self.embed == "frozen" and self.draft_cfg.tie_embeddings != self.target_cfg.tie_embeddings:
      raise ValueError(
        "draft.embed='frozen' uses the target's head as is, so draft tie_embeddings must be "
        f"{self.target_cfg.tie_embeddings} like the target's."
      )
    if not self.temperature > 0:
      raise ValueError(f"distill temperature must be > 0, got {self.temperature}.")

  def _shared(self, frozen: Params) -> Params:
    """The target's embedding (and untied head), in the draft's layout."""
    shared = {"embed": frozen["embed"]}
    if not self.draft_cfg.tie_embeddings:
      shared["lm_head"] = frozen["embed"] if self.target_cfg.tie_embeddings else frozen["lm_head"]
    return shared

  def init(self, key: jax.Array, frozen: Params) -> Params:
    params = llama.init_params(self.draft_cfg, key, embed_std=self.init_std)
    if self.embed == "copy":
      params |= self._shared(frozen)
    elif self.embed == "frozen":
      params = {k: v for k, v in params.items() if k not in ("embed", "lm_head")}
    return params

  def model_params(self, params: Params, frozen: Params) -> Params:
    return params | self._shared(frozen) if self.embed == "frozen" else params

  def loss(self, params, frozen, batch, key):
    del key  # deterministic objective
    tokens_BxT = batch["tokens"]
    teacher_BxTxV = full_logits(frozen, self.target_cfg, tokens_BxT)
    student_BxTxV = full_logits(self.model_params(params, frozen), self.draft_cfg, tokens_BxT)
    return losses.distill_kl(
      teacher_BxTxV, student_BxTxV, batch["mask"], self.temperature, self.token_loss
    )

  def signature(self) -> dict[str, Any]:
    return {
      "objective": self.name,
      "embed": self.embed,
      "draft": dataclasses.asdict(self.draft_cfg),
      "target": self.target_cfg.name,
      "loss": self.token_loss,
    }


REGISTRY: dict[str, type] = {
  "draft_distill": DraftDistill,
  "medusa": MedusaHeads,
  "eagle": EagleFeatures,
}


def default_config(name: str = "draft_distill") -> ml_collections.ConfigDict:
  """The ``objective`` config section: ``name`` and every registered objective's subsection."""
  c = ml_collections.ConfigDict()
  c.name = name  # one of REGISTRY
  for key, cls in REGISTRY.items():
    c[key] = cls.config()
  return c


def _cls(config: ml_collections.ConfigDict) -> type:
  if config.objective.name not in REGISTRY:
    raise ValueError(
      f"config.objective.name={config.objective.name!r} is unknown; choose one of "
      f"{', '.join(REGISTRY)}."
    )
  return REGISTRY[config.objective.name]


def check(config: ml_collections.ConfigDict) -> None:
  """The chosen objective's own checks, before anything is loaded; an ``init_from`` naming a
  run (``"<experiment>:<variant>"``) is replaced by that run's output first."""
  name = config.objective.get("name")
  sub = config.objective.get(name) if name in REGISTRY else None
  if sub is not None and sub.get("init_from"):
    sub.init_from = run_output(sub.init_from, f"config.objective.{name}.init_from")
  _cls(config).check(config.objective[config.objective.name])


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
