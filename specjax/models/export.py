"""A trained draft as an HF-style directory that ``specjax.build`` already loads as a draft model.

    export.save_model("results/distill/draft_final", cfg, params, tokenizer)
    # then: --config.drafter.draft_model.source=model with
    #   drafter.draft_model.model = {source: safetensors, path: ...}

The directory holds ``config.json`` (the Llama, Qwen2, Qwen3 or Mistral architecture whose block
it is), ``model.safetensors`` (HF tensor names, fp32) and, when the model has a tokenizer,
``tokenizer.json`` / ``tokenizer_config.json`` so the draft's tokenizer fingerprint matches the
target's. It is written under a temp name and renamed into place: a reader never sees half a
model.
"""

import json
import shutil
import tempfile
from pathlib import Path

import jax
import numpy as np
from safetensors.numpy import save_file

from specjax.models import llama, schema
from specjax.models.config import ModelConfig
from specjax.typing import Params


def hf_config(cfg: ModelConfig) -> dict:
  """The HF config.json of ``cfg``: the transformers architecture whose block it is."""
  arch = architecture(cfg)
  out = {
    "architectures": [arch],
    "model_type": arch.removesuffix("ForCausalLM").lower(),
    "vocab_size": cfg.vocab_size,
    "hidden_size": cfg.dim,
    "num_hidden_layers": cfg.num_layers,
    "num_attention_heads": cfg.num_heads,
    "num_key_value_heads": cfg.num_kv_heads,
    "intermediate_size": cfg.ffn_dim,
    "head_dim": cfg.head_dim,
    "rope_theta": cfg.rope_theta,
    "rms_norm_eps": cfg.norm_eps,
    "tie_word_embeddings": cfg.tie_embeddings,
    "hidden_act": "silu",
    "torch_dtype": "float32",
    "_name_or_path": cfg.name,
  }
  if cfg.rope_scaling:
    out["rope_scaling"] = dict(cfg.rope_scaling)
  if arch in ("LlamaForCausalLM", "Qwen3ForCausalLM"):
    out["attention_bias"] = cfg.out_bias
  if arch == "LlamaForCausalLM":
    out["mlp_bias"] = cfg.mlp_bias
  if arch == "MistralForCausalLM":
    out["sliding_window"] = cfg.sliding_window or None
  return out


def architecture(cfg: ModelConfig) -> str:
  """The transformers architecture with exactly ``cfg``'s block, or a ValueError."""
  llama_bias = cfg.qkv_bias == cfg.out_bias  # Llama's attention_bias covers q, k, v and o
  if cfg.qk_norm and llama_bias and not cfg.mlp_bias and not cfg.sliding_window:
    return "Qwen3ForCausalLM"
  if cfg.sliding_window and not (cfg.qk_norm or cfg.qkv_bias or cfg.out_bias or cfg.mlp_bias):
    return "MistralForCausalLM"
  if cfg.qkv_bias and not (cfg.out_bias or cfg.mlp_bias or cfg.qk_norm or cfg.sliding_window):
    return "Qwen2ForCausalLM"
  if llama_bias and not (cfg.qk_norm or cfg.sliding_window):
    return "LlamaForCausalLM"
  raise ValueError(
    f"{cfg.name!r} combines qkv_bias={cfg.qkv_bias}, out_bias={cfg.out_bias}, "
    f"mlp_bias={cfg.mlp_bias}, qk_norm={cfg.qk_norm}, sliding_window={cfg.sliding_window}: "
    "no transformers architecture has that block, so it cannot be exported."
  )


def hf_tensors(cfg: ModelConfig, params: Params) -> dict[str, np.ndarray]:
  """HF-named fp32 tensors, by ``llama.SCHEMA``'s HF column (the loader reads the same names)."""
  host = jax.device_get(params)
  names = schema.checkpoint_names(llama.SCHEMA, cfg, cfg.num_layers, "hf")
  return {n: np.ascontiguousarray(schema.lookup(host, p), np.float32) for n, p in names.items()}


def _tokenizer_files(tokenizer, directory: Path) -> None:
  (directory / "tokenizer.json").write_text(tokenizer.backend.to_str())
  to_token = tokenizer.backend.id_to_token
  tok_cfg = {
    "eos_token": to_token(tokenizer.eos_id),
    "bos_token": None if tokenizer.bos_id is None else to_token(tokenizer.bos_id),
    "add_bos_token": tokenizer.add_bos,
    "chat_template": tokenizer.chat_template,
  }
  (directory / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=1))


def save_model(directory: str | Path, cfg: ModelConfig, params: Params, tokenizer=None) -> Path:
  """Writes the model to ``directory`` atomically (replacing an older export there)."""
  directory = Path(directory)
  directory.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.", suffix=".tmp"))
  try:
    (tmp / "config.json").write_text(json.dumps(hf_config(cfg), indent=1))
    save_file(hf_tensors(cfg, params), str(tmp / "model.safetensors"))
    if tokenizer is not None:
      _tokenizer_files(tokenizer, tmp)
    if directory.exists():
      old = directory.with_name(f".{directory.name}.old")
      shutil.rmtree(old, ignore_errors=True)
      directory.rename(old)
      tmp.rename(directory)
      shutil.rmtree(old)
    else:
      tmp.rename(directory)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return directory
