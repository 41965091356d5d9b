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
or vLLM's layout (``formats``; ``format`` in the config section), which carry no fingerprint:
their sizes are checked against the target's.
"""

from specjax.drafters import family
from specjax.drafters.medusa import layouts
from specjax.drafters.medusa.drafter import Medusa, parse_tree
from specjax.drafters.medusa.formats import EXPORTS, WRITES
from specjax.drafters.medusa.layouts import load
from specjax.drafters.medusa.model import (
  FIELD,
  FORMAT,
  HEADS_FILE,
  META_FILE,
  SCHEMA,
  TRAINED,
  HeadsConfig,
  check_vocab,
  fingerprint,
  head_logits,
  init_heads,
  load_saved,
  random_heads,
  read_meta,
  read_tensors,
  save,
  target_head,
)
from specjax.drafters.medusa.objective import MedusaHeads

__all__ = [
  "FAMILY",
  "FIELD", "FORMAT", "HEADS_FILE", "META_FILE", "SCHEMA", "TRAINED", "HeadsConfig", "Medusa",
  "check_vocab", "fingerprint", "head_logits", "init_heads", "load", "load_saved", "parse_tree",
  "random_heads", "read_meta", "read_tensors", "save", "target_head",
]  # fmt: skip


FAMILY = family.register(
  family.Family(
    name="medusa",
    drafter=Medusa,
    placement=family.Placement(check_params=Medusa.check_params),
    price=family.Price(
      forwards=Medusa.step_forwards, timers={"medusa": family.time_propose}, sizes=Medusa.own_sizes
    ),
    replay=family.Replay(
      drafts=Medusa.teacher_forced_drafts,
      tree=lambda d: d.static_tree,
      chain=None,  # its chain is its heads: one per depth
    ),
    objective=MedusaHeads,
    saved=family.Saved(
      meta_file=META_FILE,
      load=load,
      export=layouts.export,
      formats=EXPORTS,
      writes=tuple(sorted(WRITES)),
      check_export=layouts.check_export,
    ),
  )
)
