"""``python -m cdscope``: the same command line as the ``cdscope`` script."""

from cdscope.cli import main

main()
