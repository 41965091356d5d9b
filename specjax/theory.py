"""Leviathan et al. (2023) in closed form: expected tokens per step, speedup, the best K.

With a draft whose tokens are accepted independently with probability ``alpha`` (the
expectation of 1 - TV(p, q) over positions), a chain of K drafts yields

    E[tokens per step] = (1 - alpha^(K+1)) / (1 - alpha)                       (their eq. 1)

target calls, and with a draft step costing ``c`` target steps the walltime improvement is

    speedup = (1 - alpha^(K+1)) / ((1 - alpha) (K c + 1))                      (their Thm. 3.8)

which assumes verifying K + 1 tokens costs one target step. ``speedup_with_verify_cost``
replaces that 1 by a measured ``v(K + 1)`` (one forward over K + 1 tokens / one over 1): on a
CPU it is 1.7-2.5, which is why the formula's optimum is far from the measured one there.
"""

import math
from collections.abc import Callable

import numpy as np


def expected_tokens(alpha: float, k: int) -> float:
  """Tokens one target call yields with K drafts accepted i.i.d. with probability alpha."""
  if not 0 <= alpha <= 1:
    raise ValueError(f"alpha must be in [0, 1], got {alpha}.")
  if alpha == 1:
    return k + 1.0
  return (1 - alpha ** (k + 1)) / (1 - alpha)


def speedup(alpha: float, k: int, c: float) -> float:
  """Leviathan et al.'s improvement factor: verify costs one target step, a draft step c."""
  return expected_tokens(alpha, k) / (k * c + 1)


def speedup_with_verify_cost(alpha: float, k: int, c: float, verify: Callable[[int], float]):
  """The same with verify cost ``verify(T)`` for T = K + 1 tokens, in target steps."""
  return expected_tokens(alpha, k) / (k * c + verify(k + 1))


def optimal_k(alpha: float, c: float, k_max: int = 64, verify=None) -> int:
  """The K in [1, k_max] with the largest speedup (ties: the smaller K)."""
  f = (lambda k: speedup(alpha, k, c)) if verify is None else (
    lambda k: speedup_with_verify_cost(alpha, k, c, verify)
  )  # fmt: skip
  return max(range(1, k_max + 1), key=lambda k: (f(k), -k))


def rule_of_thumb_k(alpha: float, c: float) -> int:
  """K* ~ sqrt(alpha / c), rounded, at least 1: the rule checked against ``optimal_k``."""
  return max(1, round(math.sqrt(alpha / max(c, 1e-9))))


def alpha_from_tau(tau: float, k: int) -> float:
  """The i.i.d. acceptance rate that gives ``tau`` tokens per step with K drafts (bisection)."""
  if not 1 <= tau <= k + 1:
    raise ValueError(f"tau={tau} must be in [1, K + 1 = {k + 1}].")
  lo, hi = 0.0, 1.0
  for _ in range(60):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if expected_tokens(mid, k) < tau else (lo, mid)
  return (lo + hi) / 2


def interpolate(points: dict[int, float]) -> Callable[[int], float]:
  """A verify-cost curve from measured ``{tokens: cost}`` points (linear between them)."""
  xs = sorted(points)
  ys = [points[x] for x in xs]
  return lambda t: float(np.interp(t, xs, ys))
