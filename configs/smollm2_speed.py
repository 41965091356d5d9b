"""How close specjax's autoregressive loop runs to this machine's memory floor, vs HF.

    pip install -e '.[oracle]' && bash scripts/install_models.sh smollm2 && \
        python -m specjax.run --config=configs/smollm2_speed.py

SmolLM2-135M-Instruct, fp32, batch 1, greedy, 128 new tokens on each of four prompts (no EOS
stop, so every run makes the same tokens). Prints specjax AR tokens/s, HF transformers
``generate`` tokens/s on the same prompts and weights, the bandwidth floor (fp32 weight bytes /
streaming bandwidth, both measured in this run) and the ratios; writes
results/smollm2_speed/benchmark.json.
"""

from configs import demo


def get_config():
  c = demo.base()
  c.output_dir = "results/smollm2_speed"
  c.prompts = (
    "Write a short story about a lighthouse keeper.",
    "Explain how a hash map works.",
    "def quicksort(xs):",
    "List five facts about the Moon.",
  )
  c.stop_at_eos = False
  c.max_new_tokens = 128
  c.max_len = 256
  c.benchmark.repeats = 2
  c.benchmark.bandwidth_floor = True
  c.benchmark.hf_baseline = True
  return c
