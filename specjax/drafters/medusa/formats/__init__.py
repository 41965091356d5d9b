"""Medusa heads in other projects' layouts, read into specjax's heads and written from them.

Head k (k < H) with R residual layers over hidden size F and a V-token vocabulary:

    layout       files                                  tensors
    specjax      medusa.json, heads.safetensors         res_w [H, R, F, F], res_b [H, R, F],
                                                        proj [1 or H, V', F], vocab_ids [V']
    medusa       config.json (medusa_num_heads,         {k}.{j}.linear.weight [F, F]  (j < R)
                 medusa_num_layers, ...),               {k}.{j}.linear.bias [F]
                 medusa_lm_head.safetensors or .pt      {k}.{R}.weight [V, F]
    vllm_medusa  config.json (hidden_size, vocab_size,  blocks.{k}.layers.{j}.weight [F, F]
                 num_heads, num_hidden_layers,          blocks.{k}.layers.{j}.bias [F]
                 truncated_vocab_size, medusa_fc_bias), (only with medusa_fc_bias: true)
                 *.safetensors (else *.bin, *.pt)       lm_heads.{k}.weight [V', F]
                                                        token_map [V'] (V' < V only)

All three compute x <- x + SiLU(W x + b) R times from the target's final normed hidden state,
then logits = P x. ``medusa`` is FasterDecoding's (``MedusaModel.medusa_head`` saved as a state
dict): its heads repeat one residual block R times (``[ResBlock] * medusa_num_layers`` shares
the weights), and the head and layer counts are read from the tensor names, since published
configs under-report them. ``vllm_medusa`` is vLLM's Medusa drafter: biases load only when the
config says ``medusa_fc_bias``, a ``token_map`` (the draft vocabulary's target ids) only when
``truncated_vocab_size < vocab_size``, ``lm_heads`` rows may then be the whole vocabulary (the
token_map's rows are taken), names may carry a ``medusa_heads.`` prefix, ``original_lm_head``
shares one ``lm_head``, and ``logit_scale`` multiplies the logits (folded into the projection
here). Foreign heads carry no target fingerprint: only their sizes are checked.

``load`` maps any layout onto ``HeadsConfig`` and decode params (own projection per head,
``vocab_ids`` from the token_map or every id); ``export`` writes specjax heads in the ``medusa``
or ``vllm_medusa`` layout. From the shell::

    python -m specjax.drafters.medusa.formats SRC OUT --format=vllm_medusa [--dtype=bfloat16]
"""

from specjax.drafters.medusa.formats.cli import main
from specjax.drafters.medusa.formats.read import (
  CONFIG,
  DTYPES,
  EXPORTS,
  FIELD,
  FORMATS,
  LAYOUTS,
  Found,
  check_names,
  check_sizes,
  detect,
  expected,
  load,
  peek,
  read,
)
from specjax.drafters.medusa.formats.write import WRITES, export

__all__ = [
  "CONFIG", "DTYPES", "EXPORTS", "FIELD", "FORMATS", "LAYOUTS", "WRITES", "Found", "check_names",
  "check_sizes", "detect", "expected", "export", "load", "main", "peek", "read",
]  # fmt: skip
