"""Scripts whose figures go into notes and the README (`python -m benchmarks.NAME` from the
project root). Not part of the installed package: they import k25exp like any user."""
