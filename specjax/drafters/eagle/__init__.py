"""EAGLE feature drafters (Li et al. 2024): one decoder layer drafts at the target's feature level.

The target's feature at position i, f_i, is what its head turns into the distribution of token
i + 1. The drafter reads the pair (s_i, t_{i+1}), s_i = ``fuse(f_i)``, and predicts the next
state:

    x_i   = fc([embed(t_{i+1}); s_i]) + b      embed: the target's (frozen)
    out_i = norm(block(x_i))                    block: ``llama.block`` with the target's shapes,
                                                its own weights and its own one-layer KV cache
    q     = softmax(head(out_i))                head: the target's (frozen), over the draft
                                                vocabulary V' (all of it unless reduced)

and feeds ``out_i`` back as s_{i+1} to draft further. EAGLE-1 reads the final normed state
(``feature_layers = ("final",)``, ``fuse`` the identity) and is trained so out_i matches f_{i+1}.
EAGLE-3 reads three layers' residual streams, ``fuse`` is a trained linear map from 3F to F, and
only the token loss trains it (with a simulated multi-step rollout, ``objective.py``).

Each step (EAGLE-2's dynamic tree under static shapes, budget ``(top_k, depth, total)``):

1. catch up: the pairs of the tokens committed since the last step, whose features the verify
   pass handed to ``commit`` (``Verdict.features``), run through the layer in one forward that
   writes them into the draft cache (rolled back by the target's lengths, like the target's);
   the last one's output drafts depth 1;
2. expand, depth by depth: the ``top_k`` best nodes so far at the deepest level (by cumulative
   draft log-probability) run through the layer in one read-only forward that attends to the
   committed pairs and to their expanded ancestors, whose keys and values the earlier levels
   kept (each level's forward is ``top_k`` rows, however deep); each offers ``top_k``
   children;
3. rerank: the ``total`` best of all offered nodes form the tree (parents before children), as
   data (``Draft.parents``) for the tree verifier.

Candidates. ``top_k`` mode: each node's top-k tokens, deterministic (``Draft.probs=None``), a
child's score its draft log-probability: exactly EAGLE-2, lossless at any temperature (one-hot
verification). ``sampled`` mode: a node's children are drawn without replacement from its q
(Gumbel-top-k, fresh noise per node) and verified with q by recursive rejection sampling. For
that to stay exact, whether a child is kept must not depend on which token it drew (keeping
children by their own q biases them towards q's mode, and the exact-distribution test fails:
``testing.rerank_by_own_q``): the rank-r child scores with q's r-th largest probability, which
the parent alone decides, so each node keeps a prefix of its draws. At temperature 0 both modes
are EAGLE-2's greedy tree.

A lookup branch (``lookup``: a ``PromptLookup`` chain of K tokens, ``drafter.eagle.lookup``)
adds the continuation of the longest n-gram match in the committed text as one more child of
the root, after every EAGLE node: the tokens a reply copies from its prompt, which one layer
trained on replies rarely predicts (``experiments/eagle_smollm2/hit_rates.py``). Its nodes are
deterministic proposals (q one-hot). Being last among the root's children keeps sampled mode
exact: the siblings drawn without replacement are all tried before it, and if one of them
already proposed its token, its renormalised q is zero and it is skipped.
"""

import dataclasses

from jax.sharding import PartitionSpec as P

from specjax.drafters import curves, family
from specjax.drafters.eagle import layouts, price
from specjax.drafters.eagle.drafter import Eagle, EagleState
from specjax.drafters.eagle.formats import EXPORTS, WRITES
from specjax.drafters.eagle.layouts import load
from specjax.drafters.eagle.model import (
  ARCHITECTURES,
  FIELD,
  FORMAT,
  INPUTS,
  META_FILE,
  TRAINED_BY,
  WEIGHTS_FILE,
  EagleConfig,
  frozen_params,
  fuse,
  init_params,
  inputs,
  layer,
  load_saved,
  logits,
  param_shapes,
  read_meta,
  read_trained,
  rollout_layer,
  save,
  widen,
)
from specjax.drafters.eagle.objective import EagleFeatures
from specjax.drafters.eagle.tree import Expanded, Pool, check_shape, pool_size
from specjax.models import llama

__all__ = [
  "FAMILY", "SWEPT_BUDGETS", "ARCHITECTURES", "FIELD", "FORMAT", "INPUTS", "META_FILE",
  "TRAINED_BY", "WEIGHTS_FILE",
  "Eagle", "EagleConfig", "EagleState", "Expanded", "Pool", "check_shape", "frozen_params",
  "fuse", "init_params", "inputs", "layer", "load", "load_saved", "logits", "param_shapes",
  "pool_size", "read_meta", "read_trained", "rollout_layer", "save", "widen",
]  # fmt: skip


# On a decoding mesh: the layer and embedding like the target's, the head by rows.
EAGLE_RULES = (*llama.RULES, (r"(^|/)proj$", P("tensor", None)))


# The tree budgets (top_k, depth, total) task=cost_model replays by default: chains, then trees.
SWEPT_BUDGETS = ((1, 2, 2), (1, 3, 3), (1, 4, 4), (1, 6, 6), (2, 3, 4), (2, 3, 6), (2, 4, 6),
                 (2, 5, 8), (3, 4, 8), (3, 5, 12), (4, 4, 12), (4, 6, 16), (4, 6, 24))  # fmt: skip


def _sweep(drafter, dparams, cm, replay):
  """The drafter's weights replayed at every budget of ``cost_model.eagle_budgets``."""
  out = []
  for top_k, depth, total in (tuple(b) for b in cm.get("eagle_budgets", SWEPT_BUDGETS)):
    d = dataclasses.replace(drafter, top_k=top_k, depth=depth, total=total)
    out.append({"top_k": top_k, "depth": depth, "total": total, "tau": replay(d, dparams).tau})
  return drafter, out


def _budgets(config, target_name: str) -> list[dict]:
  """The tree budgets ``(top_k, depth, total)`` with their greedy τ in ``auto_from`` for this
  drafter, within ``config.drafter.max_depth`` and ``max_nodes``."""
  c = config.drafter.eagle
  grid = curves.eagle_grid(c.auto_from, target_name, c.path)
  return curves.within_budget(grid, config, "eagle", "tree budget of its eagle_grid", "total")


FAMILY = family.register(
  family.Family(
    name="eagle",
    drafter=Eagle,
    placement=family.Placement(
      partition_rules=lambda d: EAGLE_RULES,
      cache_model=lambda d: d.cfg.layer,
      check_params=Eagle.check_params,
    ),
    price=family.Price(
      forwards=Eagle.step_forwards,
      timers={"eagle": price.catch_up_seconds, "eagle_level": price.level_seconds},
      sizes=Eagle.own_sizes,
    ),
    tune=family.Tune(
      field="total",
      grid=_budgets,
      label=lambda g: f"{g['top_k']}x{g['depth']} with {g['total']} nodes",
      prefer=lambda g: (-g["total"], -g["depth"]),
      group=lambda d: d.top_k,  # its level forward reads top_k rows: timed per top_k
      sweep=family.Sweep(key="eagle_grid", run=_sweep, tag=lambda c: {"path": c.path}),
    ),
    replay=family.Replay(
      drafts=Eagle.teacher_forced_drafts,
      tree=lambda d: d.static_tree,
      chain=Eagle.with_chain_length,
    ),
    objective=EagleFeatures,
    saved=family.Saved(
      meta_file=META_FILE,
      load=load,
      export=layouts.export,
      formats=EXPORTS,
      writes=tuple(sorted(WRITES)),
      check_export=layouts.check_export,
      options=("verifier",),
    ),
  )
)
