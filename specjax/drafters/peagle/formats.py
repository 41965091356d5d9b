"""vLLM speculators' ``peagle`` layout: speculators' EAGLE-3 files (``layers.0.*``, ``fc``,
``norm``, ``lm_head``, ``d2t``/``t2d``, the embedding) plus ``mask_hidden`` [1, 1, nF], with
``speculators_model_type: peagle``, ``mask_token_id`` and the tokens drafted per forward as the
greedy proposal's ``speculative_tokens``. Read and written through the EAGLE layouts' reader and
writer (``drafters/eagle/formats``), which check the shared part."""

import json
from pathlib import Path

import numpy as np

from specjax.drafters.eagle.formats import read as eagle_read
from specjax.drafters.eagle.formats import write as eagle_write
from specjax.drafters.peagle.model import FIELD, PEagleConfig

FORMATS = ("speculators",)
EXPORTS = ("speculators_peagle",)
WRITES = eagle_write.WRITES
KIND = "peagle"


def _config(directory) -> dict | None:
  path = Path(directory) / "config.json"
  if not path.is_file():
    return None
  try:
    return json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f"{FIELD}: {path} is not JSON ({e}).") from None


def is_speculators(directory) -> bool:
  config = _config(directory)
  return isinstance(config, dict) and config.get("speculators_model_type") == KIND


def peek(directory) -> dict:
  """``num_depths`` and ``mask_id`` from the config alone (0 where it gives none)."""
  config = _config(directory) or {}
  methods = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
  return {
    "num_depths": int(methods[0].get("speculative_tokens") or 0),
    "mask_id": config.get("mask_token_id"),
  }


def extra(cfg) -> dict:
  """P-EAGLE's tensor beyond EAGLE-3's (checkpoint name -> (name, shape))."""
  return {"mask_hidden": ("mask_hidden", (1, 1, cfg.target.dim * len(cfg.feature_layers)))}


def load(directory, target, field: str = f"{FIELD}.path"):
  """``(PEagleConfig, decode params, meta)`` of a speculators P-EAGLE directory: its EAGLE-3
  part checked and read as the EAGLE layouts are, then ``mask_hidden`` and the config's
  ``mask_token_id`` and tokens per forward."""
  where = f"{field}={str(directory)!r}"
  got = peek(directory)
  if got["mask_id"] is None:
    raise ValueError(
      f"{where}: config.json has no mask_token_id (the token of P-EAGLE's masked rows): set it "
      "to the id the drafter was trained with."
    )
  ecfg, params, meta = eagle_read.load(directory, target, "speculators", (KIND,), extra, field)
  try:
    cfg = PEagleConfig(ecfg, got["num_depths"] or 8, int(got["mask_id"]))
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from None
  params["mask_hidden"] = params["mask_hidden"].reshape(-1)
  return cfg, params, meta


def export(cfg: PEagleConfig, params, out_dir, dtype: str = "float32", verifier: str = ""):
  """``params`` in speculators' ``peagle`` layout (``verifier``: the target as its loader should
  find it, an HF id or a local directory), written atomically."""
  eagle_write.check_export(cfg.eagle, "speculators", dtype, verifier)
  hidden = np.asarray(params["mask_hidden"], np.float32).reshape(1, 1, -1)
  proposal = {"proposal_type": "greedy", "speculative_tokens": cfg.num_depths,
              "accept_tolerance": 0.0}  # fmt: skip
  fields = {
    "speculators_model_type": KIND,
    "architectures": ["PEagleSpeculator"],
    "mask_token_id": cfg.mask_id,
    "embed_requires_grad": True,
    "speculators_config": {"algorithm": KIND, "proposal_methods": [proposal]},
  }
  return eagle_write.export(cfg.eagle, params, out_dir, "speculators", dtype, verifier,
                            extra=({"mask_hidden": hidden}, fields))  # fmt: skip
