"""The drafter interface the decode loop knows, and the empty drafter (plain autoregression).

A drafter is a frozen (hashable, static) dataclass with three pure functions over its own
state pytree:

    init(params, prompt[B,P], prompt_lengths[B], num_slots) -> state
    propose(params, state, ctx) -> (Draft, state)
    commit(state, num_accepted[B], ctx) -> state

``propose`` returns K tokens per row and the distribution q each was drawn from (after
``sampling.probs``), which is what the verifier needs to stay lossless. Adding a drafter
never touches decode.py.
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
  tokens: jax.Array  # [B, K] int32
  probs: jax.Array  # [B, K, V] float32: the q each token was sampled from.


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
  num_draft: int  # K: draft tokens per step (static).

  def check_target(self, target_cfg: ModelConfig) -> None: ...

  def draft_calls_per_step(self) -> int: ...

  def init(self, params: Any, prompt_BxP, prompt_lengths_B, num_slots: int) -> Any: ...

  def propose(self, params: Any, state: Any, ctx: DraftContext) -> tuple[Draft, Any]: ...

  def commit(self, state: Any, num_accepted_B: jax.Array, ctx: DraftContext) -> Any: ...


class Stateless:
  """Defaults for a drafter with no model and no state (it reads only the token buffer)."""

  def check_target(self, target_cfg: ModelConfig) -> None:
    del target_cfg

  def draft_calls_per_step(self) -> int:
    return 0

  def init(self, params, prompt_BxP, prompt_lengths_B, num_slots):
    return ()

  def commit(self, state, num_accepted_B, ctx):
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
