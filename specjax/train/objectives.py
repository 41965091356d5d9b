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
``EagleFeatures`` (EAGLE's drafter layer on the target's features) lives with its drafter,
``drafters/eagle/objective.py``.
"""

import dataclasses
from pathlib import Path
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import ml_collections

from specjax import parallel
from specjax.drafters import artifact, medusa, prompt_lookup
from specjax.drafters.base import sampled_candidates
from specjax.drafters.draft_model import DraftModel
from specjax.drafters.eagle.objective import EagleFeatures
from specjax.models import llama
from specjax.models.config import ModelConfig
from specjax.train import export, losses
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
    c.temperature = 1.0  # KL at this temperature
    return c

  @classmethod
  def check(cls, c: ml_collections.ConfigDict) -> None:
    if c.embed not in EMBED_MODES:
      raise ValueError(
        f"config.objective.draft_distill.embed={c.embed!r} is unknown; choose one of "
        f"{', '.join(EMBED_MODES)}."
      )

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
    return cls(target, draft_cfg, temperature=c.temperature, embed=c.embed)

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
    return losses.distill_kl(teacher_BxTxV, student_BxTxV, batch["mask"], self.temperature)

  def signature(self) -> dict[str, Any]:
    return {
      "objective": self.name,
      "embed": self.embed,
      "draft": dataclasses.asdict(self.draft_cfg),
      "target": self.target_cfg.name,
    }


@dataclasses.dataclass(frozen=True)
class MedusaHeads:
  """Medusa-1: heads on the frozen target's final hidden state (``drafters/medusa.py``).

  Head k at position t learns the target's distribution at t + k (one target forward per
  batch gives every head its labels), weighted ``decay ** (k - 1)``. With a reduced draft
  vocabulary (``vocab_size`` < the target's), ``with_data`` picks the ``vocab_size`` most
  frequent tokens of the training rows (stop tokens always in).
  """

  target_cfg: ModelConfig
  heads: medusa.HeadsConfig
  decay: float = 0.8
  vocab_ids: tuple | None = None  # the draft vocabulary's target ids; None = all of them
  init_from: str = ""  # heads to start from (their vocabulary kept); "" = fresh heads
  name: str = "medusa"
  rules: parallel.Rules = ()
  frozen_rules: parallel.Rules = llama.RULES

  @staticmethod
  def config() -> ml_collections.ConfigDict:
    """``config.objective.medusa``: the heads' shape and the per-head loss decay."""
    c = ml_collections.ConfigDict()
    c.num_heads = 4  # H: head k drafts the token k places after the newest
    c.num_layers = 1  # residual layers per head
    c.vocab_size = 0  # draft vocabulary V' (0 = the target's): the most frequent training tokens
    c.own_proj = False  # False: every head uses the target's frozen head (only W, b trained)
    c.decay = 0.8  # loss weight decay ** (k - 1) of head k
    c.init_from = ""  # trained heads (a draft_final directory) to continue from; "" = fresh
    return c

  @classmethod
  def check(cls, c: ml_collections.ConfigDict) -> None:
    f = "config.objective.medusa"
    for key in ("num_heads", "num_layers"):
      if int(c[key]) != c[key] or c[key] < 1:
        raise ValueError(f"{f}.{key} must be an integer >= 1, got {c[key]}.")
    if int(c.vocab_size) != c.vocab_size or c.vocab_size < 0:
      raise ValueError(f"{f}.vocab_size must be an integer >= 0 (0 = the target's).")
    if not 0 < c.decay <= 1:
      raise ValueError(f"{f}.decay must be in (0, 1], got {c.decay}.")
    if c.init_from:
      got = medusa.read_meta(c.init_from, f"{f}.init_from")["heads"]
      for key in ("num_heads", "num_layers", "own_proj"):
        if got[key] != c[key]:
          raise ValueError(
            f"{f}.init_from={c.init_from!r} holds heads with {key}={got[key]}, but "
            f"{f}.{key}={c[key]}: make them equal, or start fresh (init_from='')."
          )
      if c.vocab_size and got["vocab_size"] != c.vocab_size:
        raise ValueError(
          f"{f}.init_from={c.init_from!r} has a draft vocabulary of {got['vocab_size']}, but "
          f"{f}.vocab_size={c.vocab_size}: set it to {got['vocab_size']} (it is kept)."
        )

  @classmethod
  def build(cls, c: ml_collections.ConfigDict, target: ModelConfig) -> "MedusaHeads":
    if c.vocab_size > target.vocab_size:
      raise ValueError(
        f"config.objective.medusa.vocab_size={c.vocab_size} exceeds the target's vocabulary "
        f"({target.vocab_size}); use 0 for all of it."
      )
    heads = medusa.HeadsConfig(
      dim=target.dim,
      num_heads=c.num_heads,
      vocab_size=c.vocab_size or target.vocab_size,
      target_vocab_size=target.vocab_size,
      num_layers=c.num_layers,
      own_proj=c.own_proj,
    )
    return cls(target, heads, decay=c.decay, init_from=c.init_from)

  def with_data(self, dataset, tokenizer) -> "MedusaHeads":
    """Picks the reduced draft vocabulary: the most frequent tokens of the counted positions'
    next tokens, stop tokens first."""
    if self.init_from:  # the heads started from keep their vocabulary
      ids = medusa.read_tensors(self.init_from)["vocab_ids"]
      return dataclasses.replace(self, vocab_ids=tuple(int(i) for i in ids))
    if not self.heads.reduced:
      return self
    ids = artifact.frequent_ids(
      dataset, self.target_cfg.vocab_size, self.heads.vocab_size, tokenizer
    )
    return dataclasses.replace(self, vocab_ids=ids)

  def cached_features(self) -> tuple:
    return ()

  def _vocab(self) -> jax.Array:
    if self.vocab_ids is None:
      return jnp.arange(self.heads.vocab_size, dtype=jnp.int32)
    return jnp.asarray(self.vocab_ids, jnp.int32)

  def describe(self) -> str:
    h = self.heads
    n = h.num_heads * h.num_layers * (h.dim + 1) * h.dim + (
      h.num_heads * h.vocab_size * h.dim if h.own_proj else 0
    )
    return (
      f"{h.num_heads} Medusa heads x {h.num_layers} layer(s), draft vocabulary {h.vocab_size}, "
      f"{'own' if h.own_proj else 'the target'}'s projection ({n / 1e6:.2f} M trained params)"
    )

  def init(self, key: jax.Array, frozen: Params) -> Params:
    del key  # Medusa's init is deterministic: identity residual layers, the target's head
    keys = medusa.TRAINED[self.heads.own_proj]
    if self.init_from:
      tensors = medusa.read_tensors(self.init_from)
      return {k: jnp.asarray(tensors[k]) for k in keys}
    params = medusa.init_heads(self.heads, frozen, self.target_cfg, self._vocab())
    return {k: params[k] for k in keys}

  def model_params(self, params: Params, frozen: Params) -> Params:
    out = dict(params, vocab_ids=self._vocab())
    if not self.heads.own_proj:
      out["proj"] = medusa.target_head(frozen, self.target_cfg)[self._vocab()][None]
    return out

  def loss(self, params, frozen, batch, key):
    del key
    logits_BxTxV, feats = llama.logits_of(frozen, self.target_cfg, batch["tokens"], ("final",))
    h_BxTxF = jax.lax.stop_gradient(feats[0])
    heads_BxTxHxW = medusa.head_logits(self.model_params(params, frozen), h_BxTxF)
    return losses.medusa_xent(logits_BxTxV, heads_BxTxHxW, self._vocab(), batch["mask"], self.decay)

  def signature(self) -> dict[str, Any]:
    return {
      "objective": self.name,
      "heads": dataclasses.asdict(self.heads),
      "decay": self.decay,
      "init_from": self.init_from,
      "target": self.target_cfg.name,
    }

  def drafter(self, config: ml_collections.ConfigDict) -> medusa.Medusa:
    c = config.drafter.medusa
    sampled = sampled_candidates(c, medusa.FIELD)
    return medusa.Medusa(self.heads, medusa.parse_tree(c), sampled, prompt_lookup.branch(c))

  def export(self, directory: Path, params: Params, target) -> Path:
    """Heads that ``drafter.medusa.path`` loads (with the target's fingerprint)."""
    extra = {"decay": self.decay, "init_from": self.init_from}
    return medusa.save(directory, self.heads, params, target, None, extra)


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
  """The chosen objective's own checks, before anything is loaded."""
  _cls(config).check(config.objective[config.objective.name])


def build(config: ml_collections.ConfigDict, target: ModelConfig) -> Objective:
  return _cls(config).build(config.objective[config.objective.name], target)
