"""A DFlash drafter from a directory in either layout: specjax's own (``model.load_saved``) or
vLLM speculators' (``formats``), or random weights for a config without a path."""

from pathlib import Path

import jax

from specjax.drafters import artifact
from specjax.drafters.dflash import formats
from specjax.drafters.dflash.model import (
  FIELD,
  META_FILE,
  DFlashConfig,
  decode_params,
  init_params,
  load_saved,
  read_meta,
)


def detect(directory, fmt: str = "auto", field: str = f"{FIELD}.path") -> str:
  """``specjax`` or ``speculators``: what ``directory`` holds (``fmt`` other than auto: must)."""
  d = Path(directory)
  if not d.is_dir():
    raise ValueError(f"{field}={str(directory)!r} is not a directory.")
  held = [f for f, yes in (("specjax", (d / META_FILE).is_file()),
                           ("speculators", formats.is_speculators(d))) if yes]  # fmt: skip
  if fmt not in ("auto", *formats.FORMATS):
    raise ValueError(f"{FIELD}.format={fmt!r} is unknown; choose auto, specjax or speculators.")
  if fmt != "auto" and fmt not in held:
    raise ValueError(
      f"{FIELD}.format={fmt!r}, but {field}={str(directory)!r} holds no such drafter."
    )
  if not held:
    raise ValueError(
      f"{field}={str(directory)!r} holds neither {META_FILE} (specjax) nor a speculators DFlash "
      "config.json."
    )
  return fmt if fmt != "auto" else held[0]


def load(directory, target, fmt: str = "auto", field: str = f"{FIELD}.path"):
  """``(cfg, decode params, meta)`` from either layout, checked against ``target``."""
  if detect(directory, fmt, field) == "specjax":
    return load_saved(directory, target, field)
  return formats.load(directory, target, field)


def peek_num_draft(c) -> int:
  """The positions a block of ``config.drafter.dflash`` drafts, before anything loads (its
  files' headers): B - 1, or B where the anchor's position drafts too (DSpark)."""
  if not c.path:
    return c.block_size - 1
  if detect(c.path, c.format) == "specjax":
    meta = read_meta(c.path)["dflash"]
    return meta["block_size"] - (0 if meta.get("sample_from_anchor") else 1)
  config = formats.peek(c.path)
  anchor = config.get("sample_from_anchor", config["speculators_model_type"] == "dspark")
  return config.get("block_size", 8) - (0 if anchor else 1)


def check_shape(c, defaults) -> None:
  """The subsection's shape fields (``defaults``: its own config) shape random weights only:
  beside a path each must be left at its default or equal the saved drafter's."""
  if detect(c.path, c.format) == "specjax":
    meta = read_meta(c.path)["dflash"]
    saved = {k: meta[k] for k in ("block_size", "num_layers", "feature_layers", "mask_id")}
  else:
    saved = formats.shape_of(formats.peek(c.path))
  artifact.check_random_only(c, defaults, saved, FIELD)


def check_sizes(c, target_cfg, field: str = f"{FIELD}.path") -> None:
  """The drafter at ``c.path`` must read ``target_cfg``'s widths: checked from its files'
  headers and the target's, before either's weights load."""
  if detect(c.path, c.format, field) == "specjax":
    meta = read_meta(c.path, field)
    t = meta["dflash"]["target"]
    what = "DFlash drafter weights"
    artifact.check_sizes(meta, t["dim"], t["vocab_size"], target_cfg, field, what)
  else:
    formats.config_for(formats.peek(c.path, field), target_cfg, field)


def load_or_init(c, target) -> tuple[DFlashConfig, dict]:
  """The drafter of ``config.drafter.dflash``: loaded from ``path``, or random (seeded) weights
  of the subsection's shapes."""
  if c.path:
    cfg, params, _ = load(c.path, target, c.format)
    return cfg, params
  cfg = DFlashConfig(target.cfg, tuple(c.feature_layers), c.num_layers, c.block_size, c.mask_id)
  params = init_params(cfg, jax.random.key(0))
  return cfg, decode_params(params, target.params, target.cfg)
