"""Prompt lookup (n-gram) drafting, as a chain or a tree: no draft model, no training.

The last n tokens of a row (n from ``max_ngram`` down to ``min_ngram``) are searched for in
everything the row holds so far (prompt and output); the K tokens that followed an earlier
occurrence are a draft branch. With ``num_branches = G > 1`` the G best distinct occurrences
(longest n first, then the latest) become G branches from the root: a tree of G * K nodes
verified in one target forward. Pure jnp over the static token buffer, inside the loop.

A row with no match abstains (``abstain=True``): when every live row of the batch abstains,
the step is a one-token forward, as cheap as an AR step. Raising ``min_ngram`` makes the
drafter abstain more and guess less. Where verifying K + 1 tokens costs about as much as one
(accelerators), ``abstain=False`` verifies a repeat of the newest token instead.

Each branch is deterministic given the context (``Draft.probs=None``, a one-hot q): the
verifier accepts a token with probability p'(x) and on rejection removes x from p', which is the
lossless rule for deterministic proposals. Branches that repeat a sibling's token waste a
node but stay lossless (p'(x) is 0 after the first rejection of x).

Config (``config.drafter.prompt_lookup``): num_draft, max_ngram, min_ngram, num_branches,
abstain, as the fields below. ``num_draft = "auto"`` (a chain, with ``auto_from``: a
``cost_model.json`` whose ``lookup_grid`` holds τ and abstentions for every K and min_ngram,
replayed offline) picks K and min_ngram for the machine it runs on
(``costmodel.auto`` with this family's ``tune``: step costs timed there).
"""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from ml_collections import config_dict

from specjax import trees
from specjax.drafters import curves, family
from specjax.drafters.base import (
  Draft,
  DraftContext,
  Forward,
  TokensOnly,
  check_auto_from,
  check_integer,
  check_num_draft,
  is_integer,
  verify_forward,
)
from specjax.models.cache import gather_rows

FIELD = "config.drafter.prompt_lookup"


@dataclasses.dataclass(frozen=True)
class PromptLookup(TokensOnly):
  num_draft: int
  max_ngram: int = 3
  min_ngram: int = 1
  num_branches: int = 1
  abstain: bool = True  # no match in a row: abstain (a whole batch abstaining costs 1 token)
  name: str = "prompt_lookup"

  def __post_init__(self):
    check_num_draft(self.num_draft, low=1)
    if not 1 <= self.min_ngram <= self.max_ngram:
      raise ValueError(
        f"prompt lookup needs 1 <= min_ngram <= max_ngram, got min_ngram={self.min_ngram}, "
        f"max_ngram={self.max_ngram}."
      )
    if not is_integer(self.num_branches) or self.num_branches < 1:
      raise ValueError(f"num_branches must be an integer >= 1, got {self.num_branches}.")

  @staticmethod
  def config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.num_draft = config_dict.FieldReference(4, field_type=object)  # K per branch, or "auto"
    c.auto_from = ""  # num_draft = "auto": a cost_model.json with a lookup_grid (task=cost_model)
    c.auto_fallback = 4  # "auto" on a target auto_from was not measured for: this K (0: an error)
    c.max_ngram = 3  # longest suffix n-gram searched for
    c.min_ngram = 1  # shortest
    c.num_branches = 1  # > 1: a tree of the best distinct matches
    c.abstain = True  # no match in a row: a one-token step instead of a guess
    return c

  @classmethod
  def check(cls, c, config):
    for f in ("max_ngram", "min_ngram", "num_branches"):
      check_integer(c[f], f"{FIELD}.{f}", 1)
    if c.num_draft == "auto":
      if c.num_branches != 1:
        raise ValueError(f"{FIELD}.num_draft='auto' picks a chain: set num_branches = 1.")
      name = check_auto_from(c, FIELD, "on this target (it holds τ for every K and min_ngram)",
                             config)  # fmt: skip
      measured = curves.read_cost_model(c.auto_from, f"{FIELD}.auto_from")["target"]
      if measured != name and c.auto_fallback:
        check_num_draft(c.auto_fallback, f"{FIELD}.auto_fallback", low=1)
        print(
          f"note: {FIELD}.num_draft='auto': {c.auto_from!r} was measured for target "
          f"{measured!r}, not {name!r}; drafting K = {c.auto_fallback} tokens instead "
          f"({FIELD}.auto_fallback; run task=cost_model with this target to pick K for it)."
        )
        c.num_draft = c.auto_fallback
        return super().check(c, config)
      if not c.abstain:
        raise ValueError(
          f"{FIELD}.num_draft='auto' prices abstaining steps as AR steps: set abstain = True."
        )
      grid = curves.lookup_curve(c.auto_from, name)
      replayed = max(g["min_ngram"] for g in grid)  # the grid's min_ngram runs 1..max_ngram
      if c.max_ngram != replayed:
        raise ValueError(
          f"{FIELD}.max_ngram={c.max_ngram}, but {c.auto_from!r} replayed max_ngram={replayed}: "
          f"set max_ngram = {replayed}, or run task=cost_model with it."
        )
    elif isinstance(c.num_draft, str):
      raise ValueError(
        f"{FIELD}.num_draft={c.num_draft!r}: an integer K >= 1, or 'auto' (with auto_from) to "
        "pick K and min_ngram for this machine."
      )
    else:
      check_num_draft(c.num_draft, f"{FIELD}.num_draft", low=1)
    return super().check(c, config)

  @classmethod
  def build(cls, c, config, target):
    k = 1 if c.num_draft == "auto" else c.num_draft  # auto: set by build.drafter
    return cls(k, c.max_ngram, c.min_ngram, c.num_branches, c.abstain), None

  @property
  def tree(self) -> trees.Tree:
    """G chains of K tokens from the root."""
    k = self.num_draft
    return trees.Tree(
      tuple(0 if d == 0 else g * k + d for g in range(self.num_branches) for d in range(k))
    )

  @property
  def num_nodes(self) -> int:
    return self.num_branches * self.num_draft

  def check_context(self, max_len: int) -> None:
    if self.max_ngram >= max_len:
      raise ValueError(
        f"max_ngram={self.max_ngram} is not smaller than max_len={max_len}: an n-gram longer "
        "than the context can never match. Lower max_ngram."
      )

  def match_scores(self, tokens_BxS: jax.Array, lengths_B: jax.Array) -> jax.Array:
    """``[B, S]``: for each slot e, ``n * S + e`` where n is the longest suffix n-gram that also
    ends right before slot e (so a draft may start at e), or -1 where none does."""
    s = tokens_BxS.shape[1]
    j_S = jnp.arange(s)
    score_BxS = jnp.full(tokens_BxS.shape, -1)
    for n in range(self.min_ngram, self.max_ngram + 1):
      suffix_at_Bxn = jnp.maximum(lengths_B[:, None] - n + 1 + jnp.arange(n), 0)
      suffix_Bxn = gather_rows(tokens_BxS, suffix_at_Bxn)
      same_BxS = jnp.ones(tokens_BxS.shape, bool)
      for m in range(n):  # the window starting at j matches the suffix at offset m
        same_BxS &= jnp.roll(tokens_BxS, -m, axis=1) == suffix_Bxn[:, m : m + 1]
      # The match must end before the suffix itself starts repeating it: j + n <= L.
      ok_BxS = same_BxS & (j_S + n <= lengths_B[:, None]) & (lengths_B[:, None] >= n - 1)
      end_BxS = jnp.roll(ok_BxS, n, axis=1) & (j_S >= n)  # slot e = j + n
      score_BxS = jnp.where(end_BxS, n * s + j_S, score_BxS)
    return score_BxS

  def match_ends(self, tokens_BxS: jax.Array, lengths_B: jax.Array) -> jax.Array:
    """``[B, G]``: the slots where the G best matches' continuations start, -1 if none."""
    score_BxS = self.match_scores(tokens_BxS, lengths_B)
    best_BxG, end_BxG = jax.lax.top_k(score_BxS, self.num_branches)
    return jnp.where(best_BxG >= 0, end_BxG, -1)

  def match_end(self, tokens_BxS: jax.Array, lengths_B: jax.Array) -> jax.Array:
    """``[B]``: where the best match's continuation starts, -1 where no n-gram matches."""
    return self.match_ends(tokens_BxS, lengths_B)[:, 0]

  @property
  def verifies_tree(self) -> bool:
    return self.num_branches > 1

  def step_forwards(self):
    return (Forward("lookup", 1), verify_forward(self))

  def propose(self, params, state, ctx: DraftContext):
    b, k, g = ctx.tokens.shape[0], self.num_draft, self.num_branches
    start_BxG = self.match_ends(ctx.tokens, ctx.lengths)
    abstain_B = (start_BxG[:, 0] < 0) if self.abstain else None
    # Without a match, guess a repeat of the newest token. Continuations are clipped to the
    # committed text (slots <= L): past it the buffer holds stale drafts.
    start_BxG = jnp.where(start_BxG < 0, ctx.lengths[:, None], start_BxG)
    idx_BxGK = start_BxG[:, :, None] + jnp.arange(k)
    idx_BxGK = jnp.minimum(idx_BxGK, ctx.lengths[:, None, None]).reshape(b, g * k)
    tokens_BxN = gather_rows(ctx.tokens, idx_BxGK)
    parents = None
    if g > 1:
      parents = jnp.broadcast_to(jnp.asarray(np.asarray(self.tree.parents), jnp.int32), (b, g * k))
    return Draft(tokens_BxN, parents=parents, abstain=abstain_B), state


# --- A lookup branch inside another drafter's tree (EAGLE, Medusa) ------------------------------

BRANCH_MAX_NGRAM = 3  # the longest suffix a branch's guess matches


def add_branch_fields(c: ml_collections.ConfigDict) -> None:
  """A tree drafter's config fields for a lookup branch (``branch`` reads them)."""
  c.lookup = 0  # K > 0: prompt lookup's K-token guess as one more branch from the root
  c.lookup_min_ngram = 1  # the shortest suffix match (of up to 3 tokens) it guesses from


def check_branch_fields(c: ml_collections.ConfigDict, field: str) -> None:
  if not is_integer(c.lookup) or c.lookup < 0:
    raise ValueError(
      f"{field}.lookup must be an integer >= 0 (0 = no lookup branch), got {c.lookup!r}."
    )
  if c.lookup and not 1 <= c.lookup_min_ngram <= BRANCH_MAX_NGRAM:
    raise ValueError(
      f"{field}.lookup_min_ngram={c.lookup_min_ngram} must be in [1, {BRANCH_MAX_NGRAM}]."
    )


def branch(c: ml_collections.ConfigDict) -> PromptLookup | None:
  """The lookup branch a config subsection asks for (None when ``lookup`` is 0)."""
  if not c.lookup:
    return None
  return PromptLookup(c.lookup, BRANCH_MAX_NGRAM, c.lookup_min_ngram, abstain=False)


def check_branch(lookup: PromptLookup | None, field: str) -> None:
  if lookup is not None and (lookup.num_branches != 1 or lookup.abstain):
    raise ValueError(f"{field}.lookup is one chain that always proposes (abstain=False).")


def with_branch(draft: Draft, lookup: PromptLookup, ctx: DraftContext) -> Draft:
  """``draft``'s N nodes, then ``lookup``'s guess as one more chain from the root: its first
  node the root's last child, each next one the child of the one before (node ids N + 1 ..).

  The guess is deterministic (one-hot q). It goes after the drafter's own children: the
  verifier removes a rejected child's token from the next siblings' q, which is right for
  children drawn without replacement from that q, and a one-hot guess last takes nothing from
  them."""
  guess, _ = lookup.propose(None, None, ctx)
  (b, n), k = draft.tokens.shape, lookup.num_draft
  own = draft.parents if draft.parents is not None else jnp.broadcast_to(np.arange(n), (b, n))
  chain = jnp.broadcast_to(trees.branch_parents(n, k), (b, k))
  parents = jnp.concatenate([own.astype(jnp.int32), chain], axis=1)
  tokens = jnp.concatenate([draft.tokens, guess.tokens], axis=1)
  if draft.probs is None:
    return Draft(tokens=tokens, parents=parents)
  one_hot = jax.nn.one_hot(guess.tokens, draft.probs.shape[-1], dtype=draft.probs.dtype)
  return Draft(tokens=tokens, probs=jnp.concatenate([draft.probs, one_hot], 1), parents=parents)


def _settings(config, target_name: str) -> list[dict]:
  """``{num_draft, min_ngram, tau, abstained}`` of every setting within the step budgets, from
  the ``lookup_grid`` of ``auto_from``."""
  grid = curves.lookup_curve(config.drafter.prompt_lookup.auto_from, target_name)
  most = max(g["num_draft"] for g in grid)
  limit = min(most, config.drafter.max_depth, config.drafter.max_nodes)
  return [g for g in grid if g["num_draft"] <= limit]


def _timed_sizes(sizes: list[int]) -> list[int]:
  """Four of the verify sizes are timed, the rest interpolated: a chain of K costs K + 1."""
  most = max(sizes)
  return sorted({2, 3, (most + 2) // 2, most})


def _sweep(drafter, dparams, cm, replay):
  """Every K in 1..``cost_model.max_k`` and min_ngram in 1..3 of a one-branch chain that
  abstains where nothing matches, replayed: τ and the share of one-token steps."""
  del drafter, dparams  # the grid is the text's: every prompt-lookup variant shares it
  out = []
  for n in range(1, 4):
    for k in range(1, cm.get("max_k", 8) + 1):
      r = replay(PromptLookup(k, max_ngram=3, min_ngram=n), None)
      out.append({"num_draft": k, "min_ngram": n, "tau": r.tau, "abstained": r.abstained / r.calls})
  return PromptLookup(1), out


FAMILY = family.register(
  family.Family(
    name="prompt_lookup",
    drafter=PromptLookup,
    price=family.Price(
      forwards=PromptLookup.step_forwards,
      timers={"lookup": family.time_propose},
      sizes=lambda d, params: {"lookup": (0, 0)},  # reads no weights: free on a roofline
    ),
    tune=family.Tune(
      field="num_draft",
      grid=_settings,
      label=lambda g: f"K={g['num_draft']} min_ngram={g['min_ngram']}",
      prefer=lambda g: (-g["num_draft"], -g["min_ngram"]),
      timed=_timed_sizes,
      sweep=family.Sweep(key="lookup_grid", run=_sweep),
    ),
    replay=family.Replay(drafts=PromptLookup.teacher_forced_drafts, tree=lambda d: d.tree),
  )
)
