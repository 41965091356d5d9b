"""Shape legend for specjax: the letters used in tensor names and signatures.

    B  batch rows                      T  tokens in one forward
    S  cache slots (max length)        P  prompt length (padded)
    K  draft length (a chain)          D  draft depth (a tree's longest path)
    N  draft nodes (N1 = N + 1, with the root)
    E  extra tokens fed beside a draft (Lookahead's)
    V  the target's vocabulary         W  a drafter's vocabulary (its head's rows)
    F  feature width: the target hidden states a drafter reads
    H  heads: query heads in a layer, Medusa's heads in a drafter
    G  kv heads    R  query heads per kv head    Dh  head dim
    O, I  a matrix's output and input sizes

In ``models/llama.py`` (and a model forward's locals), D is the model width (the residual
stream). Locals carry their shape in the name, e.g. ``logits_BxTxV``; ``x_B`` is per row.
"""

from typing import Any

import jax
from jaxtyping import Array, Bool, Float, Int

Params = dict[str, Any]
PRNGKey = jax.Array

__all__ = ["Array", "Bool", "Float", "Int", "PRNGKey", "Params"]
