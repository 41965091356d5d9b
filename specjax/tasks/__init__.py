"""Tasks that ``python -m specjax.run`` dispatches to, by ``config.task``."""
