"""Turns a ConfigDict into the frozen objects the library takes, checking it on the way.

Config never crosses a jit boundary: this module is the edge. ``check`` raises a ValueError
naming the config field and the fix before any model is loaded or compiled.

The target comes from ``config.target`` (a model source: random, registry, gguf, safetensors;
see models/source.py); the drafter from ``config.drafter`` by name through the registry in
``specjax.drafters``, each drafter reading its own subsection.
"""

import dataclasses
from typing import Any

import ml_collections
import numpy as np

from specjax import decode, drafters, results, sampling, verify
from specjax.models import source
from specjax.models.source import Model

VERIFIERS = ("rejection", "typical")

__all__ = ["Model", "Request", "check", "drafter", "request", "target", "verifier"]


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
    """``generate``'s keyword arguments; every batch is padded like the longest prompt, so the
    whole request compiles once per mode."""
    keys = ("max_new_tokens", "max_len", "temperature", "top_k", "top_p", "seed", "eos_id")
    return {k: getattr(self, k) for k in keys} | {"pad_to": max(map(len, self.prompts))}


def check(config: ml_collections.ConfigDict) -> None:
  """All cheap checks, run before anything is loaded."""
  source.check(config.target, "target")
  drafters.check(config)
  source.choice(config.verifier, VERIFIERS, "verifier")
  verifier(config)
  sampling.validate(config.temperature, config.top_k, config.top_p)
  if config.batch_size < 1:
    raise ValueError(f"config.batch_size must be >= 1, got {config.batch_size}.")
  for i, p in enumerate(config.get("prompts", ())):
    if isinstance(p, str):
      try:
        p.encode("utf-8")
      except UnicodeEncodeError as e:
        raise ValueError(
          f"config.prompts[{i}] is not valid Unicode text ({e.reason} at {e.start}): fix the "
          "string."
        ) from None
  if not (isinstance(config.seed, int) and 0 <= config.seed < 2**32):
    raise ValueError(f"config.seed must be an integer in [0, 2**32), got {config.seed}.")
  if "benchmark" in config and not config.benchmark.repeats >= 1:
    raise ValueError(
      f"config.benchmark.repeats must be >= 1 (timed runs after the compile run), got "
      f"{config.benchmark.repeats}."
    )
  check_request(config)
  out = "workdir" if config.get("task") == "train" else "output_dir"
  if config.get("task") != "generate" and config.get(out):
    results.check_writable(config[out], f"config.{out}")


def check_request(config: ml_collections.ConfigDict) -> None:
  """The prompts against ``max_len`` and the vocabulary, and the KV cache against this
  machine's memory, from the target's header and tokenizer: before its weights load."""
  model = source.peek(config.target)
  if model is None:
    return
  req = request(config, model)
  budgets = [req.max_new_tokens] * len(req.prompts)
  try:
    decode.check_prompts(req.prompts, budgets, req.max_len, model.cfg.vocab_size)
    decode.check_memory(model.cfg, req.batch_size, req.max_len)
  except ValueError as e:
    raise ValueError(f"{e} (config.max_len, config.max_new_tokens, config.prompts)") from None


def target(config: ml_collections.ConfigDict) -> Model:
  return source.load(config.target)


def drafter(config: ml_collections.ConfigDict, target: Model):
  """Returns ``(drafter, drafter_params)``: ``config.drafter.name`` from the registry."""
  return drafters.build(config, target)


def verifier(config: ml_collections.ConfigDict):
  """The lossless rule, or Medusa's typical acceptance (lossy, opt-in)."""
  if config.verifier == "typical":
    return verify.TypicalAcceptance(config.typical.epsilon, config.typical.delta)
  return verify.verify


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
