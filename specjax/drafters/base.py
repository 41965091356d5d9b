"""The drafter interface the decode loop knows, and the empty drafter (plain autoregression).

A drafter is a frozen (hashable, static) dataclass with three pure functions over its own
state pytree:

    init(params, prefill: Prefill) -> state
    propose(params, state, ctx: DraftContext) -> (Draft, state)
    commit(state, verdict: Verdict, ctx: DraftContext) -> state

``propose`` returns draft tokens per row and, for sampled tokens, the distribution q each was
drawn from (after ``sampling.probs``), which is what the verifier needs to stay lossless: a
chain of K tokens, or a tree of N nodes with their ``parents`` (see trees.py). Deterministic
candidates (n-gram matches, argmax or top-k picks) set ``probs=None``: they are verified as
one-hot proposals and cost no V-wide array. A drafter may also ask for extra tokens to ride
along in the same target forward with its own attention mask (Lookahead's Jacobi window);
their target logits come back in the verdict.

Feature-level drafters (Medusa, EAGLE) name the target hidden states they read in
``feature_layers``: ``"final"`` (the final normed state the LM head reads) and/or layer indices
(the residual stream after that layer), concatenated along the last axis into F. The prefill
hands ``init`` the prompt's features; every verify hands ``commit`` the features of the root and
of each accepted node, from the same target forward. With ``feature_layers = ()`` (the default)
nothing extra is computed or carried.

Static sizes a drafter declares: ``num_draft`` (D, the most draft tokens one step can accept:
K for a chain, the tree's depth), ``num_nodes`` (N, draft tokens verified per step) and
``num_extra`` (E, extra tokens per step).

Each drafter also owns its config subsection (``config.drafter.<name>``): ``config()`` gives
its fields and defaults, ``check`` validates them before anything loads, and ``build`` makes the
drafter and its params once the target is loaded. ``specjax.drafters`` keeps the registry.
"""

import dataclasses
import numbers
from pathlib import Path
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import struct

from specjax.drafters.curves import read_cost_model
from specjax.models.config import ModelConfig
from specjax.sampling import SamplingParams


@struct.dataclass
class Draft:
  """What a drafter proposes for one step.

  ``probs[b, i]`` is the distribution token ``i`` was drawn from *given its earlier siblings*
  (before the verifier's renormalisation): for Gumbel-top-k children of one node, all share the
  node's q. ``probs=None`` means every token is a deterministic proposal (one-hot q).
  """

  tokens: jax.Array  # [B, N] int32: draft nodes 1..N (node 0 is the newest token).
  probs: jax.Array | None = None  # [B, N, V] float32, or None: deterministic candidates.
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
  # [B, D + 1, F] target features of the root (index 0) and of the accepted nodes along the
  # path, valid up to index n: index n is the state whose logits gave next_token. None when
  # the drafter asks for no features.
  features: jax.Array | None = None
  extra_logits: jax.Array | None = None  # [B, E, V] target logits at the extra tokens.


@struct.dataclass
class Prefill:
  """What ``Drafter.init`` sees: the prompts, and the target's features over them."""

  tokens: jax.Array  # [B, P] prompts, right-padded.
  lengths: jax.Array  # [B] prompt lengths.
  features: jax.Array | None  # [B, P, F] target features at every prompt position, or None.
  num_slots: int = struct.field(pytree_node=False)  # cache slots per row (as the target's).


@struct.dataclass
class DraftContext:
  """What a drafter may read at each step. ``tokens[b, lengths[b]]`` is the newest token."""

  tokens: jax.Array  # [B, S] prompt + everything emitted so far (and stale slots past it).
  lengths: jax.Array  # [B] committed target-cache length == index of the newest token.
  key: jax.Array
  sampling: SamplingParams
  vocab_size: int = struct.field(pytree_node=False)


@dataclasses.dataclass(frozen=True)
class Forward:
  """One forward a decoding step runs, as the cost model prices it: ``model`` ("target",
  "target_tree", "draft_model", "medusa", "eagle", "eagle_level", "lookup") over ``tokens``."""

  model: str
  tokens: int


def llama_sizes(cfg: ModelConfig) -> tuple[int, int]:
  """(parameters a forward reads, KV bytes per cached token at 2 bytes): the input embedding
  is a gather, so only a tied head reads the table."""
  read = cfg.num_params() - (0 if cfg.tie_embeddings else cfg.vocab_size * cfg.dim)
  return read, 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2


def verify_forward(drafter) -> Forward:
  """The target's forward of a step: the newest token, the draft's nodes and its extras, under
  a tree mask if the drafter's drafts carry parents."""
  kind = "target_tree" if drafter.verifies_tree else "target"
  return Forward(kind, drafter.num_nodes + 1 + drafter.num_extra)


class Drafter(Protocol):
  """What the decode loop (and ``generate``, before compiling) reads of a drafter: its static
  sizes, two checks, and three pure functions. Everything else specjax asks of a drafter
  (placement, price, tune, replay, training, layouts) is in its family record (family.py)."""

  name: str  # its family's name (config.drafter.name)
  num_draft: int  # D: most draft tokens accepted per step (static).
  num_nodes: int  # N: draft tokens verified per step (N = D for a chain).
  num_extra: int  # E: extra tokens fed to the target per step (0 for most drafters).
  feature_layers: tuple  # target features read: () none, "final", layer indices.

  @property
  def verifies_tree(self) -> bool: ...  # its drafts carry parents: verified under a tree mask

  def draft_calls_per_step(self) -> int: ...  # draft forwards a step runs (a metric)

  def check_target(self, target_cfg: ModelConfig) -> None: ...

  def check_context(self, max_len: int) -> None: ...

  def init(self, params: Any, prefill: Prefill) -> Any: ...

  def propose(self, params: Any, state: Any, ctx: DraftContext) -> tuple[Draft, Any]: ...

  def commit(self, state: Any, verdict: Verdict, ctx: DraftContext) -> Any: ...


class DrafterBase:
  """The protocol's defaults: no target features, no extra tokens, the K draft tokens are all
  the nodes verified (a tree drafter overrides ``num_nodes`` and ``verifies_tree``), any
  context fits; and the config group's hooks (the family record's ``drafter`` is the class)."""

  feature_layers: tuple = ()

  @property
  def num_nodes(self) -> int:
    return self.num_draft

  @property
  def num_extra(self) -> int:
    return 0

  def check_context(self, max_len: int) -> None:
    """Raises a ValueError if the drafter cannot work within ``max_len`` tokens per row."""
    del max_len

  @property
  def verifies_tree(self) -> bool:
    """Whether its drafts carry ``parents`` (verified under a tree mask), even where the tree
    is a chain."""
    return False

  @staticmethod
  def config() -> ml_collections.ConfigDict:
    """This drafter's config subsection (``config.drafter.<name>``) with its defaults."""
    return ml_collections.ConfigDict()

  @classmethod
  def check(cls, c: ml_collections.ConfigDict, config: ml_collections.ConfigDict):
    """Cheap checks of the subsection ``c`` (and the run ``config``), before anything loads.

    Returns the drafter where it can be made without the target (its budget is then checked
    too), else None."""
    del c, config

  @classmethod
  def build(cls, c: ml_collections.ConfigDict, config: ml_collections.ConfigDict, target):
    """``(drafter, drafter_params)`` from the subsection ``c`` and the loaded target."""
    raise NotImplementedError


class TokensOnly(DrafterBase):
  """Defaults for a drafter that reads only the token buffer (and its params, if any): no
  target features, no cache of its own; ``init`` keeps nothing and ``commit`` changes nothing
  unless it overrides them (Lookahead keeps an n-gram pool). Its replay is ``propose`` at
  every root (``teacher_forced_drafts``)."""

  def check_target(self, target_cfg: ModelConfig) -> None:
    del target_cfg

  @classmethod
  def check(cls, c, config):
    """Builds the drafter from its subsection (it needs no target): its own errors, named by
    the subsection, and its fit in ``config.max_len``."""
    try:
      d = cls.build(c, config, None)[0]
    except ValueError as e:
      raise ValueError(f"config.drafter.{cls.name}: {e}") from None
    d.check_context(config.max_len)
    return d

  def draft_calls_per_step(self) -> int:
    return 0

  def init(self, params, prefill):
    return ()

  def teacher_forced_drafts(self, target, params, x_1xS, roots_R, row_len):
    """``propose`` at every root at once: the text repeated, one row per root."""
    del row_len  # a stateless drafter reads the text only up to its root
    r = roots_R.shape[0]
    ctx = DraftContext(
      tokens=jnp.tile(x_1xS, (r, 1)),
      lengths=roots_R,
      key=jax.random.key(0),
      sampling=SamplingParams.create(temperature=0.0),
      vocab_size=target.cfg.vocab_size,
    )
    draft, _ = self.propose(params, None, ctx)
    abstain = jnp.zeros((r,), bool) if draft.abstain is None else draft.abstain
    return draft.tokens, None, abstain

  def commit(self, state, verdict, ctx):
    return state


@dataclasses.dataclass(frozen=True)
class NoDraft(TokensOnly):
  """Proposes nothing: the decode loop becomes plain autoregressive decoding (K = 0)."""

  name: str = "none"
  num_draft: int = 0

  @classmethod
  def build(cls, c, config, target):
    return cls(), None

  def propose(self, params, state, ctx):
    return Draft(tokens=jnp.zeros((ctx.tokens.shape[0], 0), jnp.int32)), state

  def step_forwards(self):
    return (Forward("target", 1),)


@dataclasses.dataclass(frozen=True)
class WithFeatures:
  """``inner`` unchanged but for ``feature_layers``: the target computes those features and
  hands them to ``init`` and ``commit``, which ``inner`` ignores. Measures the feature path's
  cost (tasks/feature_cost.py) and is the base of drafters that watch it (testing.Recording)."""

  inner: Any
  feature_layers: tuple

  def __getattr__(self, attr):  # everything else is the inner drafter's
    if attr == "inner":  # not set yet (copy, pickle): no recursion
      raise AttributeError(attr)
    return getattr(self.inner, attr)


CANDIDATES = {"sampled": True, "top_k": False, "auto": None}  # config value -> ``sampled``


def sampled_candidates(c: ml_collections.ConfigDict, field: str) -> bool | None:
  """``c.candidates`` as a drafter's ``sampled`` field: ``sampled`` (drawn from the draft,
  verified with q) True, ``top_k`` (deterministic) False, ``auto`` None: decided by each run's
  temperature (``at_temperature``), not when the drafter is built, so one drafter serves a
  sweep over temperatures. Another value is one error naming ``field``."""
  if c.candidates not in CANDIDATES:
    raise ValueError(
      f"{field}.candidates={c.candidates!r} is unknown; choose one of {', '.join(CANDIDATES)}."
    )
  return CANDIDATES[c.candidates]


def at_temperature(drafter, temperature: float):
  """The drafter as it decodes at ``temperature``: one whose candidates are ``auto``
  (``sampled=None``) draws them (sampled) above temperature 0 and takes the top-k at 0. Other
  drafters are returned as they are. ``decode.generate`` calls it for every run."""
  if isinstance(drafter, WithFeatures):
    return dataclasses.replace(drafter, inner=at_temperature(drafter.inner, temperature))
  if dataclasses.is_dataclass(drafter) and getattr(drafter, "sampled", False) is None:
    return dataclasses.replace(drafter, sampled=temperature > 0)
  return drafter


def check_auto_from(c, field: str, holds: str, config, knob: str = "num_draft") -> str:
  """``knob = "auto"``: ``c.auto_from`` names an existing ``cost_model.json``; returns the
  target's name (from its file's header, before any weights load) to match it against."""
  from specjax.models import source

  if not c.get("auto_from"):
    raise ValueError(
      f"{field}.{knob}='auto' needs {field}.auto_from: the cost_model.json of a "
      f"task=cost_model run {holds}."
    )
  if not Path(c.auto_from).is_file():
    raise ValueError(f"{field}.auto_from={c.auto_from!r} is not a file: run task=cost_model.")
  read_cost_model(c.auto_from, f"{field}.auto_from")
  target = source.peek(config.target)
  return target.cfg.name if target is not None else config.target.get("name", "")


# Tasks that decode with ``config.drafter`` itself (the others decode their own variants, train
# the drafter, or do not decode): there a trained drafter's empty path is an error up front.
DECODES_CONFIG_DRAFTER = ("generate", "benchmark", "max_len", "feature_cost", "losslessness")


def is_integer(value) -> bool:
  """An integer (numpy's too), not a bool or a float: a float (4.0) fails where it is a shape,
  and a bool (True) would be taken as 1."""
  return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def check_integer(value, field: str, least: int, what: str = "") -> None:
  """``value`` is an integer >= ``least`` (not a bool); else a ValueError naming ``field``."""
  if not is_integer(value) or value < least:
    said = f" ({what})" if what else ""
    raise ValueError(f"{field} must be an integer >= {least}{said}, got {value!r}.")


def check_seed(value, field: str) -> None:
  """A seed: an integer in [0, 2**32) (numpy's too); else a ValueError naming ``field``."""
  if not (is_integer(value) and 0 <= value < 2**32):
    raise ValueError(f"{field} must be an integer in [0, 2**32), got {value!r}.")


def check_num_draft(num_draft: int, field: str = "num_draft", low: int = 0) -> None:
  if not is_integer(num_draft) or num_draft < low:
    hint = "; use K = 0 for autoregressive decoding" if low == 0 else ""
    raise ValueError(f"{field} (K) must be an integer >= {low}, got {num_draft}{hint}.")
