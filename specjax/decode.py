"""generate(): speculative decoding from the host: prompts and budgets in, tokens and metrics out.

Checks every argument before anything compiles, pads prompts to a shared bucket, places
weights and rows on a mesh when one is given, and runs ``loop``'s one-jit decode loop (prefill,
then propose -> verify -> accept -> commit per step; its docstring has the design). Also:
``compiled`` (the program, ahead of time), ``footprint`` (bytes per device) and
``next_token_probs`` (the distribution ``generate`` samples from).
"""

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from specjax import indexing, placement, sampling, verify
from specjax import metrics as metrics_lib
from specjax.drafters import family
from specjax.drafters.base import Drafter, NoDraft, at_temperature
from specjax.loop import Limits, Static, jitted
from specjax.models import llama
from specjax.models.config import ModelConfig
from specjax.sampling import SamplingParams

AUTOREGRESSIVE = NoDraft()


@dataclasses.dataclass
class Generation:
  """Host-side result of ``generate``: per-row new tokens and the run's metrics."""

  tokens: list[list[int]]
  counts: dict[str, np.ndarray]  # raw metric counts: merge runs with metrics.merge
  metrics: dict[str, Any]  # derived: tau, alpha, ...
  local_rows: list[int] | None = None  # on a multi-process mesh: the rows this process holds


def bucket(n: int, least: int = 16) -> int:
  """The power of two >= ``n`` (and >= ``least``): a padded size many inputs share, so that
  they share one compiled program."""
  return max(least, 1 << (max(n, 1) - 1).bit_length())


def prompt_width(longest: int, max_len: int) -> int:
  """Prompts are padded to a power-of-two bucket (>= 16) so most batches share one compile."""
  return min(max_len, bucket(longest))


def generate(
  target_params,
  target_cfg: ModelConfig,
  prompts: Sequence[Sequence[int]],
  *,
  drafter: Drafter = AUTOREGRESSIVE,
  drafter_params: Any = None,
  max_new_tokens: int | Sequence[int] = 32,
  max_len: int = 256,
  temperature: float = 0.0,
  top_k: int = 0,
  top_p: float = 1.0,
  seed: int | jax.Array = 0,
  eos_id: int | Sequence[int] | None = None,
  verifier: Callable = verify.verify,
  pad_to: int = 0,
  mesh: Mesh | None = None,
  forward_rows: int = 0,
) -> Generation:
  """Generates continuations of ``prompts`` (token-id lists) with ``drafter``; lossless.

  Output: at temperature 0 every row is token for token the target's greedy continuation; at
  temperature > 0 (with top-k/top-p) every row is a sample of the target's own distribution
  (after ``sampling.probs``), whatever the drafter proposes. Rows draw independent random
  streams from ``seed``: a row's sample depends on its prompt and the seed, and rows of one
  batch are independent samples.

  Stopping: a row ends at ``max_new_tokens`` or right after a stop token (``eos_id``: one id or
  several, e.g. an instruct model's two end-of-turn markers). The stop token is included in
  the row's tokens.

  The verifier contract: ``verifier(key, draft, p[B, N+1, V], sampling) -> (end[B], next[B])``
  returns the last accepted node per row (0 = none; its depth is the accepted count) and the
  target's next token; the default (``verify.verify``) is lossless for chains and trees, and
  ``verify.TypicalAcceptance`` is Medusa's lossy rule.

  ``mesh`` (``placement.mesh_for``): the same loop with the weights tensor-parallel, the rows
  and caches split over the mesh (placement.py). Weights not yet placed are placed on each call:
  place them once with ``placement.place`` (as ``tasks/generate.py`` does). With several
  processes every process passes the same prompts and gets every row back; ``local_rows``
  says which rows its devices computed.

  Every argument is checked before anything is compiled. ``max_len`` bounds prompt plus new
  tokens per row and, with the batch size, the drafter and the model, fixes the compiled
  shapes; prompts, budgets, sampling knobs, seed and stop ids are traced (no recompile, except
  that temperature 0 and top-k/top-p filtering being on are static: ``SamplingParams``).
  Prompts are padded to a power-of-two width; ``pad_to`` (e.g. the longest prompt of a whole
  run) makes every batch of a run share one width, hence one compiled program.

  ``forward_rows`` > 0 runs every target forward after the prefill (AR steps, verifies,
  one-token steps of abstaining drafters) at that many rows, filler after the step's tokens:
  at least the drafter's rows per step (``num_nodes + num_extra + 1``). Runs that share it
  round alike, so greedy output equals AR's (at the same ``forward_rows``) bit for bit in
  bfloat16, where one-row and several-row products sum in different orders: a chain's, and a
  tree's, whose nodes each read their ancestors at consecutive places of the attention sum
  as AR does (``loop.target_forward``, ``llama.path_ordered``).
  """
  args, st = _arguments(
    target_params, target_cfg, prompts, drafter, drafter_params, max_new_tokens, max_len,
    temperature, top_k, top_p, seed, eos_id, verifier, pad_to, mesh, forward_rows,
  )  # fmt: skip
  fn, kw = jitted(st, args[0], args[1])
  tokens_d, num_new_d, metrics = fn(*args, **kw)
  tokens, num_new = placement.fetch(tokens_d), placement.fetch(num_new_d)
  rows = [tokens[r, len(p) : len(p) + num_new[r]].tolist() for r, p in enumerate(prompts)]
  counts = metrics_lib.counts(jax.device_get(metrics), num_new)
  local = placement.local_rows(tokens_d) if mesh is not None else None
  return Generation(rows, counts, metrics_lib.summarize(counts), local)


def _arguments(
  target_params, target_cfg, prompts, drafter, drafter_params, max_new_tokens, max_len,
  temperature, top_k, top_p, seed, eos_id, verifier, pad_to, mesh=None, forward_rows=0,
):  # fmt: skip
  """Checks ``generate``'s arguments (before anything compiles) and makes the jitted call's."""
  sp = SamplingParams.create(temperature, top_k, top_p)
  drafter = at_temperature(drafter, temperature)
  llama.check_params(target_cfg, target_params)
  drafter.check_target(target_cfg)
  where = family.placement_of(drafter)
  if where.check_params is not None:
    where.check_params(drafter, drafter_params)
  drafter.check_context(max_len)
  llama.check_context(target_cfg, max_len)
  cache_model = where.cache_model(drafter)
  if cache_model is not None:
    llama.check_context(cache_model, max_len)
  llama.check_features(target_cfg, drafter.feature_layers)
  b = len(prompts)
  if b == 0:
    raise ValueError("prompts is empty: pass at least one prompt (a list of token ids).")
  budgets = [max_new_tokens] * b if isinstance(max_new_tokens, int) else list(max_new_tokens)
  if len(budgets) != b:
    raise ValueError(f"max_new_tokens has {len(budgets)} entries for {b} prompts.")
  check_prompts(prompts, budgets, max_len, target_cfg.vocab_size)
  shape = {"data": 1, "fsdp": 1, "tensor": 1} if mesh is None else dict(mesh.shape)
  if mesh is not None:
    placement.check_batch(shape, b)
    placement.check_model(shape, target_cfg)
    if cache_model is not None:
      placement.check_model(shape, cache_model, "draft model")
  if isinstance(seed, int) and not 0 <= seed < 2**32:
    raise ValueError(f"seed must be an integer in [0, 2**32), got {seed}.")
  check_forward_rows(forward_rows, drafter)
  st = Static(
    target_cfg, drafter, max_len, verifier, prompt_width(max(pad_to, *map(len, prompts)), max_len),
    mesh, forward_rows,
  )  # fmt: skip
  rules = where.partition_rules(drafter)
  placement.check_fits(
    footprint(target_cfg, target_params, drafter, drafter_params, b, st.num_slots, shape, rules)
  )

  tokens_BxS = np.zeros((b, st.num_slots), np.int32)
  for r, prompt in enumerate(prompts):
    tokens_BxS[r, : len(prompt)] = prompt
  key = jax.random.key(seed) if isinstance(seed, int) else seed
  lengths = np.asarray([len(p) for p in prompts], np.int32)
  limits = Limits(np.asarray(budgets, np.int32), _stop_ids(eos_id))
  if mesh is None:
    args = (target_params, drafter_params, jnp.asarray(tokens_BxS), jnp.asarray(lengths), sp)
    return args + (jax.tree.map(jnp.asarray, limits), key), st
  args = (
    placement.place(target_params, llama.RULES, mesh),
    placement.place(drafter_params, rules, mesh),
    placement.put_rows(tokens_BxS, mesh),
    placement.put_rows(lengths, mesh),
    placement.put_replicated(sp, mesh),
    placement.put_replicated(limits, mesh),
    placement.put_replicated(jax.random.key_data(key), mesh),
  )
  return args, st


def footprint(
  target_cfg, target_params, drafter, drafter_params, batch, num_slots, mesh_shape, rules=()
) -> placement.Footprint:
  """Bytes one device holds: weights by their partition rules, the target's KV cache and the
  drafter's own (its family's ``placement.cache_model``: a draft model's, EAGLE's layer's),
  rows over data and kv heads over tensor."""
  parts = {
    "target weights": placement.bytes_per_device(target_params, llama.RULES, mesh_shape),
    "target KV cache": placement.cache_bytes(
      target_cfg, batch, num_slots, mesh_shape, np.dtype(llama.param_dtype(target_params)).itemsize
    ),
  }
  if drafter_params is not None:
    parts["drafter weights"] = placement.bytes_per_device(drafter_params, rules, mesh_shape)
  cache_model = family.placement_of(drafter).cache_model(drafter)
  if cache_model is not None:  # a draft model's cache, or EAGLE's layer's
    itemsize = np.dtype(llama.param_dtype(drafter_params)).itemsize
    parts["draft KV cache"] = placement.cache_bytes(
      cache_model, batch, num_slots, mesh_shape, itemsize
    )
  return placement.footprint(parts, mesh_shape)


def compiled(
  target_params,
  target_cfg: ModelConfig,
  prompts: Sequence[Sequence[int]],
  *,
  drafter: Drafter = AUTOREGRESSIVE,
  drafter_params: Any = None,
  max_new_tokens: int | Sequence[int] = 32,
  max_len: int = 256,
  verifier: Callable = verify.verify,
  pad_to: int = 0,
  mesh: Mesh | None = None,
  forward_rows: int = 0,
  temperature: float = 0.0,
  top_k: int = 0,
  top_p: float = 1.0,
) -> jax.stages.Compiled:
  """The compiled program ``generate`` runs for these shapes and sampling knobs (ahead of time,
  nothing run): for ``cost_analysis()``, ``as_text()`` (the optimised HLO) or timing a
  compile."""
  args, st = _arguments(
    target_params, target_cfg, prompts, drafter, drafter_params, max_new_tokens, max_len,
    temperature, top_k, top_p, 0, None, verifier, pad_to, mesh, forward_rows,
  )  # fmt: skip
  fn, kw = jitted(st, args[0], args[1])
  return fn.lower(*args, **kw).compile()


def check_forward_rows(forward_rows, drafter: Drafter) -> None:
  """0 (each forward its own rows) or at least the drafter's rows per step."""
  rows = drafter.num_nodes + drafter.num_extra + 1
  if not isinstance(forward_rows, int) or isinstance(forward_rows, bool) or forward_rows < 0:
    raise ValueError(f"forward_rows must be an integer >= 0 (0: off), got {forward_rows!r}.")
  if 0 < forward_rows < rows:
    raise ValueError(
      f"forward_rows={forward_rows} is fewer than the {rows} rows the drafter verifies per step "
      f"(root, nodes, extras): set forward_rows >= {rows}, or 0 to turn it off."
    )


def check_prompts(prompts, budgets: Sequence[int], max_len: int, vocab_size: int) -> None:
  """Each prompt is non-empty, in the vocabulary, and fits ``max_len`` with its token budget."""
  for r, (prompt, budget) in enumerate(zip(prompts, budgets, strict=True)):
    if len(prompt) == 0:
      raise ValueError(f"prompts[{r}] is empty: every prompt needs at least one token (e.g. BOS).")
    if budget < 1:
      raise ValueError(f"max_new_tokens must be >= 1, got {budget} for prompt {r}.")
    if len(prompt) + budget > max_len:
      raise ValueError(
        f"prompt {r} has {len(prompt)} tokens + max_new_tokens {budget} > max_len {max_len}: "
        "raise max_len or shorten the prompt."
      )
    if isinstance(prompt, str) or not all(_is_int(x) for x in prompt):
      raise ValueError(
        f"prompts[{r}] must be a list of integer token ids, got {str(prompt)[:40]!r}: encode "
        "text with the model's tokenizer first (or pass prompts as text to a task config)."
      )
    if min(prompt) < 0 or max(prompt) >= vocab_size:
      bad = next(x for x in prompt if not 0 <= x < vocab_size)
      raise ValueError(
        f"prompts[{r}] has token ids outside [0, {vocab_size}) (the target's vocabulary), e.g. "
        f"{bad} at position {list(prompt).index(bad)}."
      )


def _is_int(x) -> bool:
  return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


MAX_STOP_IDS = 8


def _stop_ids(eos_id) -> jax.Array:
  """Stop ids as a fixed-size array (padded with -1), so changing them never recompiles."""
  ids = [] if eos_id is None else [eos_id] if isinstance(eos_id, int) else sorted(set(eos_id))
  if len(ids) > MAX_STOP_IDS:
    raise ValueError(f"eos_id has {len(ids)} stop ids; at most {MAX_STOP_IDS} are supported.")
  return jnp.asarray(ids + [-1] * (MAX_STOP_IDS - len(ids)), jnp.int32)


@functools.partial(jax.jit, static_argnames=("cfg",))
def _next_token_probs(params, tokens_BxP, lengths_B, sp, *, cfg):
  logits_BxPxV, _ = llama.logits_of(params, cfg, tokens_BxP)
  last_BxV = indexing.take_along(logits_BxPxV, (lengths_B - 1)[:, None, None], axis=1)[:, 0]
  return sampling.probs(last_BxV, sp)


def next_token_probs(
  params,
  cfg: ModelConfig,
  prefixes: Sequence[Sequence[int]],
  *,
  temperature: float = 1.0,
  top_k: int = 0,
  top_p: float = 1.0,
) -> np.ndarray:
  """``[len(prefixes), V]``: the distribution ``generate`` samples the next token from after
  each prefix (temperature, top-k, top-p applied by ``sampling.probs``; one-hot at 0)."""
  sp = SamplingParams.create(temperature, top_k, top_p)
  if not prefixes:
    raise ValueError("prefixes is empty: pass at least one list of token ids.")
  check_prompts(prefixes, [1] * len(prefixes), 1 << 30, cfg.vocab_size)
  width = max(map(len, prefixes))
  tokens = np.zeros((len(prefixes), width), np.int32)
  for r, p in enumerate(prefixes):
    tokens[r, : len(p)] = p
  lengths = jnp.asarray([len(p) for p in prefixes], jnp.int32)
  return np.asarray(_next_token_probs(params, jnp.asarray(tokens), lengths, sp, cfg=cfg))
