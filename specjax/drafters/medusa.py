"""Medusa heads (Cai et al. 2024): H small heads on the target's final hidden state draft a tree.

The verify pass that accepted the newest token (the tree's root) also computed h, the target's
final normed hidden state whose logits gave that token (``Verdict.features`` at index n). Head
k (1..H) reads h and predicts the token k places after the root, the tree's depth-k nodes:

    x_k = h;  x_k <- x_k + SiLU(W_kr x_k + b_kr)  for each of R residual layers (W zero-init)
    logits_k = P_k x_k                              P_k: the target's head (shared, frozen) or
                                                    the head's own, initialised from it

With a *reduced draft vocabulary* the heads score only V' target ids (``vocab_ids``, the most
frequent tokens of the training data, stop tokens always in): P_k is V' x F, and a draft's q is
zero outside V', which the verifier handles like any other q (losslessness is untouched).

Candidates. Every node of a static ``Tree`` at depth d is the ``rank``-th child of its parent
and takes head d's ``rank``-th candidate. ``candidates = "top_k"``: each head's top-ranked
tokens, deterministic (``Draft.probs=None``, one-hot q), at any temperature. ``"sampled"``:
under every parent, its children are drawn without replacement from head d's distribution
q_d = ``sampling.probs(logits_d)`` (Gumbel-top-k, fresh noise per parent) and verified with q_d
by recursive rejection sampling, so the output is exactly the target's at any temperature,
top-k or top-p; at temperature 0 the draw is the top-k and the verifier is greedy. ``"auto"``
(the config default) samples iff the run's temperature is above 0.

A lookup branch (``lookup``: a ``PromptLookup`` chain of K tokens, as EAGLE's) adds the
continuation of the longest n-gram match in the committed text as the root's last child: the
copies of the prompt that heads reading one hidden state rarely predict. Its nodes are
deterministic (one-hot q), tried after the heads' own children, so sampled mode stays exact.

The drafter's state is h for every row: ``init`` takes the prompt's last feature, ``commit``
the verdict's (along the heads' tree or the lookup branch alike). Heads, their tree and the
target fingerprint they were trained against are saved together (``save`` / ``load``); loading
heads onto another target is an error. ``load`` also reads published heads in FasterDecoding's
or vLLM's layout (``specjax.interop.medusa``; ``format`` in the config section), which carry no
fingerprint: their sizes are checked against the target's.
"""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from specjax import sampling
from specjax.drafters import artifact, prompt_lookup
from specjax.drafters.artifact import target_head
from specjax.drafters.base import (
  Chain,
  Draft,
  DraftContext,
  Forward,
  Prefill,
  Verdict,
  sampled_candidates,
  verify_forward,
)
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.models import llama, schema, source
from specjax.models.config import ModelConfig
from specjax.models.schema import Param
from specjax.trees import Tree

FIELD = "config.drafter.medusa"
HEADS_FILE, META_FILE = "heads.safetensors", "medusa.json"
FORMAT = 1


@dataclasses.dataclass(frozen=True)
class HeadsConfig:
  """Shapes of a set of Medusa heads (static; hashable)."""

  dim: int  # F: the target's hidden size
  num_heads: int  # H
  vocab_size: int  # V': the draft vocabulary (== the target's unless reduced)
  target_vocab_size: int  # V
  num_layers: int = 1  # R: residual layers per head
  own_proj: bool = False  # False: every head uses the target's (frozen) head

  def __post_init__(self):
    for f in ("dim", "num_heads", "vocab_size", "target_vocab_size", "num_layers"):
      if int(getattr(self, f)) != getattr(self, f) or getattr(self, f) < 1:
        raise ValueError(f"Medusa heads: {f} must be an integer >= 1, got {getattr(self, f)}.")
    if self.vocab_size > self.target_vocab_size:
      raise ValueError(
        f"Medusa heads: the draft vocabulary ({self.vocab_size}) cannot exceed the target's "
        f"({self.target_vocab_size})."
      )

  @property
  def reduced(self) -> bool:
    return self.vocab_size < self.target_vocab_size

  @property
  def name(self) -> str:  # what schema.check_shapes calls these sizes in its errors
    return "Medusa heads"


_proj_shape = lambda c: (c.num_heads if c.own_proj else 1, c.vocab_size, c.dim)  # noqa: E731

# What the heads decode with. ``proj`` is trained only when ``own_proj``; otherwise it is the
# target's head (its ``vocab_ids`` rows), shared by every head and never trained.
SCHEMA: schema.Schema = (
  Param("res_w", lambda c: (c.num_heads, c.num_layers, c.dim, c.dim), "zeros"),
  Param("res_b", lambda c: (c.num_heads, c.num_layers, c.dim), "zeros"),
  Param("proj", _proj_shape, "head"),
)
TRAINED = {False: ("res_w", "res_b"), True: ("res_w", "res_b", "proj")}


def init_heads(cfg: HeadsConfig, target_params, target_cfg: ModelConfig, vocab_ids) -> dict:
  """Fresh heads: identity residual layers (W = 0, b = 0) and the target's head rows
  ``vocab_ids`` as every head's projection, so an untrained head k predicts the next token."""
  head = target_head(target_params, target_cfg)[jnp.asarray(vocab_ids)]
  params = schema.init_params(SCHEMA, cfg, jax.random.key(0), num_layers=0)
  params["proj"] = jnp.broadcast_to(head[None], _proj_shape(cfg)).astype(jnp.float32)
  return params


def random_heads(cfg: HeadsConfig, key: jax.Array, scale: float = 1.0) -> dict:
  """Random heads (unit tests): residual weights ~ N(0, scale / F), random projection."""
  k1, k2, k3 = jax.random.split(key, 3)
  shape_w = (cfg.num_heads, cfg.num_layers, cfg.dim, cfg.dim)
  return {
    "res_w": scale * jax.random.normal(k1, shape_w) / np.sqrt(cfg.dim),
    "res_b": 0.1 * jax.random.normal(k2, shape_w[:3]),
    "proj": jax.random.normal(k3, _proj_shape(cfg)) / np.sqrt(cfg.dim),
  }


def head_logits(params: dict, h_xF: jax.Array) -> jax.Array:
  """``[..., H, V']`` every head's logits from hidden states ``h[..., F]``."""
  h = params["res_w"].shape[0]
  x_xHF = jnp.broadcast_to(h_xF[..., None, :], h_xF.shape[:-1] + (h, h_xF.shape[-1]))
  for r in range(params["res_w"].shape[1]):
    y = jnp.einsum("...hf,hgf->...hg", x_xHF, params["res_w"][:, r]) + params["res_b"][:, r]
    x_xHF = x_xHF + jax.nn.silu(y)
  proj_HxVxF = params["proj"]
  if proj_HxVxF.shape[0] == 1:  # one head projection shared by every head
    return jnp.einsum("...hf,vf->...hv", x_xHF, proj_HxVxF[0])
  return jnp.einsum("...hf,hvf->...hv", x_xHF, proj_HxVxF)


def _ranks(tree: Tree) -> tuple[int, ...]:
  """Each node's index among its parent's children (nodes 1..N)."""
  seen: dict[int, int] = {}
  ranks = []
  for p in tree.parents:
    ranks.append(seen.get(p, 0))
    seen[p] = ranks[-1] + 1
  return tuple(ranks)


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


@dataclasses.dataclass(frozen=True)
class Medusa(Chain):
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
    if max(_ranks(self.tree)) + 1 > self.heads.vocab_size:
      raise ValueError(f"{FIELD}: a node has more siblings than the draft vocabulary has tokens.")
    prompt_lookup.check_branch(self.lookup, FIELD)

  @property
  def nodes(self) -> Tree:
    """The tree verified each step: the heads' tree, then the lookup branch if there is one."""
    return self.tree if self.lookup is None else self.tree.with_branch(self.lookup.num_draft)

  @property
  def num_draft(self) -> int:
    return self.nodes.max_depth

  @property
  def num_nodes(self) -> int:
    return self.nodes.num_nodes

  @staticmethod
  def config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.path = ""  # heads saved by training (task=train, objective medusa) or a published Medusa
    # directory (FasterDecoding's medusa_lm_head.*, vLLM's Medusa); "" = untrained heads
    c.format = "auto"  # path's layout: auto | specjax | medusa | vllm_medusa (interop/medusa.py)
    c.num_heads = 4  # untrained heads only (path = ""): how many
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
    fmt = source.choice(c.get("format", "auto"), _layouts().FORMATS, "drafter.medusa.format")
    if c.path and _layouts().detect(c.path, fmt) != "specjax":
      found = _layouts().peek(c.path, fmt)  # headers only: no tensor is read
      num_heads = found.heads.num_heads
      target = source.peek(config.target)
      if target is not None:
        _layouts().check_sizes(found, target.cfg)
      _layouts().check_names(found)
    elif c.path:
      meta = read_meta(c.path)
      num_heads = meta["heads"]["num_heads"]
      if c.saved_tree and meta.get("tree"):
        tree = Tree(tuple(meta["tree"]))
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
      if c.saved_tree and meta.get("tree"):
        tree = Tree(tuple(meta["tree"]))
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

  def draft_calls_per_step(self) -> int:
    return 1

  def init(self, params, prefill: Prefill):
    last = (prefill.lengths - 1)[:, None, None]
    return jnp.take_along_axis(prefill.features, last, axis=1)[:, 0]

  def commit(self, state, verdict: Verdict, ctx):
    n = verdict.num_accepted[:, None, None]
    return jnp.take_along_axis(verdict.features, n, axis=1)[:, 0]

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

  sweeps_chain_length = False  # its chain is its heads: one per depth

  def teacher_forced_drafts(self, target, params, x_1xS, roots_R, row_len):
    """Head d's rank-c candidate from the target's final feature at ``r - 1``; a lookup
    branch's guess at every root after the heads' nodes."""
    _, (f,) = llama.logits_of(target.params, target.cfg, x_1xS, (llama.FINAL,))
    heads = self.tree  # the heads' nodes (the lookup branch, if any, comes after them)
    head_N, rank_N = np.asarray(heads.depth[1:]) - 1, np.asarray(_ranks(heads))
    logits_RxHxW = head_logits(params, f[0][roots_R - 1])
    _, top = jax.lax.top_k(logits_RxHxW, int(rank_N.max()) + 1)
    tokens = params["vocab_ids"][top[:, head_N, rank_N]]
    if self.lookup is not None:
      guess, _, _ = self.lookup.teacher_forced_drafts(target, None, x_1xS, roots_R, row_len)
      tokens = jnp.concatenate([tokens, guess], axis=1)
    return tokens, None, jnp.zeros(roots_R.shape, bool)

  def propose(self, params, state, ctx: DraftContext):
    draft = self._heads_draft(params, state, ctx)
    if self.lookup is not None:
      draft = self._with_lookup(draft, ctx)
    return draft, state

  def _with_lookup(self, draft: Draft, ctx: DraftContext) -> Draft:
    """The lookup chain after the heads' nodes (node ids ``tree.num_nodes + 1 ..``)."""
    return prompt_lookup.with_branch(draft, self.lookup, ctx)

  def _heads_draft(self, params, state, ctx: DraftContext) -> Draft:
    logits_BxHxW = head_logits(params, state)
    depth_N = np.asarray(self.tree.depth[1:]) - 1  # the head of every node
    rank_N = np.asarray(_ranks(self.tree))
    width = int(rank_N.max()) + 1
    vocab_ids = params["vocab_ids"]
    if not self.sampled:
      _, top_BxHxC = jax.lax.top_k(logits_BxHxW, width)
      tokens_BxN = vocab_ids[top_BxHxC[:, depth_N, rank_N]]
      return Draft(tokens=tokens_BxN, parents=self._parents(state))
    # Gumbel-top-k under every parent: its children are a draw without replacement from q_d.
    q_BxHxW = sampling.probs(logits_BxHxW, ctx.sampling)
    parents = np.asarray(self.tree.parents)
    inner = sorted(set(parents.tolist()))  # nodes with children
    row_of = {p: i for i, p in enumerate(inner)}
    head_I = np.asarray(self.tree.depth)[inner]  # children of a depth-d node come from head d
    gumbel_BxIxW = jax.random.gumbel(ctx.key, (state.shape[0], len(inner), q_BxHxW.shape[-1]))
    greedy = ctx.sampling.temperature <= 0
    scores_BxIxW = jnp.where(
      greedy, logits_BxHxW[:, head_I], jnp.log(q_BxHxW[:, head_I]) + gumbel_BxIxW
    )
    _, top_BxIxC = jax.lax.top_k(scores_BxIxW, width)
    parent_row_N = np.asarray([row_of[p] for p in parents])
    tokens_BxN = vocab_ids[top_BxIxC[:, parent_row_N, rank_N]]
    q_BxNxW = q_BxHxW[:, depth_N]
    if self.heads.reduced:  # q is zero outside the draft vocabulary
      q_BxNxV = jnp.zeros(tokens_BxN.shape + (self.heads.target_vocab_size,), q_BxNxW.dtype)
      q_BxNxW = q_BxNxV.at[:, :, vocab_ids].set(q_BxNxW)
    return Draft(tokens=tokens_BxN, probs=q_BxNxW, parents=self._parents(state))

  def _parents(self, state) -> jax.Array:
    parents_N = jnp.asarray(self.tree.parents, jnp.int32)
    return jnp.broadcast_to(parents_N, (state.shape[0], self.tree.num_nodes))


# --- Saving and loading: heads, their tree, and the target they belong to -----------------------

fingerprint = artifact.fingerprint
check_vocab = artifact.check_vocab


def save(directory, heads: HeadsConfig, params: dict, target, tree: Tree | None, extra=None):
  """Writes ``heads.safetensors`` (the trained tensors and ``vocab_ids``; a shared projection is
  the target's and is not saved) and ``medusa.json`` into ``directory``, atomically."""
  keep = TRAINED[heads.own_proj] + ("vocab_ids",)
  meta = {
    "format": FORMAT,
    "heads": dataclasses.asdict(heads),
    "target": artifact.target_meta(target),
    "tree": list(tree.parents) if tree is not None else None,
  } | (extra or {})
  return artifact.save(directory, {k: params[k] for k in keep}, HEADS_FILE, meta, META_FILE)


def read_meta(directory, field: str = f"{FIELD}.path") -> dict:
  hint = "point it at a directory written by task=train with objective.name=medusa (draft_final)"
  return artifact.read_meta(directory, META_FILE, FORMAT, field, hint, HEADS_FILE)


def read_tensors(directory) -> dict[str, np.ndarray]:
  return artifact.read_tensors(directory, HEADS_FILE)


def _layouts():
  """``specjax.interop.medusa``: the other projects' layouts. It maps their files onto this
  module's ``HeadsConfig``, so it sits above drafters/ and is imported when first needed."""
  from specjax.interop import medusa as layouts

  return layouts


def load(directory, target, fmt: str = "auto") -> tuple[HeadsConfig, dict, dict]:
  """``(heads, decode params, meta)`` from heads saved by specjax (``load_saved``) or in
  another project's layout (``fmt``: auto | specjax | medusa | vllm_medusa; see
  ``specjax.interop.medusa``). Foreign heads carry no target fingerprint: their sizes are
  checked against the target's."""
  return _layouts().load(directory, target, fmt)


def load_saved(directory, target) -> tuple[HeadsConfig, dict, dict]:
  """``(heads, decode params, meta)`` saved by specjax; a clear error if they were trained for
  another target or their vocabulary cannot emit the target's stop tokens."""
  meta = read_meta(directory)
  heads = HeadsConfig(**meta["heads"])
  field = f"{FIELD}.path={str(directory)!r}"
  artifact.check_target(meta, heads.dim, heads.target_vocab_size, target, field, "heads")
  tensors = read_tensors(directory)
  vocab_ids = tensors["vocab_ids"].astype(np.int32)
  check_vocab(vocab_ids, target, field)
  params = {k: jnp.asarray(v) for k, v in tensors.items()}
  if not heads.own_proj:
    params["proj"] = target_head(target.params, target.cfg)[jnp.asarray(vocab_ids)][None]
  schema.check_shapes(SCHEMA, heads, {k: v for k, v in params.items() if k != "vocab_ids"}, 0)
  return heads, params, meta
