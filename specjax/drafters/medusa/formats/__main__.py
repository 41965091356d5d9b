"""``python -m specjax.drafters.medusa.formats``: see ``cli.py``."""

from specjax.drafters.medusa.formats.cli import main

main()
