"""P-EAGLE drafters (speculators 0.6+; ``peagle``): the published EAGLE-3 layer drafting K
tokens in one forward.

The layer is EAGLE-3's (``drafters/eagle/model.py``, architecture ``eagle3``): a pair (the
target's features of position i from several layers, fused by ``fc``; the token at i + 1) is
read as [input_norm(embed); hidden_norm(s)], its own head scores the draft vocabulary. EAGLE-3
drafts level by level, feeding its output back; P-EAGLE feeds, after the newest pair, K - 1
masked rows (the token ``mask_id`` and a trained feature vector ``mask_hidden`` in place of the
target's) and reads row d's distribution as the token d + 1 places after the newest, all in
one forward. Each row attends to the committed pairs (a per-row KV cache of the layer, as
EAGLE's: a pair's keys and values are its projections, written without running the layer) and
causally to the block's rows before it. None of the K distributions depends on the tokens
drafted above, so they fill a chain or a static tree of ranked or sampled candidates
(``static_tree.py``, as DFlash's and Medusa's), verified losslessly at any temperature, with an
optional lookup branch.

``model.py`` holds the config, the block forward, the anchored blocks of training and replay,
and specjax's save; ``objective.py`` the training (``config.objective.name = peagle``);
``formats.py`` speculators' ``peagle`` layout; ``layouts.py`` either layout; ``drafter.py``
the protocol.
"""

import dataclasses

from specjax.drafters import family, static_tree
from specjax.drafters.peagle import formats, model
from specjax.drafters.peagle.drafter import PEagle, PEagleState, parse_tree, time_block
from specjax.drafters.peagle.layouts import load
from specjax.drafters.peagle.model import FIELD, META_FILE, PEagleConfig
from specjax.drafters.peagle.objective import PEagleBlocks
from specjax.trees import Tree

__all__ = [
  "FAMILY", "FIELD", "PEagle", "PEagleBlocks", "PEagleConfig", "PEagleState", "load", "model",
  "parse_tree",
]  # fmt: skip


def _export(cfg, params, out_dir, fmt: str, dtype: str, verifier: str = ""):
  """``speculators_peagle``: vLLM speculators' layout (``formats.export``)."""
  del fmt  # the one layout
  return formats.export(cfg, params, out_dir, dtype, verifier)


def _check_export(directory, fmt: str, dtype: str, options: dict, field: str) -> None:
  """The saved drafter's ``peagle.json`` against speculators' layout and ``export.verifier``
  (which it needs), before anything loads."""
  from specjax.drafters.eagle import formats as eagle_formats
  from specjax.drafters.eagle import layouts as eagle_layouts

  cfg = PEagleConfig.fromdict(model.read_meta(directory, f"{field}.path")["peagle"])
  verifier = options.get("verifier", "")
  eagle_layouts.check_verifier(verifier, fmt, field)
  eagle_formats.check_export(cfg.eagle, "speculators", dtype, verifier)


def _check_params(drafter: PEagle, params) -> None:
  drafter.check_params(params)


def _positions(d) -> int:
  """The tokens a block drafts: the longest chain and the deepest tree it can verify."""
  return d.cfg.num_depths


FAMILY = family.register(
  family.Family(
    name="peagle",
    drafter=PEagle,
    placement=family.Placement(
      cache_model=lambda d: d.cfg.eagle.layer, check_params=_check_params
    ),  # fmt: skip
    price=family.Price(
      forwards=PEagle.step_forwards, timers={"peagle": time_block}, sizes=PEagle.own_sizes
    ),
    tune=static_tree.tune("peagle", _positions),
    replay=family.Replay(
      drafts=PEagle.teacher_forced_drafts,
      tree=lambda d: d.nodes,
      chain=lambda d, k: dataclasses.replace(d, tree=Tree.chain(k)),
      longest=_positions,
    ),
    objective=PEagleBlocks,
    saved=family.Saved(
      meta_file=META_FILE,
      load=load,
      export=_export,
      formats=formats.EXPORTS,
      writes=tuple(sorted(formats.WRITES)),
      check_export=_check_export,
      options=("verifier",),
    ),
  )
)
