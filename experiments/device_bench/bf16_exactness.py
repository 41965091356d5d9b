"""Greedy speculative output against AR's in bfloat16 on this device, at one forward shape or not.

    python experiments/device_bench/bf16_exactness.py [--out DIR/bf16_exactness.json]

On an accelerator ``dtype = auto`` is bfloat16, so this is the dtype a GPU or TPU user decodes
in. A random target (tiny.random_model, 4 layers, dim 512, 2,048-token vocabulary, peaked
next-token distributions) decodes 8 ragged prompts, 48 greedy tokens each, with AR and with
five drafters: the target itself as a draft model (K = 4; every node is accepted, so every
verify row counts), a one-layer draft-model chain (K = 4), a prompt-lookup chain (K = 4), a
random EAGLE tree (top-k 4, depth 4, 16 nodes) and random Medusa heads (tree (3, 2, 2)). For
float32 and bfloat16, each with ``forward_rows`` 0 (every forward at its own row count) and 32
(every forward after the prefill at 32 rows), it counts the rows whose tokens equal AR's at the same
dtype and ``forward_rows``, and the first position where each differing row departs. AR at
``forward_rows`` 32 is also compared with AR at 0 (the shape alone changes the bfloat16 text).
The random drafters accept little: what is measured is the verify's rows against AR's steps,
not τ.
"""

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from specjax import decode, results, testing
from specjax.drafters import DraftModel, PromptLookup
from specjax.models import llama, tiny
from specjax.trees import Tree

ROWS = 32  # forward_rows for the one-shape runs: at least every drafter's rows per step
NEW = 48


def _prompts(vocab: int) -> list[list[int]]:
  rng = np.random.default_rng(0)
  out = []
  for i in range(8):
    base = rng.integers(1, vocab, size=3 + 2 * i).tolist()
    out.append(base + base[: 2 + i])  # a repeat for prompt lookup to find
  return out


def _first_difference(a: list[int], b: list[int]) -> int:
  same = [x == y for x, y in zip(a, b, strict=False)]
  return same.index(False) if False in same else len(same)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", default="results/device_bench/bf16_exactness.json")
  args = parser.parse_args()
  cfg, params = tiny.random_model(
    seed=0, vocab_size=2048, dim=512, num_layers=4, num_heads=8, num_kv_heads=2,
    ffn_dim=1536, residual_scale=0.3, logit_std=4.0,
  )  # fmt: skip
  prompts = _prompts(cfg.vocab_size)
  dcfg, dparams = tiny.truncated(cfg, params, 1)
  eagle, eparams = testing.eagle_drafter((cfg, params), top_k=4, depth=4, total=16, sampled=False)
  medusa, mparams = testing.medusa_drafter(cfg, Tree.from_spec((3, 2, 2)), 3, sampled=False)
  drafters = {
    "self_draft_chain": (DraftModel(cfg, 4), params),  # the target drafts: every node accepted
    "draft_model_chain": (DraftModel(dcfg, 4), dparams),
    "prompt_lookup_chain": (PromptLookup(4, min_ngram=1), None),
    "eagle_tree_16": (eagle, eparams),
    "medusa_tree_322": (medusa, mparams),
  }
  device = jax.devices()[0]
  record = {"device": f"{device.platform} {device.device_kind}", "jax": jax.__version__,
            "new_tokens": NEW, "prompts": len(prompts), "runs": []}  # fmt: skip
  for dtype in ("float32", "bfloat16"):
    tparams = llama.cast(params, jnp.dtype(dtype))
    ar_at = {}
    for rows in (0, ROWS):
      kw = dict(max_new_tokens=NEW, max_len=128, forward_rows=rows)
      t0 = time.perf_counter()
      ar = decode.generate(tparams, cfg, prompts, **kw).tokens
      ar_at[rows] = ar
      print(f"{dtype} forward_rows={rows} AR: {time.perf_counter() - t0:.1f} s", flush=True)
      for name, (drafter, dp) in drafters.items():
        dp = llama.cast(dp, jnp.dtype(dtype)) if isinstance(drafter, DraftModel) else dp
        t0 = time.perf_counter()
        out = decode.generate(tparams, cfg, prompts, drafter=drafter, drafter_params=dp, **kw)
        equal = [a == b for a, b in zip(out.tokens, ar, strict=True)]
        departs = [_first_difference(a, b) for a, b in zip(out.tokens, ar, strict=True)
                   if a != b]  # fmt: skip
        run = {"dtype": dtype, "forward_rows": rows, "drafter": name,
               "rows_equal_to_ar": int(sum(equal)), "rows": len(equal),
               "first_difference_at": departs, "tau": round(float(out.metrics["tau"]), 3),
               "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
        record["runs"].append(run)
        print(json.dumps(run), flush=True)
    same = sum(a == b for a, b in zip(ar_at[0], ar_at[ROWS], strict=True))
    record[f"{dtype}_ar_rows_equal_across_forward_rows"] = int(same)
    print(f"{dtype}: AR at forward_rows={ROWS} equals AR at 0 in {same}/{len(prompts)} rows")
  print(f"wrote {results.write_json(args.out, record)}")


if __name__ == "__main__":
  main()
