"""Self-distillation data for SmolLM2-135M-Instruct: its replies to prompts cut from the corpora.

    bash scripts/install_models.sh smollm2 && bash scripts/install_corpora.sh all
    nice -n 10 python -m specjax.run --config=configs/self_distill_smollm2.py

Cuts 768 prompts (32-64 corpus tokens each, round-robin over chat, plays, the KJV and Python
source; chat-templated), samples up to 96 new tokens for each at temperature 1, batch 32, and
writes 3 shards plus manifest.json to data/self_distill/smollm2/ (~1.6 MB). Prints two
samples and the generation speed. An interrupted run resumes where it stopped when rerun.
Temperature 1 gives samples from the target's own distribution, so a drafter trained on them
by cross-entropy learns that distribution (what sets acceptance), not only its greedy path.
The target runs in float32 on every machine (``dtype = auto`` would pick bfloat16 on a CPU
where it is faster, and on one such host 28 of 64 greedy replies left float32's at a near-tie),
so every host writes the same rows; the manifest records the dtype.

    python -m specjax.run --config=configs/self_distill_smollm2.py:tiny --config.output_dir=/tmp/d

is a seconds-long smoke run on a random tiny target (random token prompts, no corpora).

    nice -n 10 python -m specjax.run --config=configs/self_distill_smollm2.py:greedy

writes the target's *greedy* replies to 768 chat and Python prompts to
data/self_distill/smollm2_greedy/: the text a greedy decode produces, which is what drafters
for temperature 0 (Medusa heads) must predict.

    nice -n 10 python -m specjax.run --config=configs/self_distill_smollm2.py:tasks

writes its greedy replies to 1024 task prompts to data/self_distill/smollm2_tasks/ (up to
128 new tokens each): chitchat users' questions asked on their own, and windows of the plays,
the KJV and Python source wrapped in a task (summarise, rewrite, answer a question about it,
explain or finish the code; ``specjax.train.distill.TASKS``), i.e. replies of the kind an
assistant gives rather than continuations of the corpus.

    nice -n 10 python -m specjax.run --config=configs/self_distill_smollm2.py:requests

writes its greedy replies to 512 assistant requests made from templates with no corpus text
(advice, explanations, stories, plans, letters: the "basic" set of ``distill.REQUEST_SETS``;
512 of the 656 it makes) to data/self_distill/smollm2_requests/ (up to 128 new tokens each):
the kind of reply the held-out chat prompts get, which the corpora lack.

    nice -n 10 python -m specjax.run --config=configs/self_distill_smollm2.py:requests_broad

does the same for 768 of the 1,169 requests of the "broad" set (recipes, trips, rules, how
things work, history, notes, jokes: mostly other kinds, on other topics, none a basic
request) to data/self_distill/smollm2_requests_broad/.
"""

from ml_collections import config_dict

from configs import tiny
from specjax.models import source


def get_config(arg: str | None = None):
  c = tiny.get_config()
  c.task = "self_distill"
  c.output_dir = "data/self_distill/smollm2"  # shards + manifest.json; kept out of git
  c.target = source.config("smollm2-135m-instruct")
  c.drafter.name = "none"  # generation is plain autoregression of the target
  c.dtype = "float32"  # the same rows on every host (the module's docstring)
  c.chat = True  # wrap prompts in the chat template (chitchat turns stay turns)
  c.stop_at_eos = True  # a row ends at the target's end-of-turn
  c.batch_size = 32
  c.max_new_tokens = 96
  c.max_len = 256  # prompt (<= ~110 tokens with template) + max_new_tokens
  c.temperature = 1.0
  c.top_k = 0
  c.top_p = 1.0
  c.seed = 0  # prompt choice and sampling

  c.distill = config_dict.ConfigDict()
  c.distill.sources = ("chitchat", "shakespeare", "kjv", "python")  # see specjax/train/corpora.py
  c.distill.num_prompts = 768
  c.distill.prompt_min_tokens = 32  # corpus tokens per prompt, before the template
  c.distill.prompt_max_tokens = 64
  c.distill.shard_size = 256  # examples per shard file; a multiple of batch_size
  c.distill.capture_layers = ()  # cache the residual stream after these layers (float16)
  c.distill.capture_final = False  # cache the final-norm hidden state the LM head reads
  c.distill.tasks = False  # True: task prompts (distill.TASKS, chitchat questions)
  c.distill.requests = False  # True: assistant requests made from templates, no corpus
  c.distill.request_set = "basic"  # which templates and slots: a key of distill.REQUEST_SETS
  # Your own prompts instead (docs/data.md): JSON/JSONL paths or globs; set sources=().
  c.distill.prompts_from = ()
  c.distill.format = "sharegpt"  # of prompts_from: sharegpt | messages | text
  c.distill.turns = "first"  # first: each conversation's first user turn | all: every one
  c.distill.on_error = "stop"  # a bad record: stop (names file and line) | skip (counted)

  if arg == "tiny":
    t = tiny.get_config()
    c.target = t.target
    c.output_dir = "data/self_distill/tiny"
    c.stop_at_eos = False
    c.batch_size = 4
    c.max_new_tokens = 16
    c.max_len = 48
    c.distill.sources = ()
    c.distill.num_prompts = 10
    c.distill.prompt_min_tokens = 4
    c.distill.prompt_max_tokens = 16
    c.distill.shard_size = 8
  elif arg == "greedy":
    c.output_dir = "data/self_distill/smollm2_greedy"
    c.temperature = 0.0
    c.distill.sources = ("chitchat", "python")
  elif arg == "tasks":
    c.output_dir = "data/self_distill/smollm2_tasks"
    c.temperature = 0.0
    c.distill.tasks = True
    c.distill.num_prompts = 1024
    c.distill.prompt_max_tokens = 48  # the template, system prompt and task around it: <= 128
    c.max_new_tokens = 128
  elif arg in ("requests", "requests_broad"):
    c.output_dir = f"data/self_distill/smollm2_{arg}"
    c.temperature = 0.0
    c.distill.requests = True
    c.distill.sources = ()  # the templates read no corpus
    c.distill.num_prompts = 512
    c.max_new_tokens = 128
    c.max_len = 192  # a request (<= ~50 tokens with the template) + max_new_tokens
    if arg == "requests_broad":  # the other templates (none makes a basic request)
      c.distill.request_set = "broad"
      c.distill.num_prompts = 768
  elif arg:
    raise ValueError(
      f"unknown variant {arg!r} of self_distill_smollm2.py; choose tiny, greedy, tasks, "
      "requests or requests_broad."
    )
  return c
