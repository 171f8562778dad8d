"""``python -m clawvm.cli``: the command line."""

from clawvm.cli import main

main()
