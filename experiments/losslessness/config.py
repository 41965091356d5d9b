"""Losslessness, shown: rejection rate = TV(p, q), and sampled vs enumerated joint distributions.

    python -m specjax.run --config=experiments/losslessness/config.py
    python -m specjax.report experiments/losslessness

Random (p, q) pairs through the real chain verifier; SmolLM2-135M-Instruct (p) and its first 20
layers (q) teacher-forced on chitchat conversations at temperature 1, one verified draw per
position; and a vocab-5 random target sampled 20,000 times through ``generate`` with a
draft-model chain and an EAGLE sampled tree, against its enumerated distribution. Writes
results/losslessness.json (task=losslessness).
"""

from ml_collections import config_dict

from configs import demo


def get_config():
  c = demo.base()
  c.task = "losslessness"
  c.output_dir = "experiments/losslessness/results"
  c.drafter.name = "draft_model"
  c.drafter.draft_model.num_layers = 20  # of 30: a draft close enough that TV spreads over [0, 1]
  c.temperature = 1.0
  c.losslessness = config_dict.ConfigDict()
  c.losslessness.pairs = 200  # random (p, q) pairs
  c.losslessness.rows = 20_000  # verified draws per pair
  c.losslessness.vocab = 8
  c.losslessness.corpus = "chitchat"
  c.losslessness.tokens = 2048  # teacher-forced positions of real p and q
  c.losslessness.bins = 10  # TV bins
  c.losslessness.samples = 20_000  # generate() rows per drafter for the joint distribution
  return c
