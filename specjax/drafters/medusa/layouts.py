"""Medusa heads from a directory in any layout: specjax's own (``model.load_saved``) or
FasterDecoding's or vLLM's, which ``formats`` maps onto ``model.HeadsConfig``. ``formats`` reads
``model``, so it is imported here, above both, and ``model`` knows only specjax's layout."""

from specjax.drafters.medusa.model import FIELD, HeadsConfig, read_meta


def published():
  """``formats`` (the other projects' layouts), imported when first needed."""
  from specjax.drafters.medusa import formats as medusa

  return medusa


def load(
  directory, target, fmt: str = "auto", field: str = f"{FIELD}.path"
) -> tuple[HeadsConfig, dict, dict]:
  """``(heads, decode params, meta)``; ``fmt``: auto | specjax | medusa | vllm_medusa (see
  ``specjax.drafters.medusa.formats``). Foreign heads carry no target fingerprint: their sizes are
  checked against the target's."""
  return published().load(directory, target, fmt, field)


def export(cfg: HeadsConfig, params: dict, out_dir, fmt: str, dtype: str = "float32"):
  """Heads written in a published layout (``formats.export``)."""
  return published().export(cfg, params, out_dir, fmt, dtype)


def check_export(directory, fmt: str, dtype: str, options: dict, field: str) -> None:
  """The saved heads' ``medusa.json`` against layout ``fmt``, before anything loads:
  FasterDecoding's layout holds the full vocabulary only."""
  del dtype, options
  heads = read_meta(directory, f"{field}.path")["heads"]
  if fmt == "medusa" and heads["vocab_size"] < heads["target_vocab_size"]:
    raise ValueError(
      f"{field}.path={str(directory)!r} has a reduced draft vocabulary ({heads['vocab_size']} "
      f"of {heads['target_vocab_size']}), which FasterDecoding's layout cannot hold: set "
      f"{field}.format=vllm_medusa (its token_map holds it)."
    )
