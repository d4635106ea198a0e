"""The package's version string (``agl.__version__``), in a module of its own so any layer can read it."""

__version__ = "0.1.0"
