"""task=sweep: AR vs several drafters, per prompt category and batch size, in one process.

    python -m specjax.run --config=experiments/training_free/config.py

The measuring (its config section, the variants, the timed and interleaved passes, the tables
and ``sweep.json``) is the library ``specjax/measure/sweep.py``, which experiments and other
tasks share; its docstring has the details.
"""

from specjax.measure.sweep import run

__all__ = ["run"]
