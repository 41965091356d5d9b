"""Random tiny target and a truncated-copy draft: every task runs in seconds on a CPU.

    python -m specjax.run --config=configs/tiny.py
    python -m specjax.run --config=configs/tiny.py --config.task=benchmark
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m specjax.run \
      --config=configs/tiny.py --config.mesh.data=4 --config.mesh.tensor=2

Prints each prompt's token ids and the generated ids, then tokens, target calls, tau and
per-position acceptance alpha; benchmark also prints AR vs speculative tokens/s and writes
results/tiny/benchmark.json. Greedy (temperature 0) outputs are identical in both modes.
"""

from ml_collections import config_dict

from specjax import drafters


def get_config():
  c = config_dict.ConfigDict()
  c.task = "generate"  # generate | benchmark
  c.output_dir = "results/tiny"  # where benchmark.json goes
  # A directory: a trace of warmed decode (or profile_steps train) steps, for TensorBoard's
  # profile plugin or XProf (specjax/profiling.py); "" = none.
  c.profile = ""
  c.profile_steps = 3

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

  # The drafter by name, and one subsection per drafter (specjax/drafters/__init__.py).
  c.drafter = drafters.default_config("draft_model")  # none|draft_model|prompt_lookup|lookahead
  c.drafter.draft_model.num_draft = 4  # K: draft tokens per step
  c.drafter.draft_model.source = "truncate"  # the target's first num_layers layers | model
  c.drafter.draft_model.num_layers = 1  # layers kept when source = truncate
  c.drafter.draft_model.model = c.target.copy_and_resolve_references()  # when source = model
  c.drafter.draft_model.model.name = "tiny-draft"
  c.drafter.draft_model.model.seed = 1
  c.drafter.draft_model.model.num_layers = 1

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
  # > 0: every target forward after the prefill at this many rows, so that a token rounds alike
  # as an AR step or among a verify's rows (bfloat16 greedy = AR's; decode.generate). auto: the
  # drafter's rows per step for a greedy speculative run in bfloat16 on a CPU, else 0.
  c.forward_rows = config_dict.FieldReference("auto", field_type=object)

  # Decoding on several devices (specjax/placement.py): rows over data, weights and KV heads
  # over tensor; -1 = the devices the other axis leaves. 1 x 1 = one device.
  c.mesh = config_dict.ConfigDict()
  c.mesh.data = 1
  c.mesh.fsdp = 1  # decoding keeps it at 1 (weights are split over tensor only)
  c.mesh.tensor = 1
  # weights and caches: auto = bfloat16 on GPU/TPU; on a CPU the dtype its forwards run faster
  # in, timed once per machine and model (specjax/precision.py; $SPECJAX_CPU_DTYPE pins it)
  c.dtype = "auto"
  c.device_memory_gib = 0.0  # per-device limit; 0 = the device's own (a CPU: host / devices)
  c.distributed = config_dict.ConfigDict()  # several processes, as in configs/train_tiny.py
  c.distributed.coordinator_address = ""
  c.distributed.num_processes = 1
  c.distributed.process_id = 0
  c.distributed.heartbeat_timeout_s = 60  # a silent peer is declared dead after this
  c.distributed.initialization_timeout_s = 300

  c.benchmark = config_dict.ConfigDict()
  c.benchmark.repeats = 3  # timed runs after the compiling one; the median is reported
  c.benchmark.bandwidth_floor = False  # measure memory bandwidth: the AR floor, as a ratio
  c.benchmark.hf_baseline = False  # time HF transformers generate too (registry target, B=1)
  return c
