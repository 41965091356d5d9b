"""DFlash block drafters (z-lab 2026; speculators' ``dflash``): a few draft layers conditioned
on the target's fused features draft a whole block in one forward.

The context is the target's features of the committed positions, from several layers
(``feature_layers``), concatenated, fused by ``fc`` to F and normed: each draft layer's keys
and values of the context are its k/v projections of that (no input norm). A step feeds one
block, the newest token (the anchor, position L) then ``mask_id`` at positions L + 1 .. L + B
- 1, embedded by the target's embedding; every block position attends to the context slots
below L and to the whole block (non-causally), through every draft layer; the final norm and
the target's head give a distribution for each position after the anchor, the token at
L + d for depth d. None depends on the tokens drafted above it, so the B - 1 distributions
fill a chain (each depth's top or sampled token) or a static tree of ranked candidates
(``static_tree.py``, as Medusa's heads do), verified by the chain or tree verifier: lossless
at any temperature, the q of a sampled node being its depth's distribution under the run's
temperature, top-k and top-p. A lookup branch may follow the tree, as for Medusa and EAGLE.

DSpark (speculators' ``dspark``) is this with options of ``DFlashConfig``: the anchor's own
position drafting too (``sample_from_anchor``), a low-rank Markov logit bias from the token
before each position (``markov_rank``, ``markov_head``: a node's children then draw from a q
that depends on the node's token, drawn level by level and verified with that q), and a
confidence head predicting each position's acceptance probability (trained; not read in
decoding).

The context is a per-row KV cache of the draft layers beside the target's: the prompt's
features at ``init``; each verdict's features (the root's and the accepted nodes') join it as
the next block begins (its one forward writes them, then reads).

``model.py`` holds the weights, the block forward, the anchored-block forward of replay, and
specjax's save; ``objective.py`` training on anchored blocks (``config.objective.name =
dflash``); ``formats.py`` speculators' ``dflash`` layout; ``layouts.py`` either layout or random
weights; ``drafter.py`` the protocol.
"""

import dataclasses

from specjax.drafters import family, static_tree
from specjax.drafters.dflash import formats, model
from specjax.drafters.dflash.drafter import DFlash, DFlashState, parse_tree, time_block
from specjax.drafters.dflash.layouts import load
from specjax.drafters.dflash.model import FIELD, META_FILE, DFlashConfig
from specjax.drafters.dflash.objective import DFlashBlocks
from specjax.trees import Tree

__all__ = [
  "FAMILY", "FIELD", "DFlash", "DFlashBlocks", "DFlashConfig", "DFlashState", "load", "model",
  "parse_tree",
]  # fmt: skip


def _export(cfg, params, out_dir, fmt: str, dtype: str, verifier: str = ""):
  """``speculators_dflash``: vLLM speculators' layout (``formats.export``)."""
  del fmt  # the one layout
  return formats.export(cfg, params, out_dir, dtype, verifier)


def _check_params(drafter: DFlash, params) -> None:
  drafter.check_params(params)


def _positions(d) -> int:
  """The tokens a block drafts: the longest chain and the deepest tree it can verify."""
  return d.cfg.num_draft


FAMILY = family.register(
  family.Family(
    name="dflash",
    drafter=DFlash,
    placement=family.Placement(cache_model=lambda d: d.cfg.layer, check_params=_check_params),
    price=family.Price(
      forwards=DFlash.step_forwards, timers={"dflash": time_block}, sizes=DFlash.own_sizes
    ),
    tune=static_tree.tune("dflash", _positions),
    replay=family.Replay(
      drafts=DFlash.teacher_forced_drafts,
      tree=lambda d: d.nodes,
      chain=lambda d, k: dataclasses.replace(d, tree=Tree.chain(k)),
      longest=_positions,
    ),
    objective=DFlashBlocks,
    saved=family.Saved(
      meta_file=META_FILE,
      load=load,
      export=_export,
      formats=("speculators_dflash",),
      writes=formats.WRITES,
      options=("verifier",),
    ),
  )
)
