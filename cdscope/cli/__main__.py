"""``python -m cdscope.cli``."""

from cdscope.cli import main

main()
