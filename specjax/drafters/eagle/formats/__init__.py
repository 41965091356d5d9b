"""Published EAGLE drafters in, specjax drafters out: the SafeAILab, SpecForge and vLLM
``speculators`` checkpoint layouts of EAGLE-1/2 and EAGLE-3.

    fmt = detect(directory)                       # specjax | eagle | eagle3 | speculators
    cfg, params, meta = load(directory, target)   # decode params of eagle.model (architecture
                                                  # eagle1 or eagle3)
    export(cfg, params, out_dir, "speculators", "bfloat16")

Layouts (tensor names; ``L.`` is the layer prefix, F the hidden size, V' the draft vocabulary):

    layout        config.json                      layer prefix   tensors
    eagle         SafeAILab EAGLE-1/2 (``bias``,    layers.0.      fc.weight [F, 2F], fc.bias [F],
                  ``qkv_bias``)                                   L.self_attn.{q,k,v,o}_proj,
                                                                  L.post_attention_layernorm,
                                                                  L.mlp.{gate,up,down}_proj
    eagle3        SafeAILab / SpecForge EAGLE-3     midlayer.      fc.weight [F, 3F], norm.weight,
                  (``draft_vocab_size``)                          lm_head.weight [V', F], d2t, t2d,
                                                                  L.input_layernorm, L.hidden_norm,
                                                                  L.self_attn.* (q/k/v over 2F), ...
    speculators   ``speculators_model_type``        layers.0.      eagle3: as eagle3;
                  eagle3 (``transformer_layer_      transformer.   eagle: fusion_fc.{weight,bias},
                  config``, aux layer ids) or eagle                transformer.* (no input norm)

Weights are ``model.safetensors`` (or sharded with an index) or a torch-pickled
``pytorch_model.bin`` (read by ``specjax.models.torch_files``). A stored ``embed_tokens.weight``
must be the target's embedding (specjax drafters read the target's); ``d2t`` maps a draft id to
the target's (target id = draft id + d2t[draft id]) and ``t2d``, where stored, must agree.

Auxiliary layer ids: speculators/vLLM (``eagle_aux_hidden_state_layer_ids``) and SafeAILab's
default rule ``[2, L // 2, L - 3]`` name the hidden state fed *into* layer a (0: the
embeddings), specjax the residual stream after layer a - 1; SGLang/SpecForge's
``eagle_config.eagle_aux_hidden_state_layer_ids`` name the output of layer a, specjax's own
index. Features are concatenated in layer order.
"""

from specjax.drafters.eagle.formats.read import (
  DTYPES,
  EXPORTS,
  FIELD,
  FORMATS,
  NAMES,
  Plan,
  check_names,
  detect,
  expected_tensors,
  layout,
  load,
  plan,
)
from specjax.drafters.eagle.formats.write import WRITES, check_export, export

__all__ = [
  "DTYPES", "EXPORTS", "FIELD", "FORMATS", "NAMES", "Plan", "WRITES", "check_export", "check_names",
  "detect", "expected_tensors", "export", "layout", "load", "plan",
]  # fmt: skip
