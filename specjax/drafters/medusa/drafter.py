"""Medusa's drafter: the static tree its heads fill, one node per (depth, rank), verified by the
tree verifier; state, config section and build. The heads are ``model.py``.
"""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from specjax import indexing
from specjax.drafters import artifact, prompt_lookup, static_tree
from specjax.drafters.base import (
  Draft,
  DraftContext,
  DrafterBase,
  Forward,
  Prefill,
  Verdict,
  sampled_candidates,
  verify_forward,
)
from specjax.drafters.medusa.layouts import load, published
from specjax.drafters.medusa.model import (
  FIELD,
  SCHEMA,
  HeadsConfig,
  head_logits,
  init_heads,
  read_meta,
)
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.models import llama, schema, source
from specjax.models.config import ModelConfig
from specjax.trees import Tree


def parse_tree(c: ml_collections.ConfigDict, field: str = FIELD) -> Tree:
  """The tree of a config subsection: ``tree_paths`` (Medusa's path list) if given, else the
  full tree ``tree_spec`` (top-k per depth)."""
  try:
    if c.tree_paths:
      return Tree.from_paths([list(p) for p in c.tree_paths])
    return Tree.from_spec(tuple(c.tree_spec))
  except (TypeError, ValueError) as e:
    which = "tree_paths" if c.tree_paths else "tree_spec"
    raise ValueError(f"{field}.{which}: {e}") from None


def saved_tree(c: ml_collections.ConfigDict, meta: dict, field: str = FIELD) -> Tree | None:
  """The tree saved with the heads (task=medusa_tree), when ``saved_tree`` picks it; a
  ``tree_spec`` or ``tree_paths`` set beside it would not be what decodes: one error."""
  if not (c.saved_tree and meta.get("tree")):
    return None
  tree, defaults = Tree(tuple(meta["tree"])), Medusa.config()
  given = [f"{field}.{k}={tuple(c[k])}" for k in ("tree_spec", "tree_paths")
           if tuple(c[k]) != tuple(defaults[k])]  # fmt: skip
  if given:
    raise ValueError(
      f"{' and '.join(given)} would not decode: the heads at {field}.path={c.path!r} carry "
      f"their own tree ({tree.num_nodes} nodes), used while saved_tree = True; "
      f"set {field}.saved_tree=False to decode yours, or remove it to decode theirs."
    )
  return tree


@dataclasses.dataclass(frozen=True)
class Medusa(static_tree.OnStaticTree, DrafterBase):
  """Medusa heads drafting a static tree; params from ``load`` or ``init_heads`` plus
  ``vocab_ids`` (the draft vocabulary's target ids)."""

  heads: HeadsConfig
  tree: Tree
  # Children drawn from the heads (lossless via q) vs top-k picks; None: candidates "auto",
  # set per run (base.at_temperature).
  sampled: bool | None = False
  lookup: PromptLookup | None = None  # a chain of prompt-lookup guesses, the root's last child
  name: str = "medusa"
  feature_layers: tuple = ("final",)

  def __post_init__(self):
    if self.tree.num_nodes == 0:
      raise ValueError(f"{FIELD}: the Medusa tree needs at least one node.")
    if self.tree.max_depth > self.heads.num_heads:
      raise ValueError(
        f"{FIELD}: the tree is {self.tree.max_depth} deep but there are only "
        f"{self.heads.num_heads} heads (head k drafts depth k): use a shallower tree or "
        "train more heads."
      )
    if max(static_tree.ranks(self.tree)) + 1 > self.heads.vocab_size:
      raise ValueError(f"{FIELD}: a node has more siblings than the draft vocabulary has tokens.")
    prompt_lookup.check_branch(self.lookup, FIELD)

  @staticmethod
  def config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.path = ""  # heads saved by training (task=train, objective medusa) or a published Medusa
    # directory (FasterDecoding's medusa_lm_head.*, vLLM's Medusa); "" = untrained heads
    c.format = "auto"  # layout: auto | specjax | medusa | vllm_medusa (medusa/formats)
    c.num_heads = 4  # untrained heads (path = ""): how many; with a path, the saved heads' own
    c.tree_spec = (4, 2, 2, 1)  # top-k per depth (the full tree), unless tree_paths is given
    c.tree_paths = ()  # Medusa's path list, e.g. ((0,), (1,), (0, 0)); overrides tree_spec
    c.saved_tree = True  # with path: use the tree saved with the heads, if any
    c.candidates = "auto"  # auto (sampled iff temperature > 0) | top_k | sampled
    prompt_lookup.add_branch_fields(c)
    return c

  @classmethod
  def check(cls, c, config):
    sampled_candidates(c, FIELD)
    prompt_lookup.check_branch_fields(c, FIELD)
    tree = parse_tree(c)
    fmt = source.choice(c.get("format", "auto"), published().FORMATS, "drafter.medusa.format")
    if c.path and published().detect(c.path, fmt) != "specjax":
      found = published().peek(c.path, fmt)  # headers only: no tensor is read
      num_heads = found.heads.num_heads
      target = source.peek(config.target)
      if target is not None:
        published().check_sizes(found, target.cfg)
      published().check_names(found)
    elif c.path:
      meta = read_meta(c.path)
      num_heads = meta["heads"]["num_heads"]
      tree = saved_tree(c, meta) or tree
      target = source.peek(config.target)  # its header: a mismatch shows before weights load
      if target is not None:
        heads = meta["heads"]
        artifact.check_sizes(
          meta, heads["dim"], heads["target_vocab_size"], target.cfg, f"{FIELD}.path", "heads"
        )
    else:
      num_heads = c.num_heads
      if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(
          f"{FIELD}.num_heads must be an integer >= 1 (head k drafts depth k), got {num_heads!r}."
        )
    if c.path:
      artifact.check_random_only(c, cls.config(), {"num_heads": num_heads}, FIELD)
    if tree.max_depth > num_heads:
      raise ValueError(
        f"{FIELD}: the tree is {tree.max_depth} deep but the heads number {num_heads} (head k "
        "drafts depth k): use a shallower tree_spec/tree_paths or more heads."
      )
    if c.lookup:
      tree = tree.with_branch(c.lookup)
    tree.check_budget(config.drafter.max_depth, config.drafter.max_nodes)

  @classmethod
  def build(cls, c, config, target):
    sampled = sampled_candidates(c, FIELD)
    tree = parse_tree(c)
    if c.path:
      heads, params, meta = load(c.path, target, c.get("format", "auto"))
      tree = saved_tree(c, meta) or tree
    else:
      heads = HeadsConfig(target.cfg.dim, c.num_heads, target.cfg.vocab_size, target.cfg.vocab_size)
      vocab_ids = np.arange(target.cfg.vocab_size, dtype=np.int32)
      params = init_heads(heads, target.params, target.cfg, vocab_ids)
      params["vocab_ids"] = jnp.asarray(vocab_ids)
    d = cls(heads, tree, sampled, prompt_lookup.branch(c))
    d.check_target(target.cfg)
    return d, params

  def check_target(self, target_cfg: ModelConfig) -> None:
    if (self.heads.dim, self.heads.target_vocab_size) != (target_cfg.dim, target_cfg.vocab_size):
      raise ValueError(
        f"Medusa heads for hidden size {self.heads.dim} and vocabulary "
        f"{self.heads.target_vocab_size} cannot read target {target_cfg.name!r} (hidden size "
        f"{target_cfg.dim}, vocabulary {target_cfg.vocab_size}): train heads for this target."
      )

  def check_params(self, params) -> None:
    if not isinstance(params, dict) or "vocab_ids" not in params:
      raise ValueError("drafter_params for Medusa need the heads' tensors and vocab_ids.")
    try:
      heads = {k: v for k, v in params.items() if k != "vocab_ids"}
      schema.check_shapes(SCHEMA, self.heads, heads, 0)
    except ValueError as e:
      raise ValueError(f"drafter_params do not fit these Medusa heads: {e}") from None

  def init(self, params, prefill: Prefill):
    last = (prefill.lengths - 1)[:, None, None]
    return indexing.take_along(prefill.features, last, axis=1)[:, 0]

  def commit(self, state, verdict: Verdict, ctx):
    n = verdict.num_accepted[:, None, None]
    return indexing.take_along(verdict.features, n, axis=1)[:, 0]

  @property
  def verifies_tree(self) -> bool:
    return True

  def step_forwards(self):
    return (Forward("medusa", 1), verify_forward(self))

  def own_sizes(self, params):
    return {"medusa": (sum(int(np.size(v)) for k, v in params.items() if k != "vocab_ids"), 0)}

  @property
  def static_tree(self) -> Tree:
    return self.nodes

  def teacher_forced_drafts(self, target, params, x_1xS, roots_R, row_len):
    """Head d's rank-c candidate from the target's final feature at ``r - 1``; a lookup
    branch's guess at every root after the heads' nodes."""
    _, (f,) = llama.logits_of(target.params, target.cfg, x_1xS, (llama.FINAL,))
    heads = self.tree  # the heads' nodes (the lookup branch, if any, comes after them)
    head_N, rank_N = np.asarray(heads.depth[1:]) - 1, np.asarray(static_tree.ranks(heads))
    logits_RxHxW = head_logits(params, f[0][roots_R - 1])
    _, top = jax.lax.top_k(logits_RxHxW, int(rank_N.max()) + 1)
    tokens = params["vocab_ids"][top[:, head_N, rank_N]]
    return self.replayed(tokens, target, x_1xS, roots_R, row_len)

  def propose(self, params, state, ctx: DraftContext):
    return self._finish(self._heads_draft(params, state, ctx), ctx), state

  def _heads_draft(self, params, state, ctx: DraftContext) -> Draft:
    """Head d's logits fill depth d of the static tree (``static_tree.draft``)."""
    logits_BxHxW = head_logits(params, state)
    return static_tree.draft(self.tree, logits_BxHxW, self.sampled, ctx, params["vocab_ids"],
                             self.heads.target_vocab_size)  # fmt: skip


# --- Saving and loading: heads, their tree, and the target they belong to -----------------------
