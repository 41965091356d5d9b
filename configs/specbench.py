"""Spec-Bench on SmolLM2-135M-Instruct: AR and prompt lookup, per category (task=specbench).

    bash scripts/install_models.sh smollm2 && python -m specjax.run --config=configs/specbench.py \
      --config.specbench.question_file=PATH/Spec-Bench/data/spec_bench/question.jsonl

The question file is Spec-Bench's (github.com/hemingkx/Spec-Bench, data/spec_bench/question.jsonl;
specjax ships none). The first 5 questions of each of its 13 categories, first turns, 256 new
tokens, greedy, batch 1: each decoded with AR and with prompt lookup (K = 4) in one process, the
outputs checked equal. Prints Spec-Bench's table (speedup per column, mean accepted tokens) and
writes results/specbench/: specbench.json, specbench.md and the two answer files in
model_answer/ (Spec-Bench's layout). Not timed whole here: 65 questions x 256 tokens per method
at SmolLM2's ~25 AR tokens/s on a quiet 2-core CPU, plus a compile per method and prompt width,
is about half an hour; an interrupted run resumes at the next question. The whole benchmark
as Spec-Bench runs it:
``--config.specbench.per_category=None --config.specbench.turns=2 --config.max_new_tokens=1024
--config.max_len=3072``.

``--config=configs/specbench.py:tiny`` runs the task on configs/tiny.py's random models (the
questions' bytes stand in for tokens), one question each of writing, translation and qa, 32 new
tokens: a smoke check of the task and its files (about a minute; the speedups mean nothing).
"""

from configs import demo, tiny
from specjax.tasks import specbench


def get_config(arg: str = ""):
  if arg not in ("", "tiny"):
    raise ValueError(f"configs/specbench.py takes no argument or ':tiny', got {arg!r}.")
  c = demo.base() if arg == "" else tiny.get_config()
  c.task = "specbench"
  c.output_dir = "results/specbench" + ("_tiny" if arg else "")
  c.prompts = ()  # the questions are the prompts
  c.specbench = specbench.default_config()
  c.specbench.per_category = 5  # the first 5 of each category
  c.specbench.turns = 1  # first turns; 2 asks MT-bench's second turns too
  c.batch_size = 1  # one question at a time, as Spec-Bench
  c.temperature = 0.0
  c.stop_at_eos = True
  c.max_new_tokens = 256
  c.max_len = 1280  # the longest prompt of these (a summarization article: 926 tokens) + 256
  if arg == "tiny":  # three categories of short questions (a prompt is its bytes here)
    c.specbench.categories = ("writing", "translation", "qa")
    c.specbench.per_category = 1
    c.max_new_tokens = 32
    c.max_len = 256
  return c
