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

from specjax.drafters.eagle.drafter import Eagle, EagleState
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
from specjax.drafters.eagle.tree import Expanded, Pool, check_shape, pool_size

__all__ = [
  "ARCHITECTURES", "FIELD", "FORMAT", "INPUTS", "META_FILE", "TRAINED_BY", "WEIGHTS_FILE",
  "Eagle", "EagleConfig", "EagleState", "Expanded", "Pool", "check_shape", "frozen_params",
  "fuse", "init_params", "inputs", "layer", "load", "load_saved", "logits", "param_shapes",
  "pool_size", "read_meta", "read_trained", "rollout_layer", "save", "widen",
]  # fmt: skip
