"""A P-EAGLE drafter from a directory in either layout: specjax's own (``model.load_saved``) or
vLLM speculators' (``formats``)."""

from pathlib import Path

from specjax.drafters import artifact
from specjax.drafters.eagle.formats import read as eagle_read
from specjax.drafters.peagle import formats
from specjax.drafters.peagle.model import FIELD, META_FILE, PEagleConfig, load_saved, read_meta


def detect(directory, fmt: str = "auto", field: str = f"{FIELD}.path") -> str:
  """``specjax`` or ``speculators``: what ``directory`` holds (``fmt`` other than auto: must)."""
  d = Path(directory)
  if fmt not in ("auto", "specjax", *formats.FORMATS):
    raise ValueError(f"{FIELD}.format={fmt!r} is unknown; choose auto, specjax or speculators.")
  if not d.is_dir():
    raise ValueError(f"{field}={str(directory)!r} is not a directory.")
  held = [f for f, yes in (("specjax", (d / META_FILE).is_file()),
                           ("speculators", formats.is_speculators(d))) if yes]  # fmt: skip
  if fmt != "auto" and fmt not in held:
    raise ValueError(
      f"{FIELD}.format={fmt!r}, but {field}={str(directory)!r} holds no such drafter."
    )
  if not held:
    raise ValueError(
      f"{field}={str(directory)!r} holds neither {META_FILE} (specjax: task=train with "
      "objective.name=peagle writes one) nor a speculators P-EAGLE config.json "
      "(speculators_model_type: peagle)."
    )
  return fmt if fmt != "auto" else held[0]


def load(directory, target, fmt: str = "auto", field: str = f"{FIELD}.path"):
  """``(cfg, decode params, meta)`` from either layout, checked against ``target``."""
  if detect(directory, fmt, field) == "specjax":
    return load_saved(directory, target, field)
  return formats.load(directory, target, field)


def peek_num_depths(c) -> int:
  """The tokens per forward of ``config.drafter.peagle``'s drafter, before anything loads."""
  if detect(c.path, c.format) == "specjax":
    return read_meta(c.path)["peagle"]["num_depths"]
  return formats.peek(c.path)["num_depths"] or 8


def check_sizes(c, target_cfg, field: str = f"{FIELD}.path") -> None:
  """The drafter at ``c.path`` must read ``target_cfg``'s widths: checked from its files'
  headers and the target's, before either's weights load."""
  where = f"{field}={str(c.path)!r}"
  if detect(c.path, c.format, field) == "specjax":
    meta = read_meta(c.path, field)
    t = PEagleConfig.fromdict(meta["peagle"]).target
    artifact.check_sizes(meta, t.dim, t.vocab_size, target_cfg, where, "drafters")
  else:
    eagle_read.plan(c.path, target_cfg, "speculators", (formats.KIND,), formats.extra, field)
