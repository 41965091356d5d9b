"""The decode loop: prefill, then one lax.while_loop of propose -> verify -> accept -> commit.

``decode.generate`` (the host API: batching, checks, placement, results) calls it. The
whole generation is one jit (``_generate``) over fixed-shape buffers. Row b's newest
token sits at ``tokens[b, L_b]`` with ``L_b = cache.lengths[b]``: it is not yet in the target
cache. A step verifies ``[newest, draft nodes 1..N]`` in one target forward at slots
``L_b .. L_b+N`` (positions ``L_b + depth``), keeps ``n_b`` draft tokens along one path plus
one target token, and advances ``L_b`` by ``n_b + 1``. A chain is the tree with one branch:
its accepted tokens already sit in order; for a tree the accepted path's K/V entries are
taken along the path. Rejected entries are never written. A row stops at a stop token, at its
token budget or with a full cache, and is then frozen by a mask; plain autoregression is the
same loop with a K = 0 drafter.

The verify forward only reads the cache (``llama.forward_kv``); the accepted path's K/V is
written at the start of the next step, before that step's forward reads the cache. Written
there, XLA updates the loop-carried cache in place, and the optional one-token ``lax.cond``
(abstaining drafters) takes the cache read-only: measured, writing after the read made XLA copy
every layer's cache every step (30 copies of 3 MB per step for SmolLM2 at max_len 4096).
"""

import collections
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from specjax import indexing, placement, sampling, trees, verify
from specjax.drafters.base import Draft, DraftContext, Drafter, Prefill, Verdict
from specjax.metrics import Metrics
from specjax.models import llama
from specjax.models.cache import KVCache, gather_rows, write_rows
from specjax.models.config import ModelConfig

# Python-side trace counter: the body of ``_generate`` runs once per compilation.
TRACES: collections.Counter = collections.Counter()


@struct.dataclass
class DecodeState:
  tokens: jax.Array  # [B, S] prompt, then generated tokens.
  num_new: jax.Array  # [B] tokens generated so far.
  stopped: jax.Array  # [B] bool: the row emitted a stop token.
  cache: KVCache  # target cache; cache.lengths is the committed length L.
  pending: llama.NewKV  # L x [B, G, D + 1, Dh]: the last step's root and accepted path K/V,
  pending_at: jax.Array  # [B] to be written at these slots when the next step begins.
  drafter_state: Any
  key: jax.Array
  metrics: Metrics


@struct.dataclass
class Limits:
  """Per-call values that end rows: traced, so changing them never recompiles."""

  max_new: jax.Array  # [B] token budget per row.
  stop_ids: jax.Array  # [MAX_STOP_IDS] stop token ids, padded with -1.


@dataclasses.dataclass(frozen=True)
class Static:
  """What fixes the compiled program: its hash is the jit cache key."""

  target_cfg: ModelConfig
  drafter: Drafter
  max_len: int
  verifier: Callable
  prompt_width: int  # the prompt's slots at the start of the token buffer
  mesh: Mesh | None = None  # None: one device; else the placement of placement.py
  forward_rows: int = 0  # > 0: every target forward of the loop runs at this many rows

  @property
  def num_slots(self) -> int:
    """Cache and token-buffer slots: room for a full step's writes past any valid length."""
    rows = self.drafter.num_nodes + self.drafter.num_extra + 1
    return self.max_len + max(rows, self.forward_rows)


@struct.dataclass
class Verified:
  """What one target forward and the verifier decided for every row."""

  num_accepted: jax.Array  # [B] n: draft tokens kept.
  path: jax.Array  # [B, D] accepted node ids at depths 1..D (valid where d < n).
  next_token: jax.Array  # [B] the target's token after them.
  forward_tokens: jax.Array  # [B, T] the tokens the forward saw: root, nodes, extras.
  path_kv: llama.NewKV  # L x [B, G, D + 1, Dh]: K/V of the root and the path's nodes, in order.
  features: jax.Array | None  # [B, D + 1, F] at the root and the accepted nodes.
  extra_logits: jax.Array | None  # [B, E, V] at the extra tokens.
  overlap: jax.Array  # [B, D] 1 - TV(p_i, q_i) at chain positions (0 for trees).
  full: jax.Array  # [] bool: False when every live row abstained (a one-token forward).


def _features(feats: tuple, drafter: Drafter) -> jax.Array | None:
  """The forward's requested hidden states as one ``[B, T, F]`` array (None if none)."""
  return jnp.concatenate(feats, axis=-1) if drafter.feature_layers else None


def _prefill(tparams, st: Static, tokens_BxS, prompt_len_B, sp, key):
  """Runs the prompt through the target and samples the first new token (one target call)."""
  prompt_BxP = tokens_BxS[:, : st.prompt_width]
  b, p = prompt_BxP.shape
  cache = llama.init_cache(st.target_cfg, b, st.num_slots, llama.param_dtype(tparams))
  cache = cache.replace(k=placement.constrain_cache(cache.k, st.mesh))
  cache = cache.replace(v=placement.constrain_cache(cache.v, st.mesh))
  positions = jnp.broadcast_to(jnp.arange(p), (b, p))
  logits_BxPxV, feats, cache = llama.forward(
    tparams, st.target_cfg, prompt_BxP, positions, cache, llama.causal_mask(p),
    st.drafter.feature_layers, window=p,  # an empty cache: the prompt's p slots are all
  )  # fmt: skip
  last_BxV = indexing.take_along(logits_BxPxV, (prompt_len_B - 1)[:, None, None], axis=1)[:, 0]
  first_B = sampling.sample(key, sampling.probs(last_BxV, sp), sp)
  tokens = write_rows(tokens_BxS, first_B[:, None], prompt_len_B)
  prefill = Prefill(prompt_BxP, prompt_len_B, _features(feats, st.drafter), st.num_slots)
  return tokens, first_B, cache.replace(lengths=prompt_len_B), prefill


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


def _overlap(draft: Draft, p_BxN1xV, d: int) -> jax.Array:
  """``[B, D]`` sum_x min(p_i, q_i) = 1 - TV(p_i, q_i) per chain position (zeros for trees)."""
  b = draft.tokens.shape[0]
  if draft.parents is not None or d == 0:
    return jnp.zeros((b, d), jnp.float32)
  if draft.probs is None:  # one-hot q: the overlap is p(x)
    return indexing.take_along(p_BxN1xV[:, :d], draft.tokens[..., None], axis=-1)[..., 0]
  return jnp.sum(jnp.minimum(p_BxN1xV[:, :d], draft.probs), axis=-1)


def _verdict(verifier, d: int, key, draft: Draft, logits_BxN1xV, sp):
  """``(end[B], next[B], overlap[B, D])``: the verifier on the target's distributions."""
  p_BxN1xV = sampling.probs(logits_BxN1xV, sp)
  end_B, next_B = verifier(key, draft, p_BxN1xV, sp)
  return end_B, next_B, _overlap(draft, p_BxN1xV, d)


def _greedy_verdict(d: int, key, draft: Draft, logits_BxN1xV, sp):
  """``_verdict`` at temperature 0, where every verifier takes the longest path of the target's
  argmax tokens (its distributions are one-hot): from the argmax alone, so no V-wide softmax,
  residual or sampling is computed (``sampling.by_temperature``: the only verdict compiled where
  the temperature is static)."""
  argmax_BxN1 = jnp.argmax(logits_BxN1xV, axis=-1).astype(jnp.int32)
  end_B, next_B = verify.greedy(draft, argmax_BxN1)
  if draft.parents is not None or d == 0:  # as _overlap: zeros for trees
    overlap = jnp.zeros((draft.tokens.shape[0], d), jnp.float32)
  elif draft.probs is None:  # one-hot p and q: the overlap is whether x is the argmax
    overlap = (draft.tokens[:, :d] == argmax_BxN1[:, :d]).astype(jnp.float32)
  else:  # one-hot p: the overlap is q(argmax)
    overlap = indexing.take_along(draft.probs[:, :d], argmax_BxN1[:, :d, None], axis=-1)[..., 0]
  return end_B, next_B, overlap


def target_forward(tparams, st: Static, tokens_BxT, positions_BxT, cache: KVCache, mask):
  """The target's forward over a step's T tokens, the cache only read: ``(logits [B,T,V],
  features, the T tokens' K/V)``.

  By default ``llama.forward_kv``: attention sums over the cached prefix and over the new
  tokens apart. With ``st.forward_rows`` = P (``generate``'s docstring) every call has one
  shape: P rows (filler after the T, each seeing the prefix and itself, seen by none of the
  T), the new K/V placed at their slots in a copy of the cache and read from there with the
  prefix in one sum over all ``num_slots``. A chain's token then gets the same bits whether it
  is an AR step's or one of a verify's T: XLA's CPU kernels give a row the same result at any
  place among a fixed number of rows, not across row counts or sums split otherwise
  (experiments/verify_cost/row_invariance.py). A tree node's ancestors sit at the slots of
  their rows, not at consecutive ones as in AR: each row reads the cache in its own order
  (``llama.path_ordered``: the prefix, then its ancestors and itself, then the rest), so its
  sum runs over the same values in the same places as AR's at that position."""
  t, p = tokens_BxT.shape[1], st.forward_rows
  cfg, features = st.target_cfg, st.drafter.feature_layers
  if p == 0:
    return llama.forward_kv(tparams, cfg, tokens_BxT, positions_BxT, cache, mask, features)
  fill = p - t
  tokens_BxP = jnp.pad(tokens_BxT, ((0, 0), (0, fill)))
  positions_BxP = jnp.concatenate(
    [positions_BxT, positions_BxT[:, -1:] + 1 + jnp.arange(fill)], axis=1
  )
  mask_P = jnp.zeros((*mask.shape[:-2], p, p), bool).at[..., :t, :t].set(mask)
  mask_P = mask_P.at[..., t:, t:].set(jnp.eye(fill, dtype=bool))
  logits, feats, written = llama.forward(
    tparams,
    cfg,
    tokens_BxP,
    positions_BxP,
    cache,
    mask_P,
    features,
    window=cache.num_slots,
    path_order=True,
  )
  slots_Bx1xTx1 = (cache.lengths[:, None] + jnp.arange(t))[:, None, :, None]
  take = lambda x: indexing.take_along(x, slots_Bx1xTx1, axis=2)  # noqa: E731
  new_kv = llama.NewKV(tuple(map(take, written.k)), tuple(map(take, written.v)))
  return logits[:, :t], tuple(f[:, :t] for f in feats), new_kv


def _verify(tparams, sp, key, draft: Draft, root_Bx1, cache: KVCache, *, st: Static) -> Verified:
  """One target forward over ``[newest, draft nodes, extras]`` and the verifier's verdict."""
  d, n_nodes = st.drafter.num_draft, st.drafter.num_nodes
  L_B = cache.lengths
  tokens_BxT, positions_BxT, mask, anc, depth_BxN1 = _verify_inputs(draft, root_Bx1, L_B)
  logits, feats, new_kv = target_forward(tparams, st, tokens_BxT, positions_BxT, cache, mask)
  end_B, next_B, overlap = sampling.by_temperature(
    sp, functools.partial(_greedy_verdict, d), functools.partial(_verdict, st.verifier, d),
    key, draft, logits[:, : n_nodes + 1], sp,
  )  # fmt: skip
  n_B = indexing.take_along(depth_BxN1, end_B[:, None], axis=1)[:, 0]
  if anc is None:  # a chain: the accepted nodes already sit in order
    path_BxD = jnp.broadcast_to(jnp.arange(1, d + 1), (L_B.shape[0], d))
  else:
    path_BxD = trees.path_to(anc, depth_BxN1, end_B, d)
  path_kv = take_path(new_kv, path_slots(path_BxD))
  features = _features(feats, st.drafter)
  if features is not None:  # the root's and the accepted nodes' (node i sits at position i)
    features = gather_rows(features, jnp.concatenate([jnp.zeros_like(n_B)[:, None], path_BxD], 1))
  extra_logits = logits[:, n_nodes + 1 :] if draft.extra_tokens is not None else None
  return Verified(
    num_accepted=n_B,
    path=path_BxD,
    next_token=next_B,
    forward_tokens=tokens_BxT,
    path_kv=path_kv,
    features=features,
    extra_logits=extra_logits,
    overlap=overlap,
    full=jnp.bool_(True),
  )


def _verify_root_only(tparams, sp, key, draft: Draft, root_Bx1, cache: KVCache, *, st: Static):
  """``_verify`` when every row abstains: a one-token forward (an AR step), same shapes."""
  b = root_Bx1.shape[0]
  d = st.drafter.num_draft
  logits, feats, new_kv = target_forward(
    tparams, st, root_Bx1, cache.lengths[:, None], cache, llama.causal_mask(1)
  )
  t_pad = ((0, 0), (0, 0), (0, d), (0, 0))  # the root's K/V, then D unused entries
  pad = lambda kv: tuple(jnp.pad(x, t_pad) for x in kv)  # noqa: E731
  path_kv = llama.NewKV(pad(new_kv.k), pad(new_kv.v))
  next_B = sampling.sample(jax.random.split(key)[1], sampling.probs(logits[:, 0], sp), sp)
  tokens_BxT = jnp.concatenate([root_Bx1, draft.tokens], axis=1)
  extra_logits = None
  if draft.extra_tokens is not None:
    tokens_BxT = jnp.concatenate([tokens_BxT, draft.extra_tokens], axis=1)
    extra_logits = jnp.zeros((b, st.drafter.num_extra, logits.shape[-1]), logits.dtype)
  features = _features(feats, st.drafter)
  if features is not None:
    features = jnp.pad(features, ((0, 0), (0, d), (0, 0)))
  zeros_B, path_BxD = jnp.zeros((b,), jnp.int32), jnp.zeros((b, d), jnp.int32)
  overlap = jnp.zeros((b, d), jnp.float32)
  return Verified(
    num_accepted=zeros_B,
    path=path_BxD,
    next_token=next_B,
    forward_tokens=tokens_BxT,
    path_kv=path_kv,
    features=features,
    extra_logits=extra_logits,
    overlap=overlap,
    full=jnp.bool_(False),
  )


def path_slots(path_BxD: jax.Array) -> jax.Array:
  """``[B, D + 1]`` the forward positions of the root (0) and the accepted path's nodes."""
  return jnp.concatenate([jnp.zeros((path_BxD.shape[0], 1), path_BxD.dtype), path_BxD], axis=1)


def take_path(new_kv: llama.NewKV, slots_BxD1: jax.Array) -> llama.NewKV:
  """The new K/V at the given forward positions, in order: a tree's accepted path becomes
  contiguous (compaction) without moving anything in the cache."""
  take = lambda x: indexing.take_along(x, slots_BxD1[:, None, :, None], axis=2)  # noqa: E731
  return llama.NewKV(tuple(map(take, new_kv.k)), tuple(map(take, new_kv.v)))


def verify_step(tparams, sp, key, draft: Draft, s: DecodeState, live_B, st: Static) -> Verified:
  """The target's one forward of the step, over a cache it only reads, and the verdict.

  A drafter may abstain per row (nothing worth verifying); when every live row does, the
  forward is one token, as cheap as an AR step. The cache enters that ``lax.cond`` read-only,
  so it is never copied."""
  root_Bx1 = gather_rows(s.tokens, s.cache.lengths[:, None])
  args = (tparams, sp, key, draft, root_Bx1, s.cache)
  full = functools.partial(_verify, st=st)
  if draft.abstain is None:
    return full(*args)
  root_only = functools.partial(_verify_root_only, st=st)
  return jax.lax.cond(jnp.any(live_B & ~draft.abstain), full, root_only, *args)


@struct.dataclass
class Accepted:
  tokens: jax.Array  # [B, S] the buffer with the emitted tokens written after the prefix.
  count: jax.Array  # [B] tokens emitted this step (0 for a stopped row).
  stopped: jax.Array  # [B] the row emitted a stop token this step.


def accept(s: DecodeState, v: Verified, live_B, limits: Limits, d: int) -> Accepted:
  """Writes the accepted path and the target's token after the prefix; truncates each row at
  its first stop token and at its budget. A finished row emits nothing."""
  L_B = s.cache.lengths
  tokens = write_rows(s.tokens, gather_rows(v.forward_tokens, v.path), L_B + 1)
  tokens = write_rows(tokens, v.next_token[:, None], L_B + 1 + v.num_accepted)
  emitted_BxD1 = gather_rows(tokens, L_B[:, None] + 1 + jnp.arange(d + 1))
  j = jnp.arange(d + 1)
  is_stop_BxD1 = jnp.isin(emitted_BxD1, limits.stop_ids) & (j <= v.num_accepted[:, None])
  stop_at_B = jnp.where(is_stop_BxD1.any(-1), jnp.argmax(is_stop_BxD1, axis=-1), d + 1)
  count_B = jnp.minimum(v.num_accepted + 1, stop_at_B + 1)
  count_B = jnp.where(live_B, jnp.minimum(count_B, limits.max_new - s.num_new), 0)
  tokens = jnp.where(live_B[:, None], tokens, s.tokens)
  return Accepted(tokens, count_B, live_B & (stop_at_B < count_B))


def count_step(m: Metrics, draft: Draft, v: Verified, live_B, drafter: Drafter) -> Metrics:
  """Every decode metric, updated in one place (over live rows only)."""
  d = drafter.num_draft
  n_B, i, j = v.num_accepted, jnp.arange(d), jnp.arange(d + 1)
  tried_BxD = live_B[:, None] & v.full & (n_B[:, None] >= i)
  abstain_B = jnp.zeros_like(live_B) if draft.abstain is None else draft.abstain & live_B
  return m.replace(
    target_calls=m.target_calls + 1,
    draft_calls=m.draft_calls + drafter.draft_calls_per_step(),
    row_calls=m.row_calls + live_B,
    accept_hist=m.accept_hist + jnp.sum(live_B[:, None] & (n_B[:, None] == j), axis=0),
    abstained=m.abstained + ~v.full,
    row_abstained=m.row_abstained + abstain_B,
    attempts=m.attempts + jnp.sum(tried_BxD, axis=0),
    accepts=m.accepts + jnp.sum(tried_BxD & (n_B[:, None] > i), axis=0),
    overlap=m.overlap + jnp.sum(jnp.where(tried_BxD, v.overlap, 0.0), axis=0),
  )


def live_rows(s: DecodeState, limits: Limits, max_len: int) -> jax.Array:
  """``[B]`` rows still generating. A row stops for one of three reasons."""
  over_budget = s.num_new >= limits.max_new
  cache_full = s.cache.lengths >= max_len  # unreachable: generate() checks prompt + budget
  return ~(s.stopped | over_budget | cache_full)


def _step(tparams, dparams, st: Static, sp, limits: Limits, s: DecodeState) -> DecodeState:
  """One step for every row: propose -> verify -> accept -> commit."""
  # The weights enter the step through a barrier with a value the loop changes, so XLA cannot
  # hoist work on them out of the while loop: it would convert bfloat16 weights to a float32
  # copy once, before the loop, and run every product of every step on that copy through a
  # slow loop kernel (a bfloat16 AR step cost 3.3x its own forward; experiments/verify_cost).
  tparams, dparams, _ = jax.lax.optimization_barrier((tparams, dparams, s.key))
  s = s.replace(cache=llama.write_kv(s.cache, s.pending, s.pending_at))  # the last step's path
  live_B = live_rows(s, limits, st.max_len)
  key, key_draft, key_verify = jax.random.split(s.key, 3)
  ctx = DraftContext(s.tokens, s.cache.lengths, key_draft, sp, st.target_cfg.vocab_size)
  # propose: a chain or tree of draft tokens (and the q they were drawn from)
  draft, dstate = st.drafter.propose(dparams, s.drafter_state, ctx)
  # verify: ONE target forward over [newest, draft nodes, extras]; the verifier picks the path
  v = verify_step(tparams, sp, key_verify, draft, s, live_B, st)
  # accept: write the path and the target's token; cut rows at stop ids and budgets
  a = accept(s, v, live_B, limits, st.drafter.num_draft)
  # commit: the target cache by its lengths (its K/V is written as the next step begins), the
  # drafter by the verdict
  cache = s.cache.replace(lengths=s.cache.lengths + a.count)
  verdict = Verdict(v.num_accepted, v.path, v.next_token, v.features, v.extra_logits)
  dstate = st.drafter.commit(dstate, verdict, ctx.replace(lengths=cache.lengths))
  metrics = count_step(s.metrics, draft, v, live_B, st.drafter)
  return DecodeState(
    tokens=a.tokens,
    num_new=s.num_new + a.count,
    stopped=s.stopped | a.stopped,
    cache=cache,
    pending=v.path_kv,  # written when the next step begins, at the slots it was verified at
    pending_at=s.cache.lengths,
    drafter_state=dstate,
    key=key,
    metrics=metrics,
  )


def _generate(tparams, dparams, tokens_BxS, prompt_len_B, sp, limits: Limits, key, *, st):
  """``tokens_BxS`` holds the prompts (zeros after them); it is donated and comes back with
  the generated tokens written after each prompt."""
  TRACES["generate"] += 1
  b = tokens_BxS.shape[0]
  if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.wrap_key_data(key)  # raw key data: how a key crosses onto a mesh
  key_prefill, key_loop = jax.random.split(key)
  tokens, first_B, cache, prefill = _prefill(tparams, st, tokens_BxS, prompt_len_B, sp, key_prefill)
  metrics = Metrics.zeros(b, st.drafter.num_draft)
  metrics = metrics.replace(target_calls=metrics.target_calls + 1, row_calls=metrics.row_calls + 1)
  cfg, d1 = st.target_cfg, st.drafter.num_draft + 1
  zeros = placement.constrain_cache(
    tuple(
      jnp.zeros((b, cfg.num_kv_heads, d1, cfg.head_dim), cache.k[0].dtype)
      for _ in range(cfg.num_layers)
    ),
    st.mesh,
  )
  state = DecodeState(
    tokens=tokens,
    num_new=jnp.ones((b,), jnp.int32),
    stopped=jnp.isin(first_B, limits.stop_ids),
    cache=cache,
    pending=llama.NewKV(zeros, zeros),  # nothing yet: zeros past the prompt, overwritten
    pending_at=prompt_len_B,
    drafter_state=st.drafter.init(dparams, prefill),
    key=key_loop,
    metrics=metrics,
  )
  keep_going = lambda s: jnp.any(live_rows(s, limits, st.max_len))
  body = lambda s: _step(tparams, dparams, st, sp, limits, s)
  state = jax.lax.while_loop(keep_going, body, state)
  return state.tokens, state.num_new, state.metrics


_generate_jit = jax.jit(_generate, static_argnames=("st",), donate_argnums=(2,))


@functools.lru_cache(maxsize=16)
def _sharded_jit(st: Static, params_shardings: tuple) -> Callable:
  """``_generate`` with explicit placements on ``st.mesh``: weights as placed
  (``params_shardings`` = (treedef, leaf shardings) of target and drafter params), rows over
  data, the rest replicated; outputs rows over data, metrics replicated; the token buffer
  donated."""
  (t_def, t_sh), (d_def, d_sh) = params_shardings
  rows, rep = NamedSharding(st.mesh, placement.ROWS_SPEC), NamedSharding(st.mesh, P())
  return jax.jit(
    functools.partial(_generate, st=st),
    in_shardings=(t_def.unflatten(t_sh), d_def.unflatten(d_sh), rows, rows, rep, rep, rep),
    out_shardings=(rows, rows, rep),
    donate_argnums=(2,),
  )


def jitted(st: Static, tparams, dparams) -> tuple[Any, dict]:
  """The jitted ``_generate`` for this placement and its keyword arguments: one device, or
  explicit shardings on a mesh."""
  if st.mesh is None:
    return _generate_jit, {"st": st}

  def placed(tree):
    leaves, treedef = jax.tree.flatten(jax.tree.map(lambda x: x.sharding, tree))
    return treedef, tuple(leaves)

  return _sharded_jit(st, (placed(tparams), placed(dparams))), {}
