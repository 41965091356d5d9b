"""An EAGLE drafter from a directory in any layout: specjax's own (``model.load_saved``) or a
published one (SafeAILab EAGLE-1/2 and EAGLE-3, SpecForge, vLLM speculators), which
``formats`` maps onto ``model.EagleConfig``. ``formats`` reads ``model``, so it is imported
here, above both, and ``model`` knows only specjax's layout."""

import re
from pathlib import Path

from specjax.drafters.eagle.model import FIELD, META_FILE, EagleConfig, load_saved, read_meta


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


def export(cfg, params, out_dir, fmt: str, dtype: str = "bfloat16", verifier: str = "") -> Path:
  """A drafter written in a published layout (``formats.export``)."""
  from specjax.drafters.eagle import formats

  return formats.export(cfg, params, out_dir, fmt, dtype, verifier=verifier)


def check_export(directory, fmt: str, dtype: str, options: dict, field: str) -> None:
  """The saved drafter's ``eagle.json`` against layout ``fmt``, before anything loads; and
  ``verifier`` (``options``), which only the speculators layout records: an HF directory
  (with config.json) or an HF id (``org/name``)."""
  from specjax.drafters.eagle import formats

  cfg = EagleConfig.fromdict(read_meta(directory, f"{field}.path")["eagle"])
  verifier = options.get("verifier", "")
  check_verifier(verifier, fmt, field)
  formats.check_export(cfg, fmt, dtype, verifier)


def check_verifier(verifier: str, fmt: str, field: str) -> None:
  """``export.verifier``: recorded by speculators' layouts only; an HF directory (with
  config.json) or an HF id (``org/name``)."""
  if not verifier:
    return
  if not fmt.startswith("speculators"):
    raise ValueError(
      f"{field}.verifier={verifier!r} is recorded by format=speculators only; leave it empty "
      f"for format={fmt!r}."
    )
  path = Path(verifier)
  if path.exists():
    if not (path / "config.json").is_file():
      raise ValueError(
        f"{field}.verifier={verifier!r} is a local path without config.json: name the "
        "target's HF directory (or its HF id, org/name)."
      )
  elif not re.fullmatch(r"[\w.-]+/[\w.-]+", verifier):
    raise ValueError(
      f"{field}.verifier={verifier!r} is neither a local directory nor an HF id (org/name): "
      "name the target as speculators' loader should find it."
    )
