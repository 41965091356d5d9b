"""Training drafters against a frozen target, on one CPU or a sharded multi-process mesh.

objectives.py   what is trained and its loss (DraftDistill, Medusa; EAGLE's in drafters/eagle)
step.py         TrainState, optax optimiser, the jitted train step with shardings
loop.py         the loop: data by step, eval, JSONL and TensorBoard metrics, τ probe, profiler
                (the losses the objectives use: specjax/losses.py)
checkpoint.py   orbax checkpoints: sharded, async, atomic, keep last N, shape-checked
metrics_log.py  metrics.jsonl that reads as one run across kill and resume
export.py       a trained draft as an HF-style safetensors directory
data.py         corpora and self-distilled shards packed into a Dataset
distill.py      self-distillation: the target writes its own training text
"""
