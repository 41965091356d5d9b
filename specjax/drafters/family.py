"""One record per drafter family: everything the rest of specjax asks of a drafter, in groups.

The decode loop reads only the protocol in ``base.py`` (static sizes, init, propose, commit).
Everything else (how the config builds it, where its weights go, what a step costs and how to
time it, which budget ``auto`` searches, how the τ simulator replays it, how it is trained,
which published files it reads and writes) is declared here, once, by the package that
defines the drafter, and registered with one call::

    family.register(family.Family(
      name="medusa",
      drafter=Medusa,  # the config group: its config(), check() and build()
      placement=family.Placement(check_params=Medusa.check_params),
      price=family.Price(forwards=Medusa.step_forwards, timers={"medusa": family.time_propose},
                         sizes=Medusa.own_sizes),
      replay=family.Replay(drafts=Medusa.teacher_forced_drafts, tree=lambda d: d.static_tree,
                           chain=None),
      objective=MedusaHeads,
      saved=family.Saved(META_FILE, load, layouts.export, EXPORTS, WRITES, layouts.check_export),
    ))

A group left as None says the family lacks it (a training-free drafter has no objective and
nothing saved; a drafter without ``tune`` has no ``auto`` knob), and whoever asks for it gets
one clear error naming the drafter. Nothing outside ``specjax/drafters/`` switches on a
drafter's name or class: ``costmodel``, ``simulate``, ``build``, the export task and the
training objectives read these records.

The registry here imports no drafter, so modules below the drafters' packages (``artifact``)
can read it; ``specjax.drafters`` imports every built-in package, which registers itself.
"""

import dataclasses
import functools
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from specjax import sampling
from specjax.drafters import timing
from specjax.drafters.base import DraftContext, Forward
from specjax.models.config import ModelConfig
from specjax.trees import Tree

# A timer: (drafter, its params, the target's config, cached context, the token counts of this
# forward in the drafter's steps, timed rounds) -> {tokens: median seconds}.
Timer = Callable[[Any, Any, ModelConfig, int, list, int], dict]


def no_rules(drafter) -> tuple:
  del drafter
  return ()


def no_cache(drafter) -> None:
  del drafter


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where its weights and cache go: partition rules of its params on a decoding mesh, the
  decoder whose KV cache it keeps beside the target's (``decode.footprint`` counts it), and a
  check that params fit the drafter (``generate`` runs it before compiling)."""

  partition_rules: Callable[[Any], tuple] = no_rules
  cache_model: Callable[[Any], ModelConfig | None] = no_cache
  check_params: Callable[[Any, Any], None] | None = None


@dataclasses.dataclass(frozen=True)
class Price:
  """What one step costs: the forwards it runs (the drafter's own, then the target's verify:
  ``forwards``), per own forward the sizes the roofline reads (``sizes``: params read, KV
  bytes per cached token) and how to time it on this machine (``timers``, keyed by
  ``Forward.model``), so ``costmodel`` prices any drafter without knowing its kind.
  ``alone``: for a drafter that is itself a language model (a draft model), its config, so a
  benchmark times it decoding on its own beside AR and the losslessness task compares its
  logits with the target's; None for the others."""

  forwards: Callable[[Any], tuple[Forward, ...]]
  timers: Mapping[str, Timer] = dataclasses.field(default_factory=dict)
  sizes: Callable[[Any, Any], dict] = lambda drafter, params: {}
  alone: Callable[[Any], ModelConfig] | None = None


def setting(drafter, g: dict):
  """``drafter`` with the fields that setting ``g`` names (its other keys, τ and the like,
  are not the drafter's)."""
  fields = {f.name for f in dataclasses.fields(drafter)}
  return dataclasses.replace(drafter, **{k: v for k, v in g.items() if k in fields})


@dataclasses.dataclass(frozen=True)
class Sweep:
  """How ``task=cost_model`` writes what a ``Tune.grid`` reads: ``run(drafter, dparams, cm,
  replay) -> (base, settings)`` replays every setting (``replay(drafter, dparams)`` is the
  simulator's ``Replay`` over the task's rows; ``cm`` its ``config.cost_model``) and returns
  them, each a dict with ``tau`` (and ``abstained``), with the drafter they price through
  ``Tune.apply`` (``base``); ``key``: the list of ``cost_model.json`` they go to; ``tag(c)``:
  the fields of the variant's subsection ``c`` that say whose settings they are (EAGLE: its
  ``path``), ``{}`` for one list per file."""

  key: str
  run: Callable
  tag: Callable[[Any], dict] = lambda c: {}


@dataclasses.dataclass(frozen=True)
class Tune:
  """The budget ``auto`` searches. ``field`` of ``config.drafter.<name>`` set to ``"auto"``
  asks for it; ``grid(config, target_name)`` reads the settings to weigh, each a dict with
  ``tau`` (greedy, replayed offline by ``task=cost_model``) and optionally ``abstained`` (the
  share of one-token steps), from the file its ``auto_from`` names; ``label(g)`` names a
  setting in the printed table; ``prefer(g)`` breaks ties in predicted speedup (larger wins);
  ``apply(drafter, g)`` is the drafter at setting ``g`` (by default: ``g``'s keys that are
  the drafter's fields). ``timed(sizes)``: the target's token counts to time (the others
  interpolated), by default all; ``group(drafter)``: drafters whose own forwards cost alike
  (EAGLE's level forward reads ``top_k`` rows), timed once per group; ``sweep``: how
  ``task=cost_model`` replays the grid (None: from ``tau_by_k``, every chain's)."""

  field: str
  grid: Callable[[Any, str], list[dict]]
  label: Callable[[dict], str]
  prefer: Callable[[dict], tuple]
  apply: Callable[[Any, dict], Any] = setting
  timed: Callable[[list[int]], list[int]] = sorted
  group: Callable[[Any], Hashable] = lambda drafter: None
  sweep: Sweep | None = None


def chain_length(drafter, k: int):
  """The same chain drafter drafting ``k`` tokens per step."""
  return dataclasses.replace(drafter, num_draft=k)


def chain_tree(drafter) -> Tree:
  """A chain drafter's tree: ``num_draft`` nodes, each the child of the one before."""
  return Tree.chain(drafter.num_draft)


@dataclasses.dataclass(frozen=True)
class Replay:
  """How the τ simulator replays it offline (``simulate.py``): ``drafts(drafter, target,
  params, x_1xS, roots_R, row_len) -> (tokens [R, N], parents [R, N] or None, abstain [R])``,
  greedy, from the text alone; ``tree(drafter)``: the tree every step verifies (None: drawn
  anew each step); ``chain(drafter, k)``: the same drafter as a k-chain, or None where no
  such sweep makes sense; ``longest(drafter)``: the longest chain it can draft (a block
  drafter's positions; None: any length)."""

  drafts: Callable
  tree: Callable[[Any], Tree | None] = chain_tree
  chain: Callable[[Any, int], Any] | None = chain_length
  longest: Callable[[Any], int] | None = None


@dataclasses.dataclass(frozen=True)
class Saved:
  """A trained drafter on disk. ``meta_file``: the JSON naming its kind in a directory
  ``task=train`` wrote; ``load(directory, target, field) -> (cfg, params, meta)``;
  ``export(cfg, params, out, format, dtype, **options) -> path`` writes one of ``formats``
  (the published layouts other engines read: ``docs/drafters.md``); ``writes``: the file names
  an export may replace; ``check_export(directory, format, dtype, options, field)``: the saved
  drafter's shapes against the format, before anything loads; ``options``: the export's
  extra fields (``config.export.<field>``) it takes."""

  meta_file: str
  load: Callable
  export: Callable
  formats: tuple[str, ...]
  writes: tuple[str, ...]
  check_export: Callable | None = None
  options: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Family:
  """A drafter family's record: ``drafter`` is its class (the config group: ``config()``
  gives ``config.drafter.<name>``'s defaults, ``check`` validates it before anything loads,
  ``build`` makes ``(drafter, params)`` once the target is loaded); the other groups as above,
  None where the family has none; ``objective``: the class ``task=train`` trains it with
  (``config.objective.<objective.name>``), None for a training-free drafter."""

  name: str
  drafter: type
  placement: Placement = Placement()
  price: Price | None = None
  tune: Tune | None = None
  replay: Replay | None = None
  objective: type | None = None
  saved: Saved | None = None

  def need(self, group: str):
    """Group ``group``, or one error saying this family has none."""
    value = getattr(self, group)  # a field of this record, by its name
    if value is None:
      raise ValueError(f"drafter {self.name!r} has no {group} (its family record leaves it out).")
    return value


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
  """Adds ``family`` under its name (``config.drafter.name``); the same name again replaces it
  (a test registering a drafter of its own, or a module reloaded)."""
  FAMILIES[family.name] = family
  return family


def unregister(name: str) -> None:
  FAMILIES.pop(name, None)


def of(drafter) -> Family:
  """The record of ``drafter`` (an instance, found by its ``name``)."""
  name = drafter.name
  if name not in FAMILIES:
    raise ValueError(
      f"drafter {name!r} is not registered: register its family record (family.register)."
    )
  return FAMILIES[name]


def placement_of(drafter) -> Placement:
  """Where ``drafter`` goes: its family's placement, or nothing to place (no rules, no cache
  of its own, no check) for a drafter made without a record (a test's)."""
  record = FAMILIES.get(drafter.name)
  return Placement() if record is None else record.placement


def saved_kinds() -> dict[str, str]:
  """``{meta file: family name}`` of every family that saves trained drafters."""
  return dict(sorted((f.saved.meta_file, f.name) for f in FAMILIES.values() if f.saved))


# --- timers shared by several families ------------------------------------------------------


def time_propose(drafter, dparams, target_cfg: ModelConfig, context: int, sizes, repeats: int):
  """The drafter's whole ``propose`` at batch 1 after ``context`` tokens (one entry, T = 1):
  for drafters whose own step is one call (heads, top-k, an n-gram search), not a forward
  over T tokens. Its state is a [1, F] feature where it reads one, else None."""
  del sizes
  state = jnp.ones((1, target_cfg.dim), jnp.float32) if drafter.feature_layers else None
  ctx = DraftContext(
    tokens=jnp.ones((1, context + 64), jnp.int32), lengths=jnp.asarray([context], jnp.int32),
    key=jax.random.key(0), sampling=sampling.SamplingParams.create(0.0),
    vocab_size=target_cfg.vocab_size,
  )  # fmt: skip
  fn = jax.jit(functools.partial(_propose_tokens, drafter=drafter))
  return {1: timing.median_seconds(lambda: fn(dparams, state, ctx), repeats)}


def _propose_tokens(params, state, ctx, *, drafter):
  return drafter.propose(params, state, ctx)[0].tokens
