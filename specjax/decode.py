"""generate(): prefill, then one lax.while_loop of propose -> verify -> accept -> commit.

The whole generation is one jit (``_generate``) over fixed-shape buffers. Row b's newest
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
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from specjax import metrics as metrics_lib
from specjax import placement, sampling, trees, verify
from specjax.drafters.base import Draft, DraftContext, Drafter, NoDraft, Prefill, Verdict
from specjax.metrics import Metrics
from specjax.models import llama
from specjax.models.cache import KVCache, gather_rows, write_rows
from specjax.models.config import ModelConfig
from specjax.sampling import SamplingParams

AUTOREGRESSIVE = NoDraft()

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
class _Static:
  target_cfg: ModelConfig
  drafter: Drafter
  max_len: int
  verifier: Callable
  prompt_width: int  # the prompt's slots at the start of the token buffer
  mesh: Mesh | None = None  # None: one device; else the placement of placement.py

  @property
  def num_slots(self) -> int:
    """Cache and token-buffer slots: room for a full step's writes past any valid length."""
    return self.max_len + self.drafter.num_nodes + self.drafter.num_extra + 1


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


def _prefill(tparams, st: _Static, tokens_BxS, prompt_len_B, sp, key):
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
  last_BxV = jnp.take_along_axis(logits_BxPxV, (prompt_len_B - 1)[:, None, None], axis=1)[:, 0]
  first_B = sampling.sample(key, sampling.probs(last_BxV, sp))
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
    return jnp.take_along_axis(p_BxN1xV[:, :d], draft.tokens[..., None], axis=-1)[..., 0]
  return jnp.sum(jnp.minimum(p_BxN1xV[:, :d], draft.probs), axis=-1)


def _verdict(verifier, d: int, key, draft: Draft, logits_BxN1xV, sp):
  """``(end[B], next[B], overlap[B, D])``: the verifier on the target's distributions."""
  p_BxN1xV = sampling.probs(logits_BxN1xV, sp)
  end_B, next_B = verifier(key, draft, p_BxN1xV, sp)
  return end_B, next_B, _overlap(draft, p_BxN1xV, d)


def _greedy_verdict(d: int, key, draft: Draft, logits_BxN1xV, sp):
  """``_verdict`` at temperature 0, where every verifier takes the longest path of the target's
  argmax tokens (its distributions are one-hot): from the argmax alone, so no V-wide softmax,
  residual or sampling is computed (a real branch: ``lax.cond`` on the temperature)."""
  argmax_BxN1 = jnp.argmax(logits_BxN1xV, axis=-1).astype(jnp.int32)
  end_B, next_B = verify.greedy(draft, argmax_BxN1)
  if draft.parents is not None or d == 0:  # as _overlap: zeros for trees
    overlap = jnp.zeros((draft.tokens.shape[0], d), jnp.float32)
  elif draft.probs is None:  # one-hot p and q: the overlap is whether x is the argmax
    overlap = (draft.tokens[:, :d] == argmax_BxN1[:, :d]).astype(jnp.float32)
  else:  # one-hot p: the overlap is q(argmax)
    overlap = jnp.take_along_axis(draft.probs[:, :d], argmax_BxN1[:, :d, None], axis=-1)[..., 0]
  return end_B, next_B, overlap


def _verify(tparams, sp, key, draft: Draft, root_Bx1, cache: KVCache, *, st: _Static) -> Verified:
  """One target forward over ``[newest, draft nodes, extras]`` and the verifier's verdict."""
  d, n_nodes = st.drafter.num_draft, st.drafter.num_nodes
  L_B = cache.lengths
  tokens_BxT, positions_BxT, mask, anc, depth_BxN1 = _verify_inputs(draft, root_Bx1, L_B)
  logits, feats, new_kv = llama.forward_kv(
    tparams, st.target_cfg, tokens_BxT, positions_BxT, cache, mask, st.drafter.feature_layers
  )
  end_B, next_B, overlap = jax.lax.cond(
    sp.temperature <= 0, functools.partial(_greedy_verdict, d),
    functools.partial(_verdict, st.verifier, d),
    key, draft, logits[:, : n_nodes + 1], sp,
  )  # fmt: skip
  n_B = jnp.take_along_axis(depth_BxN1, end_B[:, None], axis=1)[:, 0]
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
    n_B, path_BxD, next_B, tokens_BxT, path_kv, features, extra_logits,
    overlap, jnp.bool_(True),
  )  # fmt: skip


def _verify_root_only(tparams, sp, key, draft: Draft, root_Bx1, cache: KVCache, *, st: _Static):
  """``_verify`` when every row abstains: a one-token forward (an AR step), same shapes."""
  b = root_Bx1.shape[0]
  d = st.drafter.num_draft
  logits, feats, new_kv = llama.forward_kv(
    tparams, st.target_cfg, root_Bx1, cache.lengths[:, None], cache, llama.causal_mask(1),
    st.drafter.feature_layers,
  )  # fmt: skip
  t_pad = ((0, 0), (0, 0), (0, d), (0, 0))  # the root's K/V, then D unused entries
  pad = lambda kv: tuple(jnp.pad(x, t_pad) for x in kv)  # noqa: E731
  path_kv = llama.NewKV(pad(new_kv.k), pad(new_kv.v))
  next_B = sampling.sample(jax.random.split(key)[1], sampling.probs(logits[:, 0], sp))
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
    zeros_B,
    path_BxD,
    next_B,
    tokens_BxT,
    path_kv,
    features,
    extra_logits,
    overlap,
    jnp.bool_(False),
  )


def path_slots(path_BxD: jax.Array) -> jax.Array:
  """``[B, D + 1]`` the forward positions of the root (0) and the accepted path's nodes."""
  return jnp.concatenate([jnp.zeros((path_BxD.shape[0], 1), path_BxD.dtype), path_BxD], axis=1)


def take_path(new_kv: llama.NewKV, slots_BxD1: jax.Array) -> llama.NewKV:
  """The new K/V at the given forward positions, in order: a tree's accepted path becomes
  contiguous (what DESIGN.md calls compaction) without moving anything in the cache."""
  take = lambda x: jnp.take_along_axis(x, slots_BxD1[:, None, :, None], axis=2)  # noqa: E731
  return llama.NewKV(tuple(map(take, new_kv.k)), tuple(map(take, new_kv.v)))


def verify_step(tparams, sp, key, draft: Draft, s: DecodeState, live_B, st: _Static) -> Verified:
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


def _step(tparams, dparams, st: _Static, sp, limits: Limits, s: DecodeState) -> DecodeState:
  """One step for every row: propose -> verify -> accept -> commit."""
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
    a.tokens, s.num_new + a.count, s.stopped | a.stopped, cache, v.path_kv, s.cache.lengths,
    dstate, key, metrics,
  )  # fmt: skip


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
def _sharded_jit(st: _Static, params_shardings: tuple) -> Callable:
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


def _jitted(st: _Static, tparams, dparams) -> tuple[Any, dict]:
  """The jitted ``_generate`` for this placement and its keyword arguments: one device, or
  explicit shardings on a mesh."""
  if st.mesh is None:
    return _generate_jit, {"st": st}

  def placed(tree):
    leaves, treedef = jax.tree.flatten(jax.tree.map(lambda x: x.sharding, tree))
    return treedef, tuple(leaves)

  return _sharded_jit(st, (placed(tparams), placed(dparams))), {}


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
  shapes; prompts, budgets, sampling knobs, seed and stop ids are traced (no recompile).
  Prompts are padded to a power-of-two width; ``pad_to`` (e.g. the longest prompt of a whole
  run) makes every batch of a run share one width, hence one compiled program.
  """
  args, st = _arguments(
    target_params, target_cfg, prompts, drafter, drafter_params, max_new_tokens, max_len,
    temperature, top_k, top_p, seed, eos_id, verifier, pad_to, mesh,
  )  # fmt: skip
  fn, kw = _jitted(st, args[0], args[1])
  tokens_d, num_new_d, metrics = fn(*args, **kw)
  tokens, num_new = placement.fetch(tokens_d), placement.fetch(num_new_d)
  rows = [tokens[r, len(p) : len(p) + num_new[r]].tolist() for r, p in enumerate(prompts)]
  counts = metrics_lib.counts(jax.device_get(metrics), num_new)
  local = placement.local_rows(tokens_d) if mesh is not None else None
  return Generation(rows, counts, metrics_lib.summarize(counts), local)


def _arguments(
  target_params, target_cfg, prompts, drafter, drafter_params, max_new_tokens, max_len,
  temperature, top_k, top_p, seed, eos_id, verifier, pad_to, mesh=None,
):  # fmt: skip
  """Checks ``generate``'s arguments (before anything compiles) and makes the jitted call's."""
  sp = SamplingParams.create(temperature, top_k, top_p)
  llama.check_params(target_cfg, target_params)
  drafter.check_target(target_cfg)
  if hasattr(drafter, "check_params"):
    drafter.check_params(drafter_params)
  drafter.check_context(max_len)
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
    if isinstance(getattr(drafter, "cfg", None), ModelConfig):
      placement.check_model(shape, drafter.cfg, "draft model")
  if isinstance(seed, int) and not 0 <= seed < 2**32:
    raise ValueError(f"seed must be an integer in [0, 2**32), got {seed}.")
  st = _Static(
    target_cfg, drafter, max_len, verifier, prompt_width(max(pad_to, *map(len, prompts)), max_len),
    mesh,
  )  # fmt: skip
  rules = getattr(drafter, "partition_rules", ())
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
  """Bytes one device holds: weights by their partition rules, the target's KV cache (and a
  draft model's), rows over data and kv heads over tensor."""
  parts = {
    "target weights": placement.bytes_per_device(target_params, llama.RULES, mesh_shape),
    "target KV cache": placement.cache_bytes(
      target_cfg, batch, num_slots, mesh_shape, np.dtype(llama.param_dtype(target_params)).itemsize
    ),
  }
  if drafter_params is not None:
    parts["drafter weights"] = placement.bytes_per_device(drafter_params, rules, mesh_shape)
  if isinstance(getattr(drafter, "cfg", None), ModelConfig):
    itemsize = np.dtype(llama.param_dtype(drafter_params)).itemsize
    parts["draft KV cache"] = placement.cache_bytes(
      drafter.cfg, batch, num_slots, mesh_shape, itemsize
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
) -> jax.stages.Compiled:
  """The compiled program ``generate`` runs for these shapes (ahead of time, nothing run):
  for ``cost_analysis()``, ``as_text()`` (the optimised HLO) or timing a compile."""
  args, st = _arguments(
    target_params, target_cfg, prompts, drafter, drafter_params, max_new_tokens, max_len,
    0.0, 0, 1.0, 0, None, verifier, pad_to, mesh,
  )  # fmt: skip
  fn, kw = _jitted(st, args[0], args[1])
  return fn.lower(*args, **kw).compile()


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
  last_BxV = jnp.take_along_axis(logits_BxPxV, (lengths_B - 1)[:, None, None], axis=1)[:, 0]
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
