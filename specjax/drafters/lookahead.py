"""Lookahead decoding (Fu et al. 2024): Jacobi iterations grow an n-gram pool that drafts.

Each step feeds the target, in ONE forward beside the newest token:

* the *verification branch*: up to G n-grams from the pool whose first token is the newest
  token, each a chain of N - 1 draft tokens (a tree of G branches, verified like any tree;
  the candidates are deterministic, so their q is one-hot and verification is lossless);
* the *lookahead branch*: a window of N - 1 levels x W columns of guessed tokens (the extra
  tokens of the draft, never accepted). Token (level l, column i) sits at offset ``1 + i + l``
  past the newest token and sees the newest token, level 0's columns ``0..i`` and column i of
  levels ``1..l``: one contiguous guessed sequence. The target's argmax at (N - 2, i) is a
  Jacobi update of column i.

After the forward, ``commit`` reads those argmaxes as a new level, records the W n-grams
``(level 0[i], ..., level N-2[i], new[i])`` in the pool (a per-row ring buffer of static size,
duplicates skipped), and slides the window up one level. Pool and window are drafter state
carried by the while_loop; W, N, G and the pool size are static config
(``config.drafter.lookahead``).
"""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import struct

from specjax import indexing, trees
from specjax.drafters import family
from specjax.drafters.base import Draft, DraftContext, TokensOnly, Verdict


@struct.dataclass
class LookaheadState:
  window: jax.Array  # [B, N-1, W] levels of guessed tokens, oldest level first.
  keys: jax.Array  # [B, P] first token of each pool n-gram (-1: empty slot).
  conts: jax.Array  # [B, P, N-1] the tokens that followed it.
  ptr: jax.Array  # [B] next ring slot to write.


@dataclasses.dataclass(frozen=True)
class Lookahead(TokensOnly):
  window: int = 5  # W: Jacobi window width (columns)
  ngram: int = 4  # N: n-gram size (the window has N - 1 levels)
  num_candidates: int = 5  # G: pool n-grams verified per step
  pool_size: int = 256  # n-grams kept per row (ring buffer)
  name: str = "lookahead"

  def __post_init__(self):
    for field, value, low in (
      ("window", self.window, 1),
      ("ngram", self.ngram, 2),
      ("num_candidates", self.num_candidates, 1),
      ("pool_size", self.pool_size, 1),
    ):
      if int(value) != value or value < low:
        raise ValueError(f"lookahead {field} must be an integer >= {low}, got {value}.")
    if self.pool_size < self.num_candidates:
      raise ValueError(
        f"lookahead pool_size={self.pool_size} is smaller than num_candidates="
        f"{self.num_candidates} (G): the pool could never offer G n-grams. Raise pool_size."
      )

  @staticmethod
  def config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.window = 5  # W: Jacobi window columns
    c.ngram = 4  # N: n-gram size (window levels = N - 1; draft depth N - 1)
    c.num_candidates = 5  # G: pool n-grams verified per step
    c.pool_size = 256  # n-grams kept per row
    return c

  @classmethod
  def check(cls, c, config):
    """Also the pool every row holds against a device's memory (a huge pool_size ran out of
    memory after compiling)."""
    from specjax import placement

    d = super().check(c, config)
    pool = 4 * config.batch_size * d.pool_size * d.ngram  # int32 keys and continuations
    most = d.window * config.max_len  # each step adds at most W n-grams, a row < max_len steps
    fix = (
      f"lower pool_size (at most {most}: a row never adds more n-grams, window={d.window} per "
      f"step in fewer than config.max_len={config.max_len} steps) or config.batch_size"
    )
    try:
      placement.check_fits(placement.footprint({"lookahead pools": pool}, {}),
                           config.get("device_memory_gib", 0.0), fix=fix)  # fmt: skip
    except ValueError as e:
      raise ValueError(
        f"config.drafter.lookahead.pool_size={d.pool_size}: the n-gram pools of "
        f"config.batch_size={config.batch_size} rows do not fit: {e}"
      ) from None
    return d

  @classmethod
  def build(cls, c, config, target):
    return cls(c.window, c.ngram, c.num_candidates, c.pool_size), None

  # --- static sizes -------------------------------------------------------------------------

  @property
  def num_draft(self) -> int:
    return self.ngram - 1

  @property
  def num_nodes(self) -> int:
    return self.num_candidates * (self.ngram - 1)

  @property
  def num_extra(self) -> int:
    return (self.ngram - 1) * self.window

  @property
  def tree(self) -> trees.Tree:
    k = self.ngram - 1
    return trees.Tree(
      tuple(0 if d == 0 else g * k + d for g in range(self.num_candidates) for d in range(k))
    )

  def check_context(self, max_len: int) -> None:
    if self.ngram > max_len:
      raise ValueError(
        f"lookahead ngram={self.ngram} is larger than max_len={max_len}: lower ngram."
      )

  def _window_layout(self) -> tuple[np.ndarray, np.ndarray]:
    """Offsets ``[E]`` of the window tokens and their mask ``[E, N_nodes + 1 + E]``."""
    levels, w, n_nodes = self.ngram - 1, self.window, self.num_nodes
    lvl, col = np.divmod(np.arange(levels * w), w)
    offsets = 1 + col + lvl
    sees = (lvl[None] == 0) & (col[None] <= col[:, None])  # level 0, columns <= i
    sees |= (lvl[None] >= 1) & (lvl[None] <= lvl[:, None]) & (col[None] == col[:, None])
    mask = np.zeros((levels * w, n_nodes + 1 + levels * w), bool)
    mask[:, 0] = True  # the newest token
    mask[:, n_nodes + 1 :] = sees
    return offsets.astype(np.int32), mask

  # --- drafter interface --------------------------------------------------------------------

  def init(self, params, prefill):
    prompt_BxP, prompt_lengths_B = prefill.tokens, prefill.lengths
    b = prompt_BxP.shape[0]
    levels, w = self.ngram - 1, self.window
    # Start the window from tokens of the prompt, spread by a fixed pseudo-random pick.
    u_BxE = jax.random.uniform(jax.random.key(0), (b, levels * w))
    pick_BxE = (u_BxE * prompt_lengths_B[:, None]).astype(jnp.int32)
    window = indexing.take_along(prompt_BxP, pick_BxE, axis=1).reshape(b, levels, w)
    return LookaheadState(
      window=window,
      keys=jnp.full((b, self.pool_size), -1, jnp.int32),
      conts=jnp.zeros((b, self.pool_size, levels), jnp.int32),
      ptr=jnp.zeros((b,), jnp.int32),
    )

  def propose(self, params, state: LookaheadState, ctx: DraftContext):
    b, k, g = ctx.tokens.shape[0], self.ngram - 1, self.num_candidates
    root_B = indexing.take_along(ctx.tokens, ctx.lengths[:, None], axis=1)[:, 0]
    # The G most recently added n-grams that start with the newest token.
    age_BxP = (state.ptr[:, None] - 1 - jnp.arange(self.pool_size)) % self.pool_size
    score_BxP = jnp.where(state.keys == root_B[:, None], self.pool_size - age_BxP, -1)
    best_BxG, slot_BxG = jax.lax.top_k(score_BxP, g)
    conts_BxGxK = indexing.take_along(state.conts, slot_BxG[..., None], axis=1)
    conts_BxGxK = jnp.where(best_BxG[..., None] >= 0, conts_BxGxK, root_B[:, None, None])
    tokens_BxN = conts_BxGxK.reshape(b, g * k)
    offsets_E, mask_ExT = self._window_layout()
    e = offsets_E.shape[0]
    draft = Draft(
      tokens=tokens_BxN,  # deterministic pool n-grams: probs=None (one-hot q)
      parents=jnp.broadcast_to(jnp.asarray(self.tree.parents, jnp.int32), (b, g * k)),
      extra_tokens=state.window.reshape(b, e),
      extra_offsets=jnp.broadcast_to(jnp.asarray(offsets_E), (b, e)),
      extra_mask=jnp.broadcast_to(jnp.asarray(mask_ExT), (b,) + mask_ExT.shape),
    )
    return draft, state

  def commit(self, state: LookaheadState, verdict: Verdict, ctx: DraftContext):
    b, levels, w = state.window.shape
    guess_BxExV = verdict.extra_logits.reshape(b, levels, w, -1)
    new_BxW = jnp.argmax(guess_BxExV[:, -1], axis=-1).astype(jnp.int32)
    grams_BxWxN = jnp.concatenate([jnp.moveaxis(state.window, 1, 2), new_BxW[..., None]], axis=-1)
    keys, conts, ptr = jax.vmap(self._insert)(state.keys, state.conts, state.ptr, grams_BxWxN)
    window = jnp.concatenate([state.window[:, 1:], new_BxW[:, None]], axis=1)
    return LookaheadState(window=window, keys=keys, conts=conts, ptr=ptr)

  def _insert(self, keys_P, conts_PxK, ptr, grams_WxN):
    """Adds the new n-grams to one row's ring buffer, skipping any already there."""
    pool_PxN = jnp.concatenate([keys_P[:, None], conts_PxK], axis=1)
    in_pool_W = jnp.any(jnp.all(grams_WxN[:, None] == pool_PxN[None], axis=-1), axis=-1)
    same_WxW = jnp.all(grams_WxN[:, None] == grams_WxN[None], axis=-1)
    earlier_copy_W = jnp.any(jnp.tril(same_WxW, k=-1), axis=-1)
    new_W = ~in_pool_W & ~earlier_copy_W
    rank_W = jnp.cumsum(new_W) - 1
    slot_W = jnp.where(new_W, (ptr + rank_W) % self.pool_size, self.pool_size)  # P: dropped
    keys_P = keys_P.at[slot_W].set(grams_WxN[:, 0], mode="drop")
    conts_PxK = conts_PxK.at[slot_W].set(grams_WxN[:, 1:], mode="drop")
    return keys_P, conts_PxK, (ptr + jnp.sum(new_W)) % self.pool_size


FAMILY = family.register(family.Family(name="lookahead", drafter=Lookahead))
