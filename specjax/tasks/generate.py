"""task=generate: speculative generation on the configured prompts; prints text and metrics."""

import ml_collections

from specjax import build
from specjax.decode import generate


def run(config: ml_collections.ConfigDict) -> dict:
  build.check(config)
  target = build.target(config)
  drafter, dparams = build.drafter(config, target)
  req = build.request(config, target)
  out = generate(
      target.params, target.cfg, req.prompts, drafter=drafter, drafter_params=dparams,
      max_new_tokens=req.max_new_tokens, max_len=req.max_len, temperature=req.temperature,
      top_k=req.top_k, top_p=req.top_p, seed=req.seed, eos_id=req.eos_id,
  )
  for i, (prompt, row) in enumerate(zip(req.prompts, out.tokens, strict=True)):
    if target.tokenizer is None:
      print(f"[{i}] prompt ids {prompt}\n    -> {row}")
    else:
      print(f"[{i}] {req.prompt_texts[i]!r}\n    -> {target.tokenizer.decode(row)!r}")
  m = out.metrics
  print(f"tokens {m['tokens']}  target calls {m['target_calls']}  tau {m['tau']:.3f}  "
        f"alpha {[round(a, 3) for a in m['alpha']]}")
  return m
