"""``python -m benchmarks.gpu``: see :mod:`benchmarks.gpu.bench`."""

from .bench import main

main()
