"""RoPE inverse frequencies of an HF config, computed once on the host as transformers does.

    inv_freq, attention_factor = rope.from_hf(config_json, head_dim)

The result goes into ``ModelConfig.rope_inv_freq`` (empty for plain RoPE) and
``ModelConfig.rope_attention_factor``; the forward only multiplies positions by them, so a
scaled RoPE costs nothing per step. Formulas follow transformers' ``modeling_rope_utils``
(``default``, ``linear``, ``llama3``, ``yarn``), in float32 as it computes them.

``dynamic`` (NTK) is refused: its frequencies change with the current sequence length, which a
static KV cache of already-rotated keys cannot follow. Other types (``longrope``, ``mrope``,
``proportional``, ...) and partial rotary embeddings are refused too, naming the key.
"""

import math

import numpy as np

SUPPORTED = ("default", "linear", "llama3", "yarn")


def parameters(config: dict) -> dict:
  """The RoPE settings of an HF config as one dict with ``rope_type`` and ``rope_theta``.

  transformers >= 5 writes them under ``rope_parameters``; older versions write ``rope_theta``
  at the top level and the scaling (``type`` or ``rope_type``) under ``rope_scaling``.
  """
  for key in ("rope_scaling", "rope_parameters"):
    if config.get(key) is not None and not isinstance(config[key], dict):
      raise ValueError(
        f"config.json's {key}={config[key]!r} is not an object: HF writes it as "
        '{"rope_type": ..., ...} (or null for plain RoPE); fix or remove the key.'
      )
  rp = dict(config.get("rope_scaling") or {}) | dict(config.get("rope_parameters") or {})
  rp["rope_type"] = rp.get("rope_type") or rp.get("type") or "default"
  rp.setdefault("rope_theta", config.get("rope_theta", 10_000.0))
  if config.get("partial_rotary_factor") is not None:
    rp.setdefault("partial_rotary_factor", config["partial_rotary_factor"])
  return rp


def _key(config: dict) -> str:
  return "rope_parameters" if config.get("rope_parameters") else "rope_scaling"


def check(config: dict) -> None:
  """A ValueError naming the config key if specjax cannot compute this RoPE as transformers."""
  rp = parameters(config)
  rope_type = rp["rope_type"]
  if rope_type not in SUPPORTED:
    why = {
      "dynamic": " (dynamic NTK rescales the frequencies as the sequence grows, which a static "
      "KV cache of already-rotated keys cannot follow)",
    }.get(rope_type, "")
    raise ValueError(
      f"{_key(config)}.rope_type={rope_type!r} is unsupported{why}; supported: "
      f"{', '.join(SUPPORTED)}."
    )
  if float(rp.get("partial_rotary_factor") or 1.0) != 1.0:
    raise ValueError(
      f"partial_rotary_factor={rp['partial_rotary_factor']} (RoPE on part of each head) is "
      "unsupported; specjax rotates whole heads."
    )
  needs = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor")}
  for field in needs.get(rope_type, ()):
    if rp.get(field) is None:
      raise ValueError(f"{_key(config)} of rope_type {rope_type!r} lacks {field!r}.")


def from_hf(config: dict, head_dim: int) -> tuple[tuple[float, ...], float]:
  """``(inv_freq, attention_factor)`` of an HF config: ``()`` for plain RoPE, else the
  ``head_dim // 2`` scaled inverse frequencies. ``check`` first."""
  check(config)
  rp = parameters(config)
  rope_type, base = rp["rope_type"], float(rp["rope_theta"])
  if rope_type == "default":
    return (), 1.0
  original = _original(rp, config)
  inv_freq, factor = _default(base, head_dim), 1.0
  if rope_type == "linear":
    inv_freq = inv_freq / np.float32(rp["factor"])
  elif rope_type == "llama3":
    inv_freq = _llama3(inv_freq, rp, original)
  else:
    inv_freq, factor = _yarn(base, head_dim, rp, config, original)
  return tuple(float(f) for f in inv_freq.astype(np.float32)), float(factor)


def scaling(config: dict) -> tuple[tuple[str, object], ...]:
  """The scaling settings as sorted ``(key, value)`` pairs (``ModelConfig.rope_scaling``), with
  the context lengths they depend on resolved, so that ``rope_scaling`` alone (and
  ``rope_theta``) gives ``from_hf`` the same frequencies back; ``()`` for plain RoPE."""
  rp = parameters(config)
  if rp["rope_type"] == "default":
    return ()
  rp = {k: v for k, v in rp.items() if k not in ("rope_theta", "type") and v is not None}
  rp["original_max_position_embeddings"] = _original(rp, config)
  if rp["rope_type"] == "yarn" and rp.get("factor") is None:
    rp["factor"] = config["max_position_embeddings"] / rp["original_max_position_embeddings"]
  return tuple(sorted(rp.items()))


def _original(rp: dict, config: dict):
  return rp.get("original_max_position_embeddings") or config.get("max_position_embeddings")


def _default(base: float, dim: int) -> np.ndarray:
  return (1.0 / (base ** (np.arange(0, dim, 2).astype(np.float32) / dim))).astype(np.float32)


def _llama3(inv_freq: np.ndarray, rp: dict, original: int) -> np.ndarray:
  """Llama 3.1: long wavelengths divided by ``factor``, short ones kept, a smooth blend between."""
  factor, low, high = float(rp["factor"]), float(rp["low_freq_factor"]), rp["high_freq_factor"]
  high = float(high)
  low_freq_wavelen, high_freq_wavelen = original / low, original / high
  wavelen = 2 * math.pi / inv_freq
  scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
  smooth = (original / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def _yarn(base: float, dim: int, rp: dict, config: dict, original: int):
  """YaRN: interpolated low frequencies, extrapolated high ones, a linear ramp between, and an
  attention factor on cos and sin."""
  factor = rp.get("factor")
  if factor is None:
    factor = config["max_position_embeddings"] / original
  factor = float(factor)
  attention_factor = rp.get("attention_factor")
  if attention_factor is None:
    mscale, mscale_all_dim = rp.get("mscale"), rp.get("mscale_all_dim")
    if mscale and mscale_all_dim:
      attention_factor = _mscale(factor, mscale) / _mscale(factor, mscale_all_dim)
    else:
      attention_factor = _mscale(factor)
  beta_fast, beta_slow = rp.get("beta_fast") or 32, rp.get("beta_slow") or 1

  def correction_dim(rotations):
    return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

  low, high = correction_dim(beta_fast), correction_dim(beta_slow)
  if rp.get("truncate", True):
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, dim - 1)
  if low == high:
    high += 0.001  # transformers' guard against a zero-width ramp
  ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
  extrapolation = (1 - ramp).astype(np.float32)
  pos_freqs = (base ** (np.arange(0, dim, 2).astype(np.float32) / dim)).astype(np.float32)
  inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
  return inv_freq.astype(np.float32), float(attention_factor)


def _mscale(scale: float, mscale: float = 1.0) -> float:
  return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
