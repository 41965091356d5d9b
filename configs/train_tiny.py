"""Distils a 1-layer draft from a random 4-layer tiny target: the seconds-long training demo.

    python -m specjax.run --config=configs/train_tiny.py

Samples 576 rows of 32 tokens from the target itself (temperature 1), trains the draft by
KL(target || draft) for 150 steps of 16 rows, prints the progress bar with loss and tokens/s,
writes results/train_tiny/{metrics.jsonl, checkpoints/, draft_init/, draft_final/, train.json},
then decodes with both drafts (greedy, K = 4) and prints "draft init: tau ..." and
"draft final: tau ...": the trained draft's tau is the higher. Rerunning continues from the
last checkpoint (here: nothing left to do); another ``--config.workdir`` starts over
(``--config.train.resume=False`` refuses a workdir that holds checkpoints).

Same code, other layouts (only the mesh changes):

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m specjax.run \
      --config=configs/train_tiny.py --config.mesh.fsdp=2 --config.mesh.tensor=2

Two processes on one machine (run both; each gets 2 CPU devices):

    XLA_FLAGS=--xla_force_host_platform_device_count=2 python -m specjax.run \
      --config=configs/train_tiny.py --config.distributed.num_processes=2 \
      --config.distributed.coordinator_address=127.0.0.1:12355 --config.distributed.process_id=0
    (and the same with process_id=1)
"""

from ml_collections import config_dict

from configs import tiny
from specjax.train import objectives


def get_config():
  c = tiny.get_config()  # target, drafter (K for decoding), prompts and sampling knobs
  c.task = "train"
  c.workdir = "results/train_tiny"  # checkpoints/, metrics.jsonl, exported drafts, train.json
  c.record_to = ""  # also train.json and metrics.jsonl here (an experiment's results/<variant>)
  c.target.update(
    vocab_size=256,
    dim=64,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    ffn_dim=256,
    logit_std=4.0,
    residual_scale=0.3,
  )
  c.drafter.name = "draft_model"
  c.drafter.draft_model.num_draft = 4  # K for decoding with the trained draft
  c.batch_size = 4  # decoding rows for the tau evaluation
  c.max_new_tokens = 32
  c.max_len = 64

  # What is trained: a registered objective and its subsection (specjax/train/objectives.py).
  c.objective = objectives.default_config("draft_distill")
  o = c.objective.draft_distill  # a draft model distilled by KL(target || draft)
  o.name = "tiny-draft"
  o.num_layers = 1
  o.dim = 0  # 0 = the target's (needed by embed = copy | frozen)
  o.num_heads = 4
  o.num_kv_heads = 2
  o.ffn_dim = 128
  o.head_dim = 0  # 0 = dim // num_heads
  o.embed = "copy"  # random | copy (target's embedding, trained) | frozen (not trained)
  o.temperature = 1.0  # KL at this temperature

  c.data = config_dict.ConfigDict()
  c.data.sources = ()  # corpora / self-distilled dirs; () = sample from a random target
  c.data.seq_len = 32
  c.data.max_examples = 576  # rows read (or sampled); 0 = all
  c.data.eval_examples = 64  # held out for eval
  c.data.seed = 0  # sampling / packing order
  c.data.feature_cache = ""  # a directory for the target features a feature drafter reads
  # Your own files instead of sources (docs/data.md): JSON/JSONL paths or globs, streamed.
  c.data.files = ()
  c.data.format = "sharegpt"  # sharegpt | messages (OpenAI-style) | text
  c.data.long = "split"  # a record longer than seq_len: split (several rows) | truncate
  c.data.on_error = "stop"  # a bad record: stop (names file and line) | skip (counted)

  c.train = config_dict.ConfigDict()
  c.train.steps = 150
  c.train.global_batch = 16  # rows per step, over all devices and processes
  c.train.seed = 0  # draft init and data order
  c.train.log_every = 10
  c.train.eval_every = 50
  c.train.eval_batches = 2
  c.train.checkpoint_every = 50
  c.train.keep = 2  # newest checkpoints kept
  c.train.async_checkpoint = True
  c.train.resume = True  # continue from workdir's newest checkpoint (False: refuse one)
  c.train.progress = True

  c.optim = config_dict.ConfigDict()
  c.optim.learning_rate = 3e-3
  c.optim.warmup_steps = 10
  c.optim.decay_steps = 140  # cosine after warmup; 0 = constant
  c.optim.end_lr_fraction = 0.1
  c.optim.weight_decay = 0.0
  c.optim.b1 = 0.9
  c.optim.b2 = 0.95
  c.optim.grad_clip = 1.0

  c.mesh = config_dict.ConfigDict()
  c.mesh.data = -1  # -1 = the devices the other axes leave
  c.mesh.fsdp = 1
  c.mesh.tensor = 1

  c.distributed = config_dict.ConfigDict()
  c.distributed.coordinator_address = ""  # host:port of process 0, for num_processes > 1
  c.distributed.num_processes = 1
  c.distributed.process_id = 0
  c.distributed.heartbeat_timeout_s = 60  # a silent peer is declared dead after this
  c.distributed.initialization_timeout_s = 300

  c.evaluate = config_dict.ConfigDict()
  c.evaluate.enabled = True  # decode the prompts with the untrained and the trained draft
  # Every tau_every steps (and at 0 and the end; 0 = never) the simulator replays the prompts'
  # greedy continuations through the drafter as config.drafter decodes: tau/simulated on the
  # curve, checked at the end against the decode of the same prompts (temperature 0).
  c.evaluate.tau_every = 0
  # Each temperature on the curve: 0 the simulator's greedy τ; T > 0 a sampled decode of the
  # prompts at T (tau/decoded_t1 for 1.0), at tau_every's steps too.
  c.evaluate.tau_temperatures = (0.0,)
  return c
