"""``python -m specjax.interop.medusa``: see ``cli.py``."""

from specjax.interop.medusa.cli import main

main()
