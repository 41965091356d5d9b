"""The machine a record was measured on: every task's JSON carries it beside its timings."""

import platform
from pathlib import Path

import jax

# CPU flags that decide which dtype a CPU decodes faster in (bfloat16 instructions or not).
DTYPE_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8")


def cpu() -> dict:
  """The CPU's model name and its dtype-relevant flags (``/proc/cpuinfo``; empty elsewhere)."""
  try:
    lines = Path("/proc/cpuinfo").read_text().splitlines()
  except OSError:
    return {"model": platform.processor() or platform.machine(), "flags": []}
  field = lambda key: next((ln.split(":", 1)[1].strip() for ln in lines  # noqa: E731
                            if ln.startswith(key)), "")  # fmt: skip
  flags = set(field("flags").split())
  return {"model": field("model name"), "flags": [f for f in DTYPE_FLAGS if f in flags]}


def machine() -> dict:
  """Platform, device, counts and versions, and the CPU's model and dtype flags."""
  dev = jax.devices()[0]
  return {
    "platform": dev.platform,
    "device": str(dev.device_kind),
    "devices": jax.device_count(),
    "jax": jax.__version__,
    "python": platform.python_version(),
    "processor": platform.processor() or platform.machine(),
    "cpu": cpu(),
  }
