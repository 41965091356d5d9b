"""task=generate: speculative generation on the configured prompts; prints text and metrics.

With ``config.mesh`` (data x tensor, placement.py) the target and drafter are split over the
devices; with ``config.distributed`` several processes (one per host) join one run, each
holding its devices' share, and each prints the rows its devices computed (and writes them to
``output_dir/rows.process<i>.jsonl`` when ``output_dir`` is set).
"""

import json
import os

import jax
import ml_collections
from tqdm.auto import tqdm

from specjax import build, metrics, parallel, profiling, results
from specjax.decode import generate


def run(config: ml_collections.ConfigDict) -> dict:
  parallel.initialize(build.distributed(config))
  build.check(config)
  profiling.check(config)
  target = build.target(config, build.mesh(config))  # an HF directory loads onto it
  drafter, dparams = build.drafter(config, target)
  req = build.request(config, target, drafter)
  batches = req.batches()
  mesh, tparams, dparams = build.placed(config, target, drafter, dparams)
  tqdm.write(
    f"compiling {drafter.name} decoding ({target.cfg.name}, batch {req.batch_size}, max_len "
    f"{req.max_len}); the first batch includes it"
  )

  def call(batch):
    return generate(
      tparams,
      target.cfg,
      batch,
      drafter=drafter,
      drafter_params=dparams,
      verifier=build.verifier(config),
      mesh=mesh,
      **req.generate_kwargs(),
    )

  outs = [call(b) for b in tqdm(batches, desc="generate", unit="batch", disable=len(batches) < 2)]
  profiling.decode(config, call, batches[0])
  mine = []  # (prompt index, new tokens) of the rows this process computed
  for b, out in enumerate(outs):
    local = range(len(out.tokens)) if out.local_rows is None else out.local_rows
    mine += [(b * req.batch_size + r, out.tokens[r]) for r in local]
  mine = [(i, row) for i, row in mine if i < len(req.prompts)]  # not the batch's cycled fill
  for i, row in mine:
    if target.tokenizer is None:
      print(f"[{i}] prompt ids {req.prompts[i]}\n    -> {row}")
    else:
      print(f"[{i}] {req.prompt_texts[i]!r}\n    -> {target.tokenizer.decode(row)!r}")
  if config.get("output_dir") and mesh is not None:
    _write_rows(config.output_dir, mine)
  m = metrics.summarize(metrics.merge([o.counts for o in outs]))
  print(
    f"tokens {m['tokens']}  target calls {m['target_calls']}  tau {m['tau']:.3f}  "
    f"alpha {[round(a, 3) for a in m['alpha']]}"
  )
  return m


def _write_rows(output_dir: str, rows: list) -> None:
  """This process's rows as JSON lines, written to a temp file and renamed."""
  path = os.path.join(output_dir, f"rows.process{jax.process_index()}.jsonl")
  results.write_text(path, "".join(json.dumps({"row": i, "tokens": t}) + "\n" for i, t in rows))
