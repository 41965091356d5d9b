"""task=max_len: the same prompts decoded with caches sized for several ``max_len``, in one process.

    python -m specjax.run --config=experiments/attention_window/config.py

Attention reads a window that follows the rows' live length (``models/llama.py``), not the
whole cache, so a short prompt should decode about as fast with ``max_len`` 4096 as with 256.
For every value in ``max_len_sweep.sizes`` the target runs autoregressively and with the
configured drafter (``drafter.name``, unless ``none``) on the same prompts; every mode and
size is compiled first, then the timed passes interleave. Prints tokens/s per size and mode,
relative to the smallest size, checks that the greedy texts agree across sizes, and writes
``max_len.json``.
"""

import copy

import ml_collections

from specjax import build, metrics, results
from specjax.decode import generate
from specjax.measure import timing
from specjax.measure.machine import machine

COLUMNS = ("mode", "max_len", "tokens", "tau", "steady_s", "tokens_per_s", "vs_smallest")


def run(config: ml_collections.ConfigDict) -> dict:
  sizes = config.max_len_sweep.sizes
  sizes = tuple(sizes) if isinstance(sizes, (tuple, list)) else (sizes,)
  if not sizes or any(isinstance(v, bool) or not isinstance(v, int) or v < 2 for v in sizes):
    raise ValueError(f"config.max_len_sweep.sizes must be integers >= 2, got {sizes}.")
  if twice := [v for i, v in enumerate(sizes) if v in sizes[:i]]:
    raise ValueError(f"config.max_len_sweep.sizes={sizes} lists {twice[0]} twice: list each once.")
  for size in sizes:
    c = copy.deepcopy(config)
    with c.unlocked():
      c.max_len = size
    build.check(c)
  target = build.target(config)
  drafter, dparams = build.drafter(config, target)
  req = build.request(config, target)
  verifier = build.verifier(config)
  modes = {}
  for size in sizes:
    kw = req.generate_kwargs() | {"max_len": size}
    modes[f"ar@{size}"] = lambda b, kw=kw: generate(target.params, target.cfg, b, **kw)
    if drafter.name != "none":
      modes[f"{drafter.name}@{size}"] = lambda b, kw=kw: generate(
        target.params, target.cfg, b, drafter=drafter, drafter_params=dparams, verifier=verifier,
        **kw,
      )  # fmt: skip
  describe = f"{target.cfg.name}, batch {req.batch_size}"
  timed = timing.run_modes(modes, req.batches(), config.benchmark.repeats, describe)

  record = {"config": config.to_dict(), "machine": machine(), "runs": []}
  texts = {}
  for name, t in timed.items():
    mode, size = name.rsplit("@", 1)
    outs = t.pop("outs")
    texts[name] = [row for out in outs for row in out.tokens]
    m = metrics.summarize(metrics.merge([out.counts for out in outs]))
    run_ = {"mode": mode, "max_len": int(size)} | m | t
    run_["tokens_per_s"] = m["tokens"] / t["steady_s"]
    record["runs"].append(run_)
  for run_ in record["runs"]:
    base = next(r for r in record["runs"] if r["mode"] == run_["mode"])
    run_["vs_smallest"] = run_["tokens_per_s"] / base["tokens_per_s"]
  if req.temperature == 0:
    record["greedy_texts_identical"] = len({str(v) for v in texts.values()}) == 1
  print(results.table(record["runs"], COLUMNS))
  if "greedy_texts_identical" in record:
    print(f"greedy texts identical across sizes and modes: {record['greedy_texts_identical']}")
  print(f"wrote {results.write_json(f'{config.output_dir}/max_len.json', record)}")
  return record
