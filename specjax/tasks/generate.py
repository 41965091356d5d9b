"""task=generate: speculative generation on the configured prompts; prints text and metrics."""

import ml_collections
from tqdm.auto import tqdm

from specjax import build, metrics
from specjax.decode import generate


def run(config: ml_collections.ConfigDict) -> dict:
  build.check(config)
  target = build.target(config)
  drafter, dparams = build.drafter(config, target)
  req = build.request(config, target)
  batches = req.batches()
  tqdm.write(
    f"compiling {drafter.name} decoding ({target.cfg.name}, batch {req.batch_size}, max_len "
    f"{req.max_len}); the first batch includes it"
  )
  outs = [
    generate(
      target.params,
      target.cfg,
      batch,
      drafter=drafter,
      drafter_params=dparams,
      verifier=build.verifier(config),
      **req.generate_kwargs(),
    )
    for batch in tqdm(batches, desc="generate", unit="batch", disable=len(batches) < 2)
  ]
  rows = [row for out in outs for row in out.tokens]
  for i, (prompt, row) in enumerate(zip(req.prompts, rows, strict=False)):
    if target.tokenizer is None:
      print(f"[{i}] prompt ids {prompt}\n    -> {row}")
    else:
      print(f"[{i}] {req.prompt_texts[i]!r}\n    -> {target.tokenizer.decode(row)!r}")
  m = metrics.summarize(metrics.merge([o.counts for o in outs]))
  print(
    f"tokens {m['tokens']}  target calls {m['target_calls']}  tau {m['tau']:.3f}  "
    f"alpha {[round(a, 3) for a in m['alpha']]}"
  )
  return m
