"""Random tiny target and a truncated-copy draft: every task runs in seconds on a CPU.

    python -m specjax.run --config=configs/tiny.py
    python -m specjax.run --config=configs/tiny.py --config.task=benchmark

Prints each prompt's token ids and the generated ids, then tokens, target calls, tau and
per-position acceptance alpha; benchmark also prints AR vs speculative tokens/s and writes
results/tiny/benchmark.json. Greedy (temperature 0) outputs are identical in both modes.
"""

from ml_collections import config_dict


def get_config():
  c = config_dict.ConfigDict()
  c.task = "generate"  # generate | benchmark
  c.output_dir = "results/tiny"  # where benchmark.json goes

  c.target = config_dict.ConfigDict()
  c.target.source = "random"  # random | registry | gguf | safetensors (see specjax/build.py)
  c.target.name = "tiny-target"
  c.target.seed = 0  # weight seed
  c.target.vocab_size = 512
  c.target.dim = 256
  c.target.num_layers = 8
  c.target.num_heads = 8
  c.target.num_kv_heads = 2
  c.target.ffn_dim = 1024
  c.target.logit_std = 4.0  # spread of the output logits
  c.target.residual_scale = 0.1  # < 1: later layers perturb the stream, so truncations agree

  c.drafter = config_dict.ConfigDict()
  c.drafter.name = "draft_model"  # none | draft_model | prompt_lookup | lookahead
  c.drafter.num_draft = 4  # K: draft tokens per step
  c.drafter.source = "truncate"  # truncate: the target's first num_layers layers | model
  c.drafter.num_layers = 1  # layers kept when source = truncate
  c.drafter.model = c.target.copy_and_resolve_references()  # used when source = model
  c.drafter.model.name = "tiny-draft"
  c.drafter.model.seed = 1
  c.drafter.model.num_layers = 1
  c.drafter.max_ngram = 3  # prompt_lookup: longest suffix n-gram searched for
  c.drafter.min_ngram = 1  # prompt_lookup: shortest
  c.drafter.num_branches = 1  # prompt_lookup: > 1 = a tree of the best distinct matches
  c.drafter.abstain = True  # prompt_lookup: no match -> a one-token step instead of a guess
  c.drafter.lookahead = config_dict.ConfigDict()
  c.drafter.lookahead.window = 5  # W: Jacobi window columns
  c.drafter.lookahead.ngram = 4  # N: n-gram size (window levels = N - 1; draft depth N - 1)
  c.drafter.lookahead.num_candidates = 5  # G: pool n-grams verified per step
  c.drafter.lookahead.pool_size = 256  # n-grams kept per row
  c.drafter.max_depth = 16  # budget: most draft tokens one step may accept
  c.drafter.max_nodes = 64  # budget: most draft + extra tokens fed to the target per step

  c.verifier = "rejection"  # rejection (lossless) | typical (Medusa's, lossy)
  c.typical = config_dict.ConfigDict()
  c.typical.epsilon = 0.09  # typical acceptance: hard probability bar
  c.typical.delta = 0.3  # typical acceptance: entropy-scaled bar

  c.prompts = ()  # token-id lists; empty = batch_size random prompts (seeded)
  c.chat = False  # (models with a tokenizer) wrap each prompt in the chat template
  c.stop_at_eos = False  # (models with a tokenizer) stop a row at the tokenizer's end ids
  c.batch_size = 4
  c.max_new_tokens = 64  # per row
  c.max_len = 128  # prompt + new tokens, per row; fixes the compiled shapes
  c.temperature = 0.0  # 0 = greedy
  c.top_k = 0  # 0 = off
  c.top_p = 1.0  # 1 = off
  c.seed = 0  # sampling and prompt seed

  c.benchmark = config_dict.ConfigDict()
  c.benchmark.repeats = 3  # timed runs after the compiling one; the median is reported
  c.benchmark.bandwidth_floor = False  # measure memory bandwidth: the AR floor, as a ratio
  c.benchmark.hf_baseline = False  # time HF transformers generate too (registry target, B=1)
  return c
