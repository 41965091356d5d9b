"""Prompt lookup (n-gram) drafting, as a chain: no draft model, no training.

The last n tokens of a row (n from ``max_ngram`` down to ``min_ngram``) are searched for in
everything the row holds so far (prompt and output); the K tokens that followed the latest
earlier occurrence are the draft. Pure jnp over the static token buffer, inside the loop.

The draft is deterministic given the context, so its q is one-hot: the verifier then accepts
a token with probability p(x) and on rejection samples from p with x removed, which is the
lossless rule for a deterministic proposal.
"""

import dataclasses

import jax
import jax.numpy as jnp

from specjax.drafters.base import Draft, DraftContext, Stateless, check_num_draft
from specjax.models.cache import gather_rows


@dataclasses.dataclass(frozen=True)
class PromptLookup(Stateless):
  num_draft: int
  max_ngram: int = 3
  min_ngram: int = 1
  name: str = "prompt_lookup"

  def __post_init__(self):
    check_num_draft(self.num_draft)
    if self.num_draft == 0:
      raise ValueError("num_draft must be >= 1 for the prompt_lookup drafter.")
    if not 1 <= self.min_ngram <= self.max_ngram:
      raise ValueError(
        f"prompt lookup needs 1 <= min_ngram <= max_ngram, got min_ngram={self.min_ngram}, "
        f"max_ngram={self.max_ngram}."
      )

  def match_end(self, tokens_BxS: jax.Array, lengths_B: jax.Array) -> jax.Array:
    """Per row, the slot right after the latest earlier match of the longest matching suffix
    (so the draft starts there), or -1 where no n-gram matches."""
    s = tokens_BxS.shape[1]
    j_S = jnp.arange(s)
    found_B = jnp.full(lengths_B.shape, -1)
    for n in range(self.max_ngram, self.min_ngram - 1, -1):
      suffix_at_Bxn = jnp.maximum(lengths_B[:, None] - n + 1 + jnp.arange(n), 0)
      suffix_Bxn = gather_rows(tokens_BxS, suffix_at_Bxn)
      same_BxS = jnp.ones(tokens_BxS.shape, bool)
      for m in range(n):  # window starting at j matches the suffix at offset m
        same_BxS &= jnp.roll(tokens_BxS, -m, axis=1) == suffix_Bxn[:, m : m + 1]
      # The match must end before the suffix itself starts repeating it: j + n <= L.
      ok_BxS = same_BxS & (j_S + n <= lengths_B[:, None]) & (lengths_B[:, None] >= n - 1)
      start_B = jnp.max(jnp.where(ok_BxS, j_S, -1), axis=1)
      found_B = jnp.where((found_B < 0) & (start_B >= 0), start_B + n, found_B)
    return found_B

  def propose(self, params, state, ctx: DraftContext):
    start_B = self.match_end(ctx.tokens, ctx.lengths)
    # Without a match, guess a repeat of the newest token. Continuations are clipped to the
    # committed text (slots <= L): past it the buffer holds stale drafts.
    start_B = jnp.where(start_B < 0, ctx.lengths, start_B)
    idx_BxK = jnp.minimum(start_B[:, None] + jnp.arange(self.num_draft), ctx.lengths[:, None])
    tokens_BxK = gather_rows(ctx.tokens, idx_BxK)
    probs_BxKxV = jax.nn.one_hot(tokens_BxK, ctx.vocab_size, dtype=jnp.float32)
    return Draft(tokens=tokens_BxK, probs=probs_BxKxV), state
