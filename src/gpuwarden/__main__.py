"""`python -m gpuwarden` is the same as the `gpuwarden` console script."""

from gpuwarden.cli import console

console()
