"""task=verify_cost: time one target forward over T tokens, per T in ``sweep.verify_sizes``.

    python -m specjax.run --config=experiments/training_free/config.py --config.task=verify_cost

What verifying a chain or tree of T - 1 draft tokens costs relative to one AR step on this
machine, the number that decides which tree sizes can pay off. Writes verify_cost.json.
"""

from specjax.measure.sweep import run_verify_cost as run

__all__ = ["run"]
