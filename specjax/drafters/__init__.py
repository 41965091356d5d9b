"""Drafters, and the registry of their family records that picks one by name from a config.

    from specjax.drafters import DraftModel, Eagle, Lookahead, Medusa, NoDraft, PromptLookup

A config's ``drafter`` section holds ``name`` (a registered family's), the step budgets
``max_depth`` and ``max_nodes``, and one subsection per registered drafter with that drafter's
own fields (``drafter.prompt_lookup.num_draft``, ``drafter.lookahead.window``, ...): see
``default_config``. Adding a drafter is one module or package holding the drafter (the
protocol in ``base.py``) and its family record (``family.py``), registered with one call;
importing this package registers the built-in ones. The decode loop (loop.py) never changes.
"""

import ml_collections

from specjax.drafters import family
from specjax.drafters.base import Draft, DraftContext, Drafter, NoDraft, Prefill, Verdict
from specjax.drafters.dflash import DFlash
from specjax.drafters.draft_model import DraftModel
from specjax.drafters.eagle import Eagle
from specjax.drafters.family import FAMILIES, Family, register
from specjax.drafters.lookahead import Lookahead
from specjax.drafters.medusa import Medusa
from specjax.drafters.peagle import PEagle
from specjax.drafters.prompt_lookup import PromptLookup

register(
  Family(
    name="none",
    drafter=NoDraft,
    price=family.Price(forwards=NoDraft.step_forwards),
    replay=family.Replay(drafts=NoDraft.teacher_forced_drafts),
  )
)
# The built-in families in the order configs and records have always listed them.
_BUILT_IN = (
  "none", "draft_model", "prompt_lookup", "lookahead", "medusa", "eagle", "dflash", "peagle",
)  # fmt: skip
_ordered = {n: FAMILIES[n] for n in _BUILT_IN} | FAMILIES
FAMILIES.clear()
FAMILIES.update(_ordered)

__all__ = [
  "FAMILIES",
  "Family",
  "Draft",
  "DraftContext",
  "DFlash",
  "DraftModel",
  "Drafter",
  "Eagle",
  "Lookahead",
  "Medusa",
  "NoDraft",
  "PEagle",
  "Prefill",
  "PromptLookup",
  "Verdict",
  "build",
  "register",
  "check",
  "default_config",
]


def default_config(name: str = "none") -> ml_collections.ConfigDict:
  """The ``drafter`` config section: every registered drafter's subsection with its defaults."""
  c = ml_collections.ConfigDict()
  c.name = name  # a registered family: none, draft_model, prompt_lookup, lookahead, medusa, eagle
  c.max_depth = 16  # budget: most draft tokens one step may accept
  c.max_nodes = 64  # budget: most draft + extra tokens fed to the target per step
  for key, f in FAMILIES.items():
    sub = f.drafter.config()
    if len(sub):
      c[key] = sub
  return c


def _cls(config: ml_collections.ConfigDict) -> type:
  name = config.drafter.name
  if name not in FAMILIES:
    raise ValueError(
      f"config.drafter.name={name!r} is unknown; choose one of {', '.join(FAMILIES)}."
    )
  return FAMILIES[name].drafter


def _section(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  name = config.drafter.name
  return config.drafter[name] if name in config.drafter else ml_collections.ConfigDict()


def check(config: ml_collections.ConfigDict) -> Drafter | None:
  """The drafter's own checks and the step budgets, before anything is loaded; the drafter
  where its config alone makes it (None where it needs its weights or the target's sizes)."""
  drafter = _cls(config).check(_section(config), config)
  if drafter is not None:
    check_budget(drafter, config.drafter)
  return drafter


def build(config: ml_collections.ConfigDict, target) -> tuple[Drafter, object]:
  """``(drafter, drafter_params)`` for the loaded ``target`` (a ``models.source.Model``)."""
  drafter, params = _cls(config).build(_section(config), config, target)
  check_budget(drafter, config.drafter)
  return drafter, params


def check_budget(drafter: Drafter, c: ml_collections.ConfigDict) -> None:
  """A drafter's step must fit ``drafter.max_depth`` levels and ``drafter.max_nodes`` tokens."""
  if drafter.num_draft > c.max_depth:
    raise ValueError(
      f"the {drafter.name} draft is {drafter.num_draft} tokens deep, more than "
      f"config.drafter.max_depth={c.max_depth}: shorten it or raise the budget."
    )
  if drafter.num_nodes + drafter.num_extra > c.max_nodes:
    raise ValueError(
      f"the {drafter.name} draft feeds {drafter.num_nodes + drafter.num_extra} tokens per step, "
      f"more than config.drafter.max_nodes={c.max_nodes}: use fewer branches/candidates or a "
      "smaller window, or raise the budget."
    )
