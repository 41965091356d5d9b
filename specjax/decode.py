"""generate(): speculative decoding from the host: prompts and budgets in, tokens and metrics out.

Checks every argument before anything compiles, pads prompts to a shared bucket, places
weights and rows on a mesh when one is given, and runs ``loop``'s one-jit decode loop (prefill,
then propose -> verify -> accept -> commit per step; its docstring has the design). Also:
``compiled`` (the program, ahead of time), ``footprint`` (bytes per device) and
``next_token_probs`` (the distribution ``generate`` samples from).
"""

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from specjax import indexing, parallel, placement, sampling, verify
from specjax import metrics as metrics_lib
from specjax.drafters import family
from specjax.drafters.base import Drafter, NoDraft, at_temperature, check_integer, is_integer
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
  if not isinstance(target_cfg, ModelConfig):
    raise ValueError(
      f"target_cfg must be a ModelConfig (the config loaded with target_params), got "
      f"{type(target_cfg).__name__}: pass the cfg that models.tiny / a checkpoint load returns."
    )
  check_drafter(drafter, drafter_params)
  check_verifier(verifier)
  check_integer(max_len, "max_len", 1, "prompt plus new tokens per row")
  check_integer(pad_to, "pad_to", 0, "0: the longest prompt of this batch")
  check_mesh(mesh)
  prompts = as_prompts(prompts)
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
  budgets = _budgets(max_new_tokens, b)
  check_prompts(prompts, budgets, max_len, target_cfg.vocab_size)
  stop_ids = _stop_ids(eos_id, target_cfg.vocab_size)
  key = _key(seed)
  shape = {"data": 1, "fsdp": 1, "tensor": 1} if mesh is None else dict(mesh.shape)
  if mesh is not None:
    placement.check_batch(shape, b)
    placement.check_model(shape, target_cfg)
    if cache_model is not None:
      placement.check_model(shape, cache_model, "draft model")
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
  lengths = np.asarray([len(p) for p in prompts], np.int32)
  limits = Limits(np.asarray(budgets, np.int32), stop_ids)
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


def check_drafter(drafter, drafter_params) -> None:
  """A drafter instance, and ``drafter_params`` only for a drafter that takes weights."""
  if isinstance(drafter, type) or not all(
    hasattr(drafter, a) for a in ("name", "num_draft", "check_target", "propose")
  ):
    what = f"the class {drafter.__name__}" if isinstance(drafter, type) else repr(drafter)[:40]
    raise ValueError(
      f"drafter must be a drafter instance, e.g. DraftModel(draft_cfg, num_draft=4) or "
      f"PromptLookup(4) (specjax.drafters), got {what}."
    )
  record = family.FAMILIES.get(drafter.name)
  takes_none = isinstance(drafter, NoDraft) or (
    record is not None and record.placement.check_params is None
  )
  if drafter_params is not None and takes_none:
    raise ValueError(
      f"drafter {drafter.name!r} takes no drafter_params, got {type(drafter_params).__name__}: "
      "pass the drafter they belong to (e.g. drafter=DraftModel(draft_cfg, 4)), or leave "
      "drafter_params out."
    )


def check_verifier(verifier) -> None:
  """A function ``(key, draft, p, sampling) -> (end, next)``: an instance, not a class."""
  if isinstance(verifier, type):
    raise ValueError(
      f"verifier must be a verifier function, got the class {verifier.__name__}: pass an "
      f"instance, e.g. {verifier.__name__}()."
    )
  if not callable(verifier):
    raise ValueError(
      "verifier must be a function (key, draft, p, sampling) -> (end, next), e.g. "
      f"verify.verify (lossless) or verify.TypicalAcceptance() (lossy), got {verifier!r:.40}."
    )


def check_mesh(mesh) -> None:
  """None (one device) or a Mesh over ``parallel.AXES`` (``placement.mesh_for`` makes one)."""
  shape = getattr(mesh, "shape", None)
  if mesh is not None and not (isinstance(shape, Mapping) and set(shape) == set(parallel.AXES)):
    got = f"one with axes {tuple(shape)}" if isinstance(shape, Mapping) else f"{mesh!r:.40}"
    raise ValueError(
      f"mesh must be a jax.sharding.Mesh with axes {parallel.AXES} (placement.mesh_for makes "
      f"one) or None for one device, got {got}."
    )


def as_prompts(prompts, field: str = "prompts") -> list:
  """``prompts`` as a list of rows: a list or tuple of token-id lists, or a 2D numpy or jax
  array of ids (a jax array comes to the host); each row a list, tuple or 1D array."""
  if isinstance(prompts, jax.Array):
    prompts = np.asarray(prompts)
  if isinstance(prompts, np.ndarray) and prompts.ndim != 2:
    raise ValueError(f"{field} as an array must be 2D [rows, ids], got shape {prompts.shape}.")
  if not isinstance(prompts, (list, tuple, np.ndarray)):
    hint = (
      "encode text with the model's tokenizer first" if isinstance(prompts, str) else "list(...)"
    )
    raise ValueError(
      f"{field} must be a list of prompts (each a list of token ids), got "
      f"{type(prompts).__name__}: {hint}."
    )
  if len(prompts) == 0:
    raise ValueError(f"{field} is empty: pass at least one prompt (a list of token ids).")
  rows = []
  for r, row in enumerate(prompts):
    if isinstance(row, jax.Array):
      row = np.asarray(row)
    if not isinstance(row, (list, tuple, np.ndarray, str)) or getattr(row, "ndim", 1) != 1:
      hint = f": {field} is a list of prompts, so one prompt is [[...]]" if is_integer(row) else ""
      raise ValueError(f"{field}[{r}] is {str(row)[:40]}, not a list of token ids{hint}.")
    rows.append(row)
  return rows


def _budgets(max_new_tokens, b: int) -> list[int]:
  """One token budget per prompt: an integer for all, or a list of one each."""
  if is_integer(max_new_tokens):
    return [int(max_new_tokens)] * b
  if not isinstance(max_new_tokens, (list, tuple, np.ndarray)):
    raise ValueError(
      f"max_new_tokens must be an integer >= 1 (or a list, one per prompt), got "
      f"{max_new_tokens!r:.40}."
    )
  for r, n in enumerate(max_new_tokens):
    if not is_integer(n):
      raise ValueError(f"max_new_tokens[{r}] must be an integer >= 1, got {n!r:.40}.")
  if len(max_new_tokens) != b:
    raise ValueError(f"max_new_tokens has {len(max_new_tokens)} entries for {b} prompts.")
  return [int(n) for n in max_new_tokens]


def _key(seed) -> jax.Array:
  """An integer seed's key, or a key given as one (new-style, or raw ``uint32[2]`` data)."""
  if is_integer(seed) and 0 <= seed < 2**32:
    return jax.random.key(int(seed))
  if isinstance(seed, jax.Array) and (
    (jax.dtypes.issubdtype(seed.dtype, jax.dtypes.prng_key) and seed.shape == ())
    or (seed.dtype == jnp.uint32 and seed.shape == (2,))
  ):
    return seed
  got = f"an array of shape {seed.shape}" if isinstance(seed, jax.Array) else f"{seed!r:.40}"
  raise ValueError(f"seed must be an integer in [0, 2**32) or one jax.random.key, got {got}.")


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
    if isinstance(prompt, str) or not all(is_integer(x) for x in prompt):
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


MAX_STOP_IDS = 8


def _stop_ids(eos_id, vocab_size: int) -> np.ndarray:
  """Stop ids as a fixed-size array (padded with -1), so changing them never recompiles."""
  if eos_id is None:
    ids = []
  elif is_integer(eos_id):
    ids = [eos_id]
  elif isinstance(eos_id, (list, tuple, set, frozenset, np.ndarray)) and all(
    is_integer(x) for x in eos_id
  ):
    ids = sorted({int(x) for x in eos_id})
  else:
    raise ValueError(
      f"eos_id must be a token id (an integer) or a list of them, got {eos_id!r:.40}: encode "
      "a stop string with the tokenizer first."
    )
  for x in ids:
    if not 0 <= x < vocab_size:
      raise ValueError(
        f"eos_id has {x}, outside [0, {vocab_size}) (the target's vocabulary): pass the "
        "tokenizer's stop token ids, or None for no stop token."
      )
  if len(ids) > MAX_STOP_IDS:
    raise ValueError(f"eos_id has {len(ids)} stop ids; at most {MAX_STOP_IDS} are supported.")
  return np.asarray(ids + [-1] * (MAX_STOP_IDS - len(ids)), np.int32)


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
  max_len: int = 8192,
) -> np.ndarray:
  """``[len(prefixes), V]``: the distribution ``generate`` samples the next token from after
  each prefix (temperature, top-k, top-p applied by ``sampling.probs``; one-hot at 0).

  Prefixes as ``generate`` takes prompts (lists of ids, or a 2D numpy or jax array). Each
  prefix runs through the target whole, with memory growing as its length squared:
  ``max_len`` bounds it (raise it where memory allows)."""
  if not isinstance(cfg, ModelConfig):
    raise ValueError(f"cfg must be a ModelConfig (the params' config), got {type(cfg).__name__}.")
  llama.check_params(cfg, params)
  sp = SamplingParams.create(temperature, top_k, top_p)
  check_integer(max_len, "max_len", 1, "the longest prefix")
  prefixes = as_prompts(prefixes, "prefixes")
  for r, p in enumerate(prefixes):
    if len(p) > max_len:
      raise ValueError(
        f"prefixes[{r}] has {len(p)} tokens, more than max_len={max_len}: the whole prefix "
        "runs at once (memory grows with its length squared); shorten it or raise max_len."
      )
  check_prompts(prefixes, [1] * len(prefixes), max_len + 1, cfg.vocab_size)
  width = max(map(len, prefixes))
  tokens = np.zeros((len(prefixes), width), np.int32)
  for r, p in enumerate(prefixes):
    tokens[r, : len(p)] = p
  lengths = jnp.asarray([len(p) for p in prefixes], jnp.int32)
  return np.asarray(_next_token_probs(params, jnp.asarray(tokens), lengths, sp, cfg=cfg))
