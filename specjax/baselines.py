"""Reference points for benchmarks: this machine's memory bandwidth and HF transformers.

Autoregressive decoding at batch 1 reads every weight once per token, so
``weight bytes / streaming bandwidth`` is the floor on time per token. Both baselines are
measured in the benchmark's own process, so ratios to them are like for like.
"""

import time

import numpy as np


def streaming_bandwidth_gbs(megabytes: int = 512, repeats: int = 5) -> float:
  """Best-of-N fp32 matrix-vector bandwidth (numpy/BLAS), in GB/s."""
  rows = megabytes * (1 << 20) // (4 * 4096)
  w = np.random.default_rng(0).standard_normal((rows, 4096), dtype=np.float32)
  x = np.ones(4096, np.float32)
  w @ x  # warm up
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    w @ x
    best = min(best, time.perf_counter() - t0)
  return w.nbytes / best / 1e9


def hf_tokens_per_s(
  gguf_path, prompts: list[list[int]], max_new_tokens: int, repeats: int = 1
) -> dict:
  """HF transformers greedy ``generate`` on the same GGUF (dequantized to fp32), batch 1.

  Each prompt is generated ``1 + repeats`` times (the first warms up); returns tokens/s over
  the timed runs. Raises ImportError where torch/transformers are absent.
  """
  from pathlib import Path

  import torch
  import transformers

  path = Path(gguf_path)
  model = transformers.AutoModelForCausalLM.from_pretrained(
    path.parent, gguf_file=path.name, torch_dtype=torch.float32
  ).eval()
  tokens, seconds = 0, 0.0
  with torch.inference_mode():
    for ids in prompts:
      x = torch.tensor([ids])
      kw = dict(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False)
      model.generate(x, **kw)
      for _ in range(repeats):
        t0 = time.perf_counter()
        out = model.generate(x, **kw)
        seconds += time.perf_counter() - t0
        tokens += out.shape[1] - len(ids)
  return {
    "tokens": tokens,
    "seconds": seconds,
    "tokens_per_s": tokens / seconds,
    "torch": torch.__version__,
    "transformers": transformers.__version__,
    "threads": torch.get_num_threads(),
  }
