"""Writing specjax drafters in the published EAGLE layouts (SafeAILab ``eagle``, SafeAILab/SGLang
``eagle3``, vLLM ``speculators``) with the config.json their readers build from."""

import json
from pathlib import Path

import jax
import numpy as np

from specjax.drafters import artifact
from specjax.drafters.eagle.formats.read import (
  DTYPES,
  EXPORTS,
  SPECULATORS_VERSION,
  expected_tensors,
)
from specjax.models import torch_files

# --- export ------------------------------------------------------------------------------------

# what an export may replace: the weights' two file names (``eagle``: pytorch_model.bin) and the
# config
WRITES = frozenset({"model.safetensors", "pytorch_model.bin", "config.json"})
# The engines read the layer's weights and the embedding it embeds tokens with from the drafter's
# own files (eagle-llm's strict load, SGLang, speculators): it is written, the target's.
_EMBED = "embed_tokens.weight"


def export(
  cfg, params, out_dir, fmt: str, dtype: str = "bfloat16", verifier: str = "", extra=None
) -> Path:
  """Writes a drafter in a published layout (``fmt``: eagle | eagle3 | speculators) with the
  config.json that SafeAILab's code, vLLM and SGLang read, into ``out_dir`` atomically
  (a temporary directory renamed into place). Weights in ``dtype``, the target's embedding
  among them; ``eagle`` as ``pytorch_model.bin`` (the one file eagle-llm reads), the others as
  ``model.safetensors``. ``verifier``: the target as speculators' loader should find it (an HF
  id or a local directory), recorded in the ``speculators`` config, which needs one.
  ``extra``: ``(tensors, config fields)`` a layout built on this one adds (P-EAGLE's)."""
  check_export(cfg, fmt, dtype, verifier)
  arch = cfg.architecture
  host = jax.device_get(params)
  kind = "eagle3" if arch == "eagle3" else "eagle"
  prefix = {"eagle": "layers.0.", "eagle3": "midlayer.", "speculators": "layers.0."}[fmt]
  fc_bias = arch == "eagle1" and bool(np.any(np.asarray(host["fc_b"]) != 0))
  tensors = {_EMBED: np.asarray(host["embed"], np.float32).astype(DTYPES[dtype])}
  for ckpt, (name, shape) in expected_tensors(cfg, prefix, fc_bias).items():
    if name == "vocab_ids":
      continue
    head, _, tail = name.partition(".")
    value = np.asarray(host[head][tail] if tail else host[head], np.float32)
    if value.shape != tuple(shape):
      raise ValueError(f"export: params[{name!r}] is {list(value.shape)}, expected {list(shape)}.")
    tensors[ckpt] = value.astype(DTYPES[dtype])
  ids = np.asarray(host["vocab_ids"], np.int64)
  full = np.array_equal(ids, np.arange(cfg.target.vocab_size))
  if arch == "eagle3" and (fmt == "eagle3" or not full):  # SGLang's layout always holds both
    tensors["d2t"] = ids - np.arange(len(ids), dtype=np.int64)
    t2d = np.zeros((cfg.target.vocab_size,), bool)
    t2d[ids] = True
    tensors["t2d"] = t2d
  config = _export_config(cfg, fmt, kind, dtype, fc_bias, verifier)
  if extra is not None:
    more, fields = extra
    tensors |= {k: np.asarray(v, np.float32).astype(DTYPES[dtype]) for k, v in more.items()}
    config = _merged(config, fields)
  with artifact.atomic_directory(out_dir, WRITES) as tmp:
    if fmt == "eagle":
      torch_files.write_torch(tmp / "pytorch_model.bin", tensors)
    else:
      torch_files.write_safetensors(tmp / "model.safetensors", tensors, {"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
  return Path(out_dir)


def _merged(config: dict, fields: dict) -> dict:
  """``config`` with ``fields`` set (nested dicts merged key by key)."""
  out = dict(config)
  for k, v in fields.items():
    out[k] = _merged(out.get(k, {}), v) if isinstance(v, dict) else v
  return out


def check_export(cfg, fmt: str, dtype: str = "float32", verifier: str | None = None) -> None:
  """Whether a drafter of ``cfg`` (an EagleConfig, e.g. read from eagle.json before anything
  loads) can be written as ``fmt``: one clear error naming the format, the architecture or the
  layer option the layout cannot hold, or (``verifier`` given, even empty) a speculators export
  that names no verifier."""
  if fmt not in EXPORTS:
    raise ValueError(
      f"config.export.format={fmt!r} is unknown; choose one of {', '.join(EXPORTS)}."
    )
  if dtype not in DTYPES:
    raise ValueError(
      f"config.export.dtype={dtype!r} is unknown; choose one of {', '.join(DTYPES)}."
    )
  arch = cfg.architecture
  if fmt == "speculators" and arch == "eagle1":
    raise ValueError(
      "config.export.format='speculators' holds EAGLE-3 drafters only: speculators >= 0.9 no "
      "longer reads its EAGLE-1 type (its config validation refuses it), so no engine would "
      "load the file. Export an eagle1 drafter as format='eagle' (SafeAILab's layout)."
    )
  allowed = {"eagle": ("eagle1",), "eagle3": ("eagle3",), "speculators": ("eagle3",)}
  if arch not in allowed[fmt]:
    want = " or ".join(allowed[fmt])
    raise ValueError(
      f"config.export.format={fmt!r} holds drafters of architecture {want}; this drafter's "
      f"architecture is {arch!r}"
      + (
        " (specjax's own variant: its final norm, feature fuse and shared head have no place "
        f"in that layout). Train with objective.eagle.architecture={allowed[fmt][-1]!r} to "
        "export it."
        if arch == "specjax"
        else f": export it as format={'eagle3' if arch == 'eagle3' else 'eagle'}"
        + (" or speculators." if arch == "eagle3" else ".")
      )
    )
  _check_expressible(cfg, fmt)
  if fmt == "speculators" and verifier is not None and not verifier:
    raise ValueError(
      "config.export.verifier is empty: speculators' loader reads the verifier's config (its "
      "hidden size and layers) when it loads the drafter. Name the target as it should find "
      "it: an HF id (org/name) or a local HF directory."
    )


def _check_expressible(cfg, fmt: str) -> None:
  """The layer options a layout's readers cannot build: one error naming the option."""
  layer = cfg.layer
  fixed = {"sliding_window": 0, "mlp_bias": False, "out_bias": False}
  if fmt in ("eagle", "eagle3"):  # SafeAILab's cnets, SGLang: no o/MLP biases, no q/k norm
    fixed |= {"qk_norm": False}
    if fmt == "eagle3":
      fixed |= {"qkv_bias": False}
  if fmt == "speculators" and cfg.architecture == "eagle3":
    fixed.pop("mlp_bias")
    fixed.pop("out_bias")
  for field, value in fixed.items():
    if getattr(layer, field) != value:
      raise ValueError(
        f"config.export.format={fmt!r}: the drafter's layer has {field}={getattr(layer, field)!r}, "
        f"which that layout's readers do not build (they assume {field}={value!r})."
      )
  if fmt == "speculators" and layer.qkv_bias != layer.out_bias:
    raise ValueError(
      "config.export.format='speculators': attention_bias covers q, k, v and o together; the "
      f"drafter's layer has qkv_bias={layer.qkv_bias} and out_bias={layer.out_bias}."
    )


def _layer_config(cfg, dtype: str) -> dict:
  """The HF Llama-style config of the drafter's layer (what every reader builds it from)."""
  layer = cfg.layer
  out = {
    "model_type": "qwen3" if layer.qk_norm else "llama",
    "hidden_size": layer.dim,
    "intermediate_size": layer.ffn_dim,
    "num_attention_heads": layer.num_heads,
    "num_key_value_heads": layer.num_kv_heads,
    "head_dim": layer.head_dim,
    "num_hidden_layers": 1,
    "hidden_act": "silu",
    "rms_norm_eps": layer.norm_eps,
    "rope_theta": layer.rope_theta,
    "rope_scaling": dict(layer.rope_scaling) or None,
    # specjax keeps no context limit; readers size RoPE tables and the draft's length by this
    "max_position_embeddings": 131072,
    "vocab_size": cfg.target.vocab_size,
    "attention_bias": bool(layer.qkv_bias),
    "mlp_bias": bool(layer.mlp_bias),
    "tie_word_embeddings": False,
    "torch_dtype": dtype,
  }
  return out


def _export_config(cfg, fmt: str, kind: str, dtype: str, fc_bias: bool, verifier: str) -> dict:
  into = [int(f) + 1 for f in cfg.feature_layers] if kind == "eagle3" else []
  base = _layer_config(cfg, dtype)
  if fmt == "eagle":
    arch = "Qwen2ForCausalLM" if cfg.layer.qkv_bias else "LlamaForCausalLM"
    return base | {"architectures": [arch], "bias": fc_bias, "qkv_bias": bool(cfg.layer.qkv_bias)}
  if fmt == "eagle3":
    return base | {
      "architectures": ["LlamaForCausalLMEagle3"],
      "draft_vocab_size": cfg.draft_vocab,
      "target_hidden_size": cfg.target.dim,
      "bias": False,
      "eagle_aux_hidden_state_layer_ids": into,  # vLLM's convention: the input of layer a
      "eagle_config": {  # SGLang's convention: the output of layer a (specjax's index)
        "eagle_aux_hidden_state_layer_ids": [int(f) for f in cfg.feature_layers],
        "use_aux_hidden_state": True,
      },
    }
  spec = {
    "algorithm": "eagle3",
    "proposal_methods": [
      {"proposal_type": "greedy", "speculative_tokens": 3, "accept_tolerance": 0.0}
    ],
    "default_proposal_method": "greedy",
    "verifier": {
      "name_or_path": verifier,
      "architectures": ["Qwen2ForCausalLM" if cfg.target.qkv_bias else "LlamaForCausalLM"],
    },
  }
  return {
    "speculators_model_type": "eagle3",
    "speculators_version": SPECULATORS_VERSION,
    "speculators_config": spec,
    "transformer_layer_config": base,
    "tie_word_embeddings": False,
    "torch_dtype": dtype,
    "architectures": ["Eagle3DraftModel"],
    "draft_vocab_size": cfg.draft_vocab,
    "target_hidden_size": cfg.target.dim,
    "eagle_aux_hidden_state_layer_ids": into,
    "norm_before_residual": False,
    "norm_before_fc": False,
    "fc_norm": False,
    "norm_output": False,
    "embed_requires_grad": False,
  }
