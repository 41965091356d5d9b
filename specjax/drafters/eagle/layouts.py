"""An EAGLE drafter from a directory in any layout: specjax's own (``model.load_saved``) or a
published one (SafeAILab EAGLE-1/2 and EAGLE-3, SpecForge, vLLM speculators), which
``formats`` maps onto ``model.EagleConfig``. ``formats`` reads ``model``, so it is imported
here, above both, and ``model`` knows only specjax's layout."""

from pathlib import Path

from specjax.drafters.eagle.model import FIELD, META_FILE, EagleConfig, load_saved


def load(
  directory, target, fmt: str = "auto", field: str = f"{FIELD}.path"
) -> tuple[EagleConfig, dict, dict]:
  """``(cfg, decode params, meta)``. ``fmt`` (``drafter.eagle.format``): ``auto`` reads a
  specjax drafter (``eagle.json``) or a published one, ``specjax`` only the former, ``eagle`` /
  ``eagle3`` / ``speculators`` only that published layout."""
  if fmt == "specjax" or (fmt == "auto" and (Path(directory) / META_FILE).is_file()):
    return load_saved(directory, target, field)
  from specjax.drafters.eagle import formats

  return formats.load(directory, target, fmt)
