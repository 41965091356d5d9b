"""DFlash in vLLM speculators' layout (``speculators_model_type: dflash``), read into specjax's
model and written from it.

    config.json        speculators_model_type "dflash", transformer_layer_config (the draft
                       layers: hidden_size, num_hidden_layers, heads, intermediate_size, rope,
                       rms_norm_eps, vocab_size), block_size, aux_hidden_state_layer_ids,
                       mask_token_id, draft_vocab_size, sample_from_anchor
    model.safetensors  fc.weight [F, nF], hidden_norm.weight, norm.weight,
                       layers.{i}.self_attn.{q,k,v,o}_proj.weight,
                       layers.{i}.self_attn.{q,k}_norm.weight,
                       layers.{i}.{input,post_attention}_layernorm.weight,
                       layers.{i}.mlp.{gate,up,down}_proj.weight

The embedding and the head are the verifier's: specjax reads the target's, and writes them into
an export (``embed_tokens.weight`` [V, F], ``lm_head.weight`` [V', F]) so that speculators'
``from_pretrained`` builds the drafter from its own file. A reduced draft vocabulary adds
``d2t`` [V'] (target id = draft id + d2t) and ``t2d`` [V]; its ``lm_head`` is the verifier's
rows. An auxiliary layer id a names the hidden state fed *into* target layer a,
specjax's feature a - 1.

DSpark (``speculators_model_type: dspark``) is the same layout with ``sample_from_anchor``,
``markov_rank``, ``markov_head_type``, ``enable_confidence_head`` and
``confidence_head_with_markov`` in config.json, and its heads' tensors:
``markov_head.markov_w1.weight`` [V, r], ``markov_head.markov_w2.weight`` [V', r],
``markov_head.gate_proj.{weight,bias}`` (gated), ``markov_head.joint_proj.{weight,bias}``
(rnn), ``confidence_head.proj.{weight,bias}``. A drafter with any of these writes ``dspark``.
"""

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from specjax.drafters import artifact
from specjax.drafters.dflash.model import (
  FIELD,
  DFlashConfig,
  decode_params,
  flat,
  head_shapes,
  unflat,
)
from specjax.models import llama, schema
from specjax.models.config import ModelConfig

CONFIG, WEIGHTS = "config.json", "model.safetensors"
WRITES = (CONFIG, WEIGHTS)
FORMATS = ("specjax", "speculators")
TYPES = ("dflash", "dspark")  # speculators_model_type
HEAD_NAMES = {  # specjax name -> speculators tensor of DSpark's heads
  "markov_w1": "markov_head.markov_w1.weight", "markov_w2": "markov_head.markov_w2.weight",
  "markov_gate_w": "markov_head.gate_proj.weight", "markov_gate_b": "markov_head.gate_proj.bias",
  "markov_joint_w": "markov_head.joint_proj.weight",
  "markov_joint_b": "markov_head.joint_proj.bias",
  "confidence_w": "confidence_head.proj.weight", "confidence_b": "confidence_head.proj.bias",
}  # fmt: skip


def _layer_names(layer: ModelConfig) -> dict[str, tuple]:
  """``{speculators tensor name: ("layers", i, specjax name)}`` of the draft layers."""
  names = schema.checkpoint_names(llama.SCHEMA, layer, layer.num_layers, "hf")
  return {n.removeprefix("model."): path for n, path in names.items() if path[0] == "layers"}


def is_speculators(directory) -> bool:
  path = Path(directory) / CONFIG
  if not path.is_file():
    return False
  config = artifact.read_json(path, f"{FIELD}.path")
  return config.get("speculators_model_type") in TYPES


def peek(directory, field: str = f"{FIELD}.path") -> dict:
  """The speculators config, checked for what specjax reads (no tensor is read)."""
  config = artifact.read_json(Path(directory) / CONFIG, field)
  if config.get("speculators_model_type") not in TYPES:
    raise ValueError(
      f"{field}={str(directory)!r}: config.json is not a speculators DFlash or DSpark drafter "
      f"(speculators_model_type {config.get('speculators_model_type')!r})."
    )
  layer = config.get("transformer_layer_config") or {}
  draft_vocab = config.get("draft_vocab_size", layer.get("vocab_size", 1))
  if not 1 <= draft_vocab <= layer.get("vocab_size", 0):
    raise ValueError(
      f"{field}={str(directory)!r}: draft_vocab_size={config.get('draft_vocab_size')} is not "
      f"in [1, {layer.get('vocab_size')}] (the verifier's vocabulary)."
    )
  aux = config.get("aux_hidden_state_layer_ids") or []
  if not aux or min(aux) < 1:
    raise ValueError(
      f"{field}={str(directory)!r}: aux_hidden_state_layer_ids={aux} must name target layers "
      ">= 1 (the state fed into layer a; 0, the embeddings, is not a feature here)."
    )
  return config


def shape_of(config: dict) -> dict:
  """The DFlashConfig fields a speculators config sets that a random drafter's config also
  sets (speculators' defaults where it is silent)."""
  return {
    "block_size": config.get("block_size", 8),
    "num_layers": config["transformer_layer_config"]["num_hidden_layers"],
    "feature_layers": tuple(a - 1 for a in config["aux_hidden_state_layer_ids"]),
    "mask_id": config.get("mask_token_id") or 0,
  }


def config_for(config: dict, target_cfg: ModelConfig, field: str) -> DFlashConfig:
  """The speculators config as a DFlashConfig for ``target_cfg``: its layer must have the
  target's widths (heads, hidden size, vocabulary), one clear error otherwise."""
  layer = config["transformer_layer_config"]
  want = {"hidden_size": target_cfg.dim, "num_attention_heads": target_cfg.num_heads,
          "num_key_value_heads": target_cfg.num_kv_heads, "vocab_size": target_cfg.vocab_size,
          "head_dim": target_cfg.head_dim}  # fmt: skip
  wrong = {k: layer.get(k) for k, v in want.items() if layer.get(k, v) != v}
  if wrong:
    raise ValueError(
      f"{field}: this DFlash drafter's layers have {wrong}, but the target {target_cfg.name!r} "
      f"has { ({k: want[k] for k in wrong}) }: it was trained for another target."
    )
  shape = shape_of(config)
  features = shape["feature_layers"]
  ffn = layer.get("intermediate_size", target_cfg.ffn_dim)
  if max(features) >= target_cfg.num_layers:
    raise ValueError(
      f"{field}: aux_hidden_state_layer_ids {config['aux_hidden_state_layer_ids']} name layers "
      f"the target ({target_cfg.num_layers} layers) does not have."
    )
  draft_vocab = config.get("draft_vocab_size", target_cfg.vocab_size)
  dspark = config["speculators_model_type"] == "dspark"  # speculators' defaults where unsaid
  try:
    return DFlashConfig(
      target_cfg, features, shape["num_layers"], shape["block_size"], shape["mask_id"],
      ffn if ffn != target_cfg.ffn_dim else 0,
      draft_vocab if draft_vocab < target_cfg.vocab_size else 0,
      sample_from_anchor=bool(config.get("sample_from_anchor", dspark)),
      markov_rank=int(config.get("markov_rank", 256)) if dspark else 0,
      markov_head=config.get("markov_head_type", "vanilla"),
      confidence=bool(config.get("enable_confidence_head", True)) and dspark,
      confidence_with_markov=bool(config.get("confidence_head_with_markov", True)),
    )  # fmt: skip
  except ValueError as e:
    raise ValueError(f"{field}: {e}") from None


def load(directory, target, field: str = f"{FIELD}.path") -> tuple[DFlashConfig, dict, dict]:
  """``(cfg, decode params, config.json)`` of a speculators DFlash directory, for ``target``."""
  config = peek(directory, field)
  cfg = config_for(config, target.cfg, field)
  names = _layer_names(cfg.layer) | {"fc.weight": ("fc",), "hidden_norm.weight": ("hidden_norm",),
                                     "norm.weight": ("norm",)}  # fmt: skip
  path = Path(directory) / WEIGHTS
  if not path.is_file():
    raise ValueError(f"{field}={str(directory)!r} holds no {WEIGHTS}.")
  if cfg.vocab_size:
    names["d2t"] = ("vocab_ids",)
  names |= {HEAD_NAMES[k]: (k,) for k in head_shapes(cfg)}
  with safe_open(str(path), "np") as f:
    held = set(f.keys())
    missing = sorted(set(names) - held)
    if missing:
      raise ValueError(f"{field}: {path} lacks {missing[:4]}: not a DFlash drafter of this shape.")
    tensors = {_flat_name(names[n]): f.get_tensor(n) for n in names}
  tensors = {k: v.astype(np.float32) for k, v in tensors.items() if k != "vocab_ids"} | (
    {"vocab_ids": (tensors["vocab_ids"] + np.arange(cfg.vocab_size)).astype(np.int32)}
    if cfg.vocab_size else {}
  )  # fmt: skip
  params = unflat(tensors, cfg.num_layers)
  want = {"fc": (cfg.target.dim, cfg.target.dim * len(cfg.feature_layers))} | head_shapes(cfg)
  for k, shape in want.items():
    if tuple(params[k].shape) != shape:
      name = HEAD_NAMES.get(k, f"{k}.weight")
      raise ValueError(f"{field}: {name} is {tuple(params[k].shape)}, expected {shape}.")
  for i, (got, want_i) in enumerate(zip(params["layers"], llama.param_shapes(cfg.layer)["layers"],
                                        strict=True)):  # fmt: skip
    for k, v in want_i.items():
      if tuple(got[k].shape) != tuple(v.shape):
        raise ValueError(f"{field}: layers.{i}'s {k} is {tuple(got[k].shape)}, expected {v.shape}.")
  return cfg, decode_params(params, target.params, target.cfg), config


def _flat_name(path: tuple) -> str:
  return f"layers.{path[1]}.{path[2]}" if path[0] == "layers" else path[0]


def export(cfg: DFlashConfig, params: dict, out_dir, dtype: str = "float32", verifier: str = ""):
  """The drafter in speculators' layout (config.json and model.safetensors), written whole or
  not at all; ``verifier``: the target as speculators' loader should find it."""
  t = cfg.target
  layer = {
    "model_type": "qwen3", "hidden_size": t.dim, "num_hidden_layers": cfg.num_layers,
    "intermediate_size": cfg.layer.ffn_dim, "num_attention_heads": t.num_heads,
    "num_key_value_heads": t.num_kv_heads, "head_dim": t.head_dim, "rms_norm_eps": t.norm_eps,
    "rope_theta": t.rope_theta, "vocab_size": t.vocab_size, "max_position_embeddings": 4096,
    "attention_bias": False, "tie_word_embeddings": False,
  }  # fmt: skip
  dspark = bool(cfg.markov_rank or cfg.confidence or cfg.sample_from_anchor)
  kind, arch = ("dspark", "DSparkSpeculator") if dspark else ("dflash", "DFlashSpeculator")
  config = {
    "speculators_model_type": kind, "architectures": [arch],
    "transformer_layer_config": layer, "draft_vocab_size": cfg.vocab_size or t.vocab_size,
    "block_size": cfg.block_size, "target_hidden_size": t.dim,
    "aux_hidden_state_layer_ids": [f + 1 for f in cfg.feature_layers],
    "mask_token_id": cfg.mask_id, "sliding_window_non_causal": False,
    "sample_from_anchor": cfg.sample_from_anchor,
    "speculators_config": {
      "algorithm": kind, "default_proposal_method": "greedy",
      "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": cfg.num_draft}],
      "verifier": {"name_or_path": verifier or None, "architectures": ["LlamaForCausalLM"]},
    },
  }  # fmt: skip
  names = {_flat_name(path): n for n, path in _layer_names(cfg.layer).items()}
  names |= {"fc": "fc.weight", "hidden_norm": "hidden_norm.weight", "norm": "norm.weight"}
  names |= HEAD_NAMES
  trained = {k: v for k, v in flat(params).items() if k != "vocab_ids"}
  tensors = {names[k]: np.asarray(jnp.asarray(v).astype(dtype)) for k, v in trained.items()}
  cast = lambda x: np.asarray(jnp.asarray(x).astype(dtype))  # noqa: E731
  tensors |= {"embed_tokens.weight": cast(params["embed"]), "lm_head.weight": cast(params["head"])}
  if cfg.vocab_size:  # the draft vocabulary as speculators maps it
    ids = np.asarray(params["vocab_ids"], np.int64)
    t2d = np.zeros((t.vocab_size,), bool)
    t2d[ids] = True
    tensors |= {"d2t": ids - np.arange(len(ids)), "t2d": t2d}
  if dspark:
    config |= {"markov_rank": cfg.markov_rank, "markov_head_type": cfg.markov_head,
               "enable_confidence_head": cfg.confidence,
               "confidence_head_with_markov": cfg.confidence_with_markov}  # fmt: skip
  with artifact.atomic_directory(out_dir, WRITES) as tmp:
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(tmp / WEIGHTS),
              metadata={"format": "pt"})  # fmt: skip
    (tmp / CONFIG).write_text(json.dumps(config, indent=1))
  return Path(out_dir)
