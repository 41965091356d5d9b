"""The ground truth of the exactness checks: a target's enumerated distribution over short
continuations, and a chi-square test of sampled rows against it.

Used by the exact-distribution tests (through the test helpers) and by
``experiments/losslessness``.
"""

import itertools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax import sampling
from specjax.models import llama


def sequence_distribution(
  params, cfg, prompt, num_new: int, sp: sampling.SamplingParams, stop_ids: Sequence[int] = ()
) -> dict[tuple[int, ...], float]:
  """The target's probability of every row ``generate`` can return for ``prompt``.

  A row is ``num_new`` tokens, or fewer ending at its first stop token (the stop token
  included). Computed by enumerating every continuation with full forwards (no cache) and
  the same ``sampling.probs``: the ground truth the decode loop must reproduce.
  """
  v = cfg.vocab_size
  conts = np.asarray(list(itertools.product(range(v), repeat=num_new)), np.int32)
  seqs = np.concatenate([np.tile(np.asarray(prompt, np.int32), (len(conts), 1)), conts], axis=1)
  logits, _ = jax.jit(llama.logits_of, static_argnums=1)(params, cfg, jnp.asarray(seqs))
  p = np.asarray(sampling.probs(logits, sp))  # [n, t, V]
  lp, out = len(prompt), {}
  for r, cont in enumerate(conts.tolist()):
    stops = [i for i, x in enumerate(cont) if x in stop_ids]
    row = tuple(cont[: stops[0] + 1] if stops else cont)
    if row not in out:
      out[row] = float(np.prod([p[r, lp - 1 + i, x] for i, x in enumerate(row)]))
  return out


def chi2_pvalue(rows: Sequence[Sequence[int]], dist: dict[tuple[int, ...], float]) -> float:
  """Chi-square p-value of sampled ``rows`` against ``dist`` (cells expected < 5 pooled).

  Raises ValueError if a row the target cannot produce was sampled (no sampler that is
  exact can)."""
  from scipy import stats

  index = {row: i for i, row in enumerate(dist)}
  counts = np.zeros(len(dist))
  for row in rows:
    row = tuple(row)
    if dist.get(row, 0.0) <= 0:
      raise ValueError(f"sampled {row}, which the target gives probability 0")
    counts[index[row]] += 1
  expected = np.asarray(list(dist.values())) * len(rows)
  small = expected < 5
  obs = np.append(counts[~small], counts[small].sum())
  exp = np.append(expected[~small], expected[small].sum())
  keep = exp > 0
  return float(stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue)
