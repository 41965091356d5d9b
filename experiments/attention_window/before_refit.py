"""The same measurement with the code from before attention windows (commit 47cc7fc).

That code has no task=max_len, so this times AR and prompt lookup (K = 4) on the demo prompts
(96 new tokens, batch 1, greedy, stop ids) at max_len 256, 1024 and 4096 itself: every mode
compiled first, then three interleaved passes, the median kept. Run it against a checkout of
that commit, from this repository's root:

    git worktree add /tmp/before 47cc7fc
    python -c "import json; from configs import demo; \
      print(json.dumps(list(demo.base().prompts)))" > /tmp/prompts.json
    PYTHONPATH=/tmp/before python experiments/attention_window/before_refit.py /tmp/prompts.json \
      experiments/attention_window/results/before_refit.json
"""

import json
import statistics
import sys
import time

from specjax.decode import generate
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.models import registry


def main(prompts_path, out_path):
  cfg, params, tok = registry.load("smollm2-135m-instruct")
  chat = lambda t: tok.encode(tok.apply_chat_template([{"role": "user", "content": t}]))
  with open(prompts_path) as f:
    prompts = [chat(t) for t in json.load(f)]
  kw = dict(max_new_tokens=96, eos_id=sorted(tok.stop_ids))
  modes = {}
  for size in (256, 1024, 4096):
    modes[f"ar@{size}"] = lambda p, n=size: generate(params, cfg, [p], max_len=n, **kw)
    modes[f"prompt_lookup@{size}"] = lambda p, n=size: generate(
      params, cfg, [p], drafter=PromptLookup(4), max_len=n, **kw
    )
  for fn in modes.values():
    for p in prompts:
      fn(p)
  times, tokens = {m: [] for m in modes}, {}
  for _ in range(3):
    for m, fn in modes.items():
      t0 = time.perf_counter()
      outs = [fn(p) for p in prompts]
      times[m].append(time.perf_counter() - t0)
      tokens[m] = sum(o.metrics["tokens"] for o in outs)
  record = {
    m: {
      "tokens": tokens[m],
      "steady_s": statistics.median(t),
      "tokens_per_s": tokens[m] / statistics.median(t),
    }
    for m, t in times.items()
  }
  with open(out_path, "w") as f:
    json.dump(record, f, indent=1)
  for m, r in record.items():
    print(m, r)


if __name__ == "__main__":
  main(*sys.argv[1:3])
