"""Shape legend for specjax: the letters used in tensor names and signatures.

    B  batch rows                 T  new tokens in one forward
    S  cache slots (max length)   K  draft length (chain)
    N  tree nodes                 V  vocabulary
    D  model width                F  MLP width
    H  query heads                G  kv heads          Dh head dim
    L  layers

Locals carry their shape in the name, e.g. ``logits_BxTxV``.
"""

from typing import Any

import jax
from jaxtyping import Array, Bool, Float, Int

Params = dict[str, Any]
PRNGKey = jax.Array

__all__ = ["Array", "Bool", "Float", "Int", "PRNGKey", "Params"]
