"""generate(): prefill, then one lax.while_loop of propose -> verify -> accept -> commit.

The whole generation is one jit (``_generate``) over fixed-shape buffers. Row b's newest
token sits at ``tokens[b, L_b]`` with ``L_b = cache.lengths[b]``: it is not yet in the target
cache. A step verifies ``[newest, draft nodes 1..N]`` in one target forward at slots
``L_b .. L_b+N`` (positions ``L_b + depth``), keeps ``n_b`` draft tokens along one path plus
one target token, and advances ``L_b`` by ``n_b + 1``. A chain is the tree with one branch:
its accepted tokens already sit in order; for a tree the accepted path's K/V entries are
compacted next to the prefix. Rejected slots are simply left past the length. A finished row
(EOS or its budget) is frozen by ``done``; plain autoregression is the same loop with a K = 0
drafter.
"""

import collections
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax import metrics as metrics_lib
from specjax import sampling, trees, verify
from specjax.drafters.base import Draft, DraftContext, Drafter, NoDraft, Verdict
from specjax.metrics import Metrics
from specjax.models import llama
from specjax.models.cache import KVCache, compact, gather_rows, write_rows
from specjax.models.config import ModelConfig
from specjax.sampling import SamplingParams

AUTOREGRESSIVE = NoDraft()

# Python-side trace counter: the body of ``_generate`` runs once per compilation.
TRACES: collections.Counter = collections.Counter()


@struct.dataclass
class DecodeState:
  tokens: jax.Array  # [B, S] prompt, then generated tokens.
  num_new: jax.Array  # [B] tokens generated so far.
  done: jax.Array  # [B] bool.
  cache: KVCache  # target cache; cache.lengths is the committed length L.
  drafter_state: Any
  key: jax.Array
  metrics: Metrics


@dataclasses.dataclass(frozen=True)
class _Static:
  target_cfg: ModelConfig
  drafter: Drafter
  max_len: int
  verifier: Callable


def _num_slots(st: _Static) -> int:
  """Cache and token-buffer slots: room for a full step's writes past any valid length."""
  return st.max_len + st.drafter.num_nodes + st.drafter.num_extra + 1


def _prefill(tparams, st: _Static, prompt_BxP, prompt_len_B, sp, key):
  """Runs the prompt through the target and samples the first new token (one target call)."""
  b, p = prompt_BxP.shape
  num_slots = _num_slots(st)
  cache = llama.init_cache(st.target_cfg, b, num_slots)
  positions = jnp.broadcast_to(jnp.arange(p), (b, p))
  logits_BxPxV, _, cache = llama.forward(
    tparams, st.target_cfg, prompt_BxP, positions, cache, llama.causal_mask(p)
  )
  last_BxV = jnp.take_along_axis(logits_BxPxV, (prompt_len_B - 1)[:, None, None], axis=1)[:, 0]
  first_B = sampling.sample(key, sampling.probs(last_BxV, sp))
  tokens = jnp.zeros((b, num_slots), jnp.int32).at[:, :p].set(prompt_BxP)
  tokens = write_rows(tokens, first_B[:, None], prompt_len_B)
  return tokens, first_B, cache.replace(lengths=prompt_len_B)


def _verify_inputs(draft: Draft, root_Bx1, L_B):
  """Tokens, positions and attention mask of the one target forward, and the tree's shape.

  The forward sees ``[root, nodes 1..N, extras]``. A chain is causal; a tree attends along
  ancestors (trees.py); extra tokens see what ``draft.extra_mask`` says and no node sees them.
  """
  b, n = draft.tokens.shape
  if draft.parents is None:
    anc = None
    depth_BxN1 = jnp.broadcast_to(jnp.arange(n + 1), (b, n + 1))
    mask = llama.causal_mask(n + 1)
  else:
    anc = trees.ancestors(draft.parents)
    depth_BxN1 = trees.depths(anc)
    mask = anc
  tokens_BxT = jnp.concatenate([root_Bx1, draft.tokens], axis=1)
  offsets_BxT = depth_BxN1
  if draft.extra_tokens is not None:
    e = draft.extra_tokens.shape[1]
    tokens_BxT = jnp.concatenate([tokens_BxT, draft.extra_tokens], axis=1)
    offsets_BxT = jnp.concatenate([offsets_BxT, draft.extra_offsets], axis=1)
    top = jnp.broadcast_to(mask, (b, n + 1, n + 1))
    top = jnp.concatenate([top, jnp.zeros((b, n + 1, e), bool)], axis=2)
    mask = jnp.concatenate([top, draft.extra_mask], axis=1)
  return tokens_BxT, L_B[:, None] + offsets_BxT, mask, anc, depth_BxN1


def _verify(tparams, sp, key, draft: Draft, root_Bx1, cache: KVCache, *, st: _Static):
  """One target forward over ``[newest, draft nodes, extras]`` and the verifier's verdict.

  Returns the accepted count, the accepted path (node ids), the next token, the forward's
  tokens, the cache (the accepted path's K/V compacted next to the prefix), the target's
  distributions at the nodes and its logits at the extra tokens.
  """
  d, n_nodes = st.drafter.num_draft, st.drafter.num_nodes
  L_B = cache.lengths
  tokens_BxT, positions_BxT, mask, anc, depth_BxN1 = _verify_inputs(draft, root_Bx1, L_B)
  logits, _, cache = llama.forward(tparams, st.target_cfg, tokens_BxT, positions_BxT, cache, mask)
  p_BxN1xV = sampling.probs(logits[:, : n_nodes + 1], sp)
  end_B, next_B = st.verifier(key, draft, p_BxN1xV, sp)
  n_B = jnp.take_along_axis(depth_BxN1, end_B[:, None], axis=1)[:, 0]
  if anc is None:  # a chain: the accepted nodes already sit in order
    path_BxD = jnp.broadcast_to(jnp.arange(1, d + 1), (L_B.shape[0], d))
  else:  # a tree: move the accepted path's K/V entries next to the prefix
    path_BxD = trees.path_to(anc, depth_BxN1, end_B, d)
    cache = compact(cache, L_B[:, None] + path_BxD, L_B + 1)
  extra_logits = logits[:, n_nodes + 1 :]
  return n_B, path_BxD, next_B, tokens_BxT, cache, p_BxN1xV, extra_logits


def _verify_root_only(tparams, sp, key, draft: Draft, root_Bx1, cache: KVCache, *, st: _Static):
  """``_verify`` when every row abstains: a one-token forward (an AR step), same outputs."""
  b = root_Bx1.shape[0]
  d, n_nodes = st.drafter.num_draft, st.drafter.num_nodes
  positions_Bx1 = cache.lengths[:, None]
  logits, _, cache = llama.forward(
    tparams, st.target_cfg, root_Bx1, positions_Bx1, cache, llama.causal_mask(1)
  )
  p_BxV = sampling.probs(logits[:, 0], sp)
  next_B = sampling.sample(jax.random.split(key)[1], p_BxV)
  tokens_BxT = jnp.concatenate([root_Bx1, draft.tokens], axis=1)
  if draft.extra_tokens is not None:
    tokens_BxT = jnp.concatenate([tokens_BxT, draft.extra_tokens], axis=1)
  p_BxN1xV = jnp.zeros((b, n_nodes + 1) + p_BxV.shape[1:], p_BxV.dtype).at[:, 0].set(p_BxV)
  extra_logits = jnp.zeros((b, st.drafter.num_extra, logits.shape[-1]), logits.dtype)
  zeros_B = jnp.zeros((b,), jnp.int32)
  path_BxD = jnp.zeros((b, d), jnp.int32)
  return zeros_B, path_BxD, next_B, tokens_BxT, cache, p_BxN1xV, extra_logits


def _step(tparams, dparams, st: _Static, sp, stop_ids, max_new_B, s: DecodeState) -> DecodeState:
  d = st.drafter.num_draft
  L_B = s.cache.lengths
  key, key_draft, key_verify = jax.random.split(s.key, 3)
  ctx = DraftContext(s.tokens, L_B, key_draft, sp, st.target_cfg.vocab_size)

  # propose
  draft, dstate = st.drafter.propose(dparams, s.drafter_state, ctx)
  # verify + accept. A drafter may abstain per row (nothing worth verifying); when every live
  # row does, the step is a one-token forward, as cheap as an AR step.
  root_Bx1 = gather_rows(s.tokens, L_B[:, None])
  args = (tparams, sp, key_verify, draft, root_Bx1, s.cache)
  full, root_only = functools.partial(_verify, st=st), functools.partial(_verify_root_only, st=st)
  if draft.abstain is None:
    verified = jnp.bool_(True)
    n_B, path_BxD, next_B, tokens_BxT, cache, p_BxN1xV, extra_logits = full(*args)
  else:
    verified = ~jnp.all(draft.abstain | s.done)
    n_B, path_BxD, next_B, tokens_BxT, cache, p_BxN1xV, extra_logits = jax.lax.cond(
      verified, full, root_only, *args
    )
  path_tokens_BxD = gather_rows(tokens_BxT, path_BxD)
  tokens = write_rows(s.tokens, path_tokens_BxD, L_B + 1)
  tokens = write_rows(tokens, next_B[:, None], L_B + 1 + n_B)
  emitted_BxD1 = gather_rows(tokens, L_B[:, None] + 1 + jnp.arange(d + 1))
  j = jnp.arange(d + 1)
  is_eos_BxD1 = jnp.isin(emitted_BxD1, stop_ids) & (j <= n_B[:, None])
  eos_at_B = jnp.where(is_eos_BxD1.any(-1), jnp.argmax(is_eos_BxD1, axis=-1), d + 1)
  count_B = jnp.minimum(jnp.minimum(n_B + 1, eos_at_B + 1), max_new_B - s.num_new)
  # commit (finished rows are frozen)
  live_B = ~s.done
  count_B = jnp.where(live_B, count_B, 0)
  num_new = s.num_new + count_B
  cache = cache.replace(lengths=L_B + count_B)
  done = s.done | (eos_at_B < count_B) | (num_new >= max_new_B)
  done |= cache.lengths >= st.max_len  # Unreachable when validated.
  ctx = ctx.replace(lengths=cache.lengths)
  if draft.extra_tokens is None:
    extra_logits = None
  verdict = Verdict(n_B, path_BxD, next_B, extra_logits)
  dstate = st.drafter.commit(dstate, verdict, ctx)

  # metrics, over live rows only
  m = s.metrics
  i = jnp.arange(d)
  tried_BxD = live_B[:, None] & verified & (n_B[:, None] >= i)
  if draft.parents is None:  # 1 - TV(p_i, q_i): the analytic acceptance rate of a chain position
    overlap_BxD = jnp.sum(jnp.minimum(p_BxN1xV[:, :d], draft.probs), axis=-1)
  else:
    overlap_BxD = jnp.zeros(tried_BxD.shape, jnp.float32)
  metrics = m.replace(
    target_calls=m.target_calls + 1,
    draft_calls=m.draft_calls + st.drafter.draft_calls_per_step(),
    row_calls=m.row_calls + live_B,
    accept_hist=m.accept_hist + jnp.sum(live_B[:, None] & (n_B[:, None] == j), axis=0),
    abstained=m.abstained + ~verified,
    attempts=m.attempts + jnp.sum(tried_BxD, axis=0),
    accepts=m.accepts + jnp.sum(tried_BxD & (n_B[:, None] > i), axis=0),
    overlap=m.overlap + jnp.sum(jnp.where(tried_BxD, overlap_BxD, 0.0), axis=0),
  )
  tokens = jnp.where(live_B[:, None], tokens, s.tokens)
  return DecodeState(tokens, num_new, done, cache, dstate, key, metrics)


def _generate(tparams, dparams, prompt_BxP, prompt_len_B, max_new_B, sp, stop_ids, key, *, st):
  TRACES["generate"] += 1
  b = prompt_BxP.shape[0]
  key_prefill, key_loop = jax.random.split(key)
  tokens, first_B, cache = _prefill(tparams, st, prompt_BxP, prompt_len_B, sp, key_prefill)
  dstate = st.drafter.init(dparams, prompt_BxP, prompt_len_B, cache.num_slots)
  metrics = Metrics.zeros(b, st.drafter.num_draft)
  metrics = metrics.replace(target_calls=metrics.target_calls + 1, row_calls=metrics.row_calls + 1)
  state = DecodeState(
    tokens=tokens,
    num_new=jnp.ones((b,), jnp.int32),
    done=jnp.isin(first_B, stop_ids) | (max_new_B <= 1),
    cache=cache,
    drafter_state=dstate,
    key=key_loop,
    metrics=metrics,
  )
  body = lambda s: _step(tparams, dparams, st, sp, stop_ids, max_new_B, s)
  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  return state.tokens, state.num_new, state.metrics


_generate_jit = jax.jit(_generate, static_argnames=("st",))


@dataclasses.dataclass
class Generation:
  """Host-side result of ``generate``: per-row new tokens and the run's metrics."""

  tokens: list[list[int]]
  counts: dict[str, np.ndarray]  # raw metric counts: merge runs with metrics.merge
  metrics: dict[str, Any]  # derived: tau, alpha, ...


def prompt_width(longest: int, max_len: int) -> int:
  """Prompts are padded to a power-of-two bucket (>= 16) so most batches share one compile."""
  return min(max_len, max(16, 1 << (longest - 1).bit_length()))


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
) -> Generation:
  """Generates continuations of ``prompts`` (token-id lists) with ``drafter``; lossless.

  Every argument is checked before anything is compiled. ``max_len`` bounds prompt plus new
  tokens per row and, with the batch size, the drafter and the model, fixes the compiled
  shapes; prompts, budgets, sampling knobs, seed and EOS are traced. ``eos_id`` may be one id
  or several (an instruct model may end a turn with either of two markers).
  """
  sp = SamplingParams.create(temperature, top_k, top_p)
  drafter.check_target(target_cfg)
  drafter.check_context(max_len)
  b = len(prompts)
  if b == 0:
    raise ValueError("prompts is empty: pass at least one prompt (a list of token ids).")
  budgets = [max_new_tokens] * b if isinstance(max_new_tokens, int) else list(max_new_tokens)
  if len(budgets) != b:
    raise ValueError(f"max_new_tokens has {len(budgets)} entries for {b} prompts.")
  check_prompts(prompts, budgets, max_len, target_cfg.vocab_size)

  width = prompt_width(max(map(len, prompts)), max_len)
  prompt_BxP = np.zeros((b, width), np.int32)
  for r, prompt in enumerate(prompts):
    prompt_BxP[r, : len(prompt)] = prompt
  key = jax.random.key(seed) if isinstance(seed, int) else seed
  st = _Static(target_cfg, drafter, max_len, verifier)
  tokens, num_new, metrics = _generate_jit(
    target_params,
    drafter_params,
    jnp.asarray(prompt_BxP),
    jnp.asarray([len(p) for p in prompts], jnp.int32),
    jnp.asarray(budgets, jnp.int32),
    sp,
    _stop_ids(eos_id),
    key,
    st=st,
  )
  tokens, num_new = np.asarray(tokens), np.asarray(num_new)
  rows = [tokens[r, len(p) : len(p) + num_new[r]].tolist() for r, p in enumerate(prompts)]
  counts = metrics_lib.counts(jax.device_get(metrics), num_new)
  return Generation(tokens=rows, counts=counts, metrics=metrics_lib.summarize(counts))


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
    if min(prompt) < 0 or max(prompt) >= vocab_size:
      raise ValueError(f"prompts[{r}] has token ids outside [0, {vocab_size}).")


MAX_STOP_IDS = 8


def _stop_ids(eos_id) -> jax.Array:
  """Stop ids as a fixed-size array (padded with -1), so changing them never recompiles."""
  ids = [] if eos_id is None else [eos_id] if isinstance(eos_id, int) else sorted(set(eos_id))
  if len(ids) > MAX_STOP_IDS:
    raise ValueError(f"eos_id has {len(ids)} stop ids; at most {MAX_STOP_IDS} are supported.")
  return jnp.asarray(ids + [-1] * (MAX_STOP_IDS - len(ids)), jnp.int32)
