"""Medusa heads from a directory in any layout: specjax's own (``model.load_saved``) or
FasterDecoding's or vLLM's, which ``formats`` maps onto ``model.HeadsConfig``. ``formats`` reads
``model``, so it is imported here, above both, and ``model`` knows only specjax's layout."""

from specjax.drafters.medusa.model import FIELD, HeadsConfig


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
