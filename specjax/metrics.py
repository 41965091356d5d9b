"""Decode metrics: counters carried by the loop, and what researchers report from them.

The loop carries raw counts (``Metrics``); ``counts`` brings them to the host, ``merge`` adds
the counts of several runs, and ``summarize`` derives tau, alpha_i and friends. Derived values
are only ever computed from summed counts, never averaged across runs.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


@struct.dataclass
class Metrics:
  target_calls: jax.Array  # [] batched target forwards, prefill included.
  draft_calls: jax.Array  # [] batched draft forwards.
  row_calls: jax.Array  # [B] target forwards in which the row was still generating.
  accept_hist: jax.Array  # [K+1] how often a row accepted n draft tokens.
  attempts: jax.Array  # [K] how often draft position i was verified (n >= i).
  accepts: jax.Array  # [K] how often draft position i was accepted (n > i).
  overlap: jax.Array  # [K] sum of 1 - TV(p_i, q_i) over the verified positions.
  abstained: jax.Array  # [] steps where every live row's drafter abstained (1-token forward).
  row_abstained: jax.Array  # [B] steps in which the row was live and its drafter abstained.

  @classmethod
  def zeros(cls, batch: int, k: int):
    i32 = lambda *s: jnp.zeros(s, jnp.int32)
    overlap = jnp.zeros((k,), jnp.float32)
    return cls(i32(), i32(), i32(batch), i32(k + 1), i32(k), i32(k), overlap, i32(), i32(batch))


def counts(m: Metrics, num_new_B) -> dict[str, np.ndarray]:
  """Host-side raw counts of one run (``num_new_B``: tokens generated per row)."""
  out = {k: np.asarray(getattr(m, k)) for k in Metrics.__dataclass_fields__}
  out["tokens"] = np.asarray(num_new_B)
  return out


def merge(runs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """Adds the counts of several runs; per-row arrays are concatenated."""
  per_row = ("row_calls", "row_abstained", "tokens")
  return {
    k: np.concatenate([r[k] for r in runs]) if k in per_row else sum(r[k] for r in runs)
    for k in runs[0]
  }


def summarize(c: dict[str, np.ndarray]) -> dict:
  """The metrics every run reports, as plain Python numbers."""
  tokens, row_calls = int(c["tokens"].sum()), int(c["row_calls"].sum())
  attempts = np.maximum(c["attempts"], 1)
  return {
    "tokens": tokens,
    "tokens_per_row": c["tokens"].tolist(),
    "target_calls": int(c["target_calls"]),
    "draft_calls": int(c["draft_calls"]),
    "row_target_calls": row_calls,
    "row_calls": c["row_calls"].tolist(),
    "tau": tokens / max(row_calls, 1),
    "target_calls_per_token": row_calls / max(tokens, 1),
    "accept_hist": c["accept_hist"].tolist(),
    "alpha": (c["accepts"] / attempts).tolist(),
    # 1 - TV(p, q) per chain position; trees (and one-hot drafts that never overlap) have none.
    "alpha_analytic": (c["overlap"] / attempts).tolist() if c["overlap"].any() else None,
    "position_attempts": c["attempts"].tolist(),
    "abstained_calls": int(c["abstained"]),
    "row_abstained": c["row_abstained"].tolist(),  # per row: steps its drafter abstained
  }
