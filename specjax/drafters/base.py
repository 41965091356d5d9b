"""The drafter interface the decode loop knows, and the empty drafter (plain autoregression).

A drafter is a frozen (hashable, static) dataclass with three pure functions over its own
state pytree:

    init(params, prompt[B,P], prompt_lengths[B], num_slots) -> state
    propose(params, state, ctx) -> (Draft, state)
    commit(state, verdict, ctx) -> state

``propose`` returns draft tokens per row and the distribution q each was drawn from (after
``sampling.probs``), which is what the verifier needs to stay lossless: a chain of K tokens,
or a tree of N nodes with their ``parents`` (see trees.py). A drafter may also ask for extra
tokens to ride along in the same target forward with its own attention mask (Lookahead's
Jacobi window); their target logits come back in the verdict. Adding a drafter never touches
decode.py.

Static sizes a drafter declares: ``num_draft`` (D, the most draft tokens one step can accept:
K for a chain, the tree's depth), ``num_nodes`` (N, draft tokens verified per step) and
``num_extra`` (E, extra tokens per step).
"""

import dataclasses
from typing import Any, Protocol

import jax
import jax.numpy as jnp
from flax import struct

from specjax.models.config import ModelConfig
from specjax.sampling import SamplingParams


@struct.dataclass
class Draft:
  """What a drafter proposes for one step.

  ``probs[b, i]`` is the distribution token ``i`` was drawn from *given its earlier siblings*
  (before the verifier's renormalisation): for Gumbel-top-k children of one node, all share the
  node's q; for a deterministic proposal (n-gram match, argmax) it is one-hot on the token.
  """

  tokens: jax.Array  # [B, N] int32: draft nodes 1..N (node 0 is the newest token).
  probs: jax.Array  # [B, N, V] float32
  parents: jax.Array | None = None  # [B, N] int32 parent node of nodes 1..N; None = a chain.
  extra_tokens: jax.Array | None = None  # [B, E] tokens fed beside the tree, never accepted.
  extra_offsets: jax.Array | None = None  # [B, E] their positions relative to the newest token.
  extra_mask: jax.Array | None = None  # [B, E, N + 1 + E] bool: what each extra token sees.
  # [B] bool: rows with nothing worth verifying. When every live row abstains the step is a
  # one-token forward (an AR step); rows verified anyway get the draft checked as usual.
  abstain: jax.Array | None = None


@struct.dataclass
class Verdict:
  """What the verifier decided for one step, handed to ``Drafter.commit``."""

  num_accepted: jax.Array  # [B] n: draft tokens kept.
  path: jax.Array  # [B, D] accepted node ids (1-based) at depths 1..D; valid where d < n.
  next_token: jax.Array  # [B] the target's token after the accepted ones.
  extra_logits: jax.Array | None = None  # [B, E, V] target logits at the extra tokens.


@struct.dataclass
class DraftContext:
  """What a drafter may read at each step. ``tokens[b, lengths[b]]`` is the newest token."""

  tokens: jax.Array  # [B, S] prompt + everything emitted so far (and stale slots past it).
  lengths: jax.Array  # [B] committed target-cache length == index of the newest token.
  key: jax.Array
  sampling: SamplingParams
  vocab_size: int = struct.field(pytree_node=False)


class Drafter(Protocol):
  name: str
  num_draft: int  # D: most draft tokens accepted per step (static).
  num_nodes: int  # N: draft tokens verified per step (N = D for a chain).
  num_extra: int  # E: extra tokens fed to the target per step (0 for most drafters).

  def check_target(self, target_cfg: ModelConfig) -> None: ...

  def check_context(self, max_len: int) -> None: ...

  def draft_calls_per_step(self) -> int: ...

  def init(self, params: Any, prompt_BxP, prompt_lengths_B, num_slots: int) -> Any: ...

  def propose(self, params: Any, state: Any, ctx: DraftContext) -> tuple[Draft, Any]: ...

  def commit(self, state: Any, verdict: Verdict, ctx: DraftContext) -> Any: ...


class Chain:
  """Sizes of a chain drafter: it verifies its K draft tokens and nothing else."""

  @property
  def num_nodes(self) -> int:
    return self.num_draft

  @property
  def num_extra(self) -> int:
    return 0

  def check_context(self, max_len: int) -> None:
    """Raises a ValueError if the drafter cannot work within ``max_len`` tokens per row."""
    del max_len


class Stateless(Chain):
  """Defaults for a drafter with no model and no state (it reads only the token buffer)."""

  def check_target(self, target_cfg: ModelConfig) -> None:
    del target_cfg

  def draft_calls_per_step(self) -> int:
    return 0

  def init(self, params, prompt_BxP, prompt_lengths_B, num_slots):
    return ()

  def commit(self, state, verdict, ctx):
    return state


@dataclasses.dataclass(frozen=True)
class NoDraft(Stateless):
  """Proposes nothing: the decode loop becomes plain autoregressive decoding (K = 0)."""

  name: str = "none"
  num_draft: int = 0

  def propose(self, params, state, ctx):
    b = ctx.tokens.shape[0]
    empty = Draft(
      tokens=jnp.zeros((b, 0), jnp.int32), probs=jnp.zeros((b, 0, ctx.vocab_size), jnp.float32)
    )
    return empty, state


def check_num_draft(num_draft: int) -> None:
  if int(num_draft) != num_draft or num_draft < 0:
    raise ValueError(
      f"num_draft (K) must be an integer >= 0, got {num_draft}; use K = 0 for autoregressive "
      "decoding."
    )
