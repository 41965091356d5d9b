"""specjax: lossless speculative decoding in JAX.

from specjax.decode import generate, next_token_probs
from specjax.drafters import DraftModel, PromptLookup, Lookahead
from specjax.models import registry, tiny
"""

__version__ = "0.1.0"
