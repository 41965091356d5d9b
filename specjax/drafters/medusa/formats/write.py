"""Writing specjax heads in FasterDecoding's ``medusa`` and vLLM's ``vllm_medusa`` layouts, with
the config.json their loaders read."""

import json
from pathlib import Path

import jax
import numpy as np

from specjax.drafters import artifact
from specjax.drafters.medusa import model as specjax_medusa
from specjax.drafters.medusa.formats.read import CONFIG, DTYPES, EXPORTS, MEDUSA_FILES, VLLM_FILE
from specjax.drafters.medusa.model import HeadsConfig
from specjax.models import schema, torch_files

WRITES = frozenset({CONFIG, VLLM_FILE, *MEDUSA_FILES})  # what an export may replace


def export(
  cfg: HeadsConfig, params: dict, out_dir, fmt: str, dtype: str = "float32",
  base_model: str = "", torch_file: bool = True,
):  # fmt: skip
  """Writes heads in ``fmt`` (``medusa`` or ``vllm_medusa``) with the config.json their loaders
  read, into ``out_dir`` atomically; ``torch_file``: the ``medusa`` layout also as
  ``medusa_lm_head.pt`` (the only file FasterDecoding's ``MedusaModel.from_pretrained`` reads).
  A shared projection is written once per head."""
  if fmt not in EXPORTS:
    raise ValueError(f"export format {fmt!r} is unknown; choose one of {', '.join(EXPORTS)}.")
  if dtype not in DTYPES:
    raise ValueError(f"export dtype {dtype!r} is unknown; choose one of {', '.join(DTYPES)}.")
  if "proj" not in params:
    raise ValueError(
      "the heads' params lack 'proj' (heads that share the target's head save none): export "
      "the params drafters.medusa.load(directory, target) returns, which hold it."
    )
  p = {k: np.asarray(jax.device_get(v)) for k, v in params.items()}
  schema.check_shapes(specjax_medusa.SCHEMA, cfg, {k: p[k] for k in ("res_w", "res_b", "proj")}, 0)
  h, r = cfg.num_heads, cfg.num_layers
  proj = np.broadcast_to(p["proj"], (h, cfg.vocab_size, cfg.dim))
  ids = p.get("vocab_ids", np.arange(cfg.vocab_size)).astype(np.int64)
  cast = lambda x: np.ascontiguousarray(np.asarray(x, np.float32).astype(DTYPES[dtype]))  # noqa: E731
  if not cfg.reduced:  # whole vocabulary: rows in target id order, no map
    full = np.zeros((h, cfg.target_vocab_size, cfg.dim), np.float32)
    full[:, ids] = proj
    proj = full
  out, cfg_json = {}, {"hidden_size": cfg.dim, "vocab_size": cfg.target_vocab_size,
                       "torch_dtype": dtype}  # fmt: skip
  if fmt == "medusa":
    if cfg.reduced:
      raise ValueError(
        f"these heads draft from {cfg.vocab_size} of {cfg.target_vocab_size} tokens, and "
        "FasterDecoding's layout has no place for a reduced vocabulary: export them with "
        "fmt='vllm_medusa', whose token_map holds it."
      )
    same = all(np.array_equal(p["res_w"][:, j], p["res_w"][:, 0]) and
               np.array_equal(p["res_b"][:, j], p["res_b"][:, 0]) for j in range(r))  # fmt: skip
    if not same:
      raise ValueError(
        f"these heads have {r} distinct residual layers, but FasterDecoding's heads repeat one "
        "block (their layers share weights): export them with fmt='vllm_medusa'."
      )
    for k in range(h):
      for j in range(r):
        out[f"{k}.{j}.linear.weight"] = cast(p["res_w"][k, j])
        out[f"{k}.{j}.linear.bias"] = cast(p["res_b"][k, j])
      out[f"{k}.{r}.weight"] = cast(proj[k])
    cfg_json |= {
      "medusa_num_heads": h,
      "medusa_num_layers": r,
      "base_model_name_or_path": base_model,
    }
    files = {MEDUSA_FILES[0]: torch_files.write_safetensors}
    if torch_file:
      files[MEDUSA_FILES[1]] = torch_files.write_torch
  else:
    bias = bool(np.any(p["res_b"] != 0))  # no bias tensors when all are zero: any vLLM reads it
    for k in range(h):
      for j in range(r):
        out[f"blocks.{k}.layers.{j}.weight"] = cast(p["res_w"][k, j])
        if bias:
          out[f"blocks.{k}.layers.{j}.bias"] = cast(p["res_b"][k, j])
      out[f"lm_heads.{k}.weight"] = cast(proj[k])
    if cfg.reduced:
      out["token_map"] = ids
    cfg_json |= {
      "architectures": ["MedusaModel"], "model_type": "medusa", "num_heads": h,
      "num_hidden_layers": r, "truncated_vocab_size": cfg.vocab_size, "medusa_fc_bias": bias,
      "max_paths": 64, "topk": 10,
    }  # fmt: skip
    files = {VLLM_FILE: torch_files.write_safetensors}
  with artifact.atomic_directory(out_dir, WRITES) as tmp:
    for name, write in files.items():
      write(tmp / name, out)
    (tmp / CONFIG).write_text(json.dumps(cfg_json, indent=2) + "\n")
  return Path(out_dir)
