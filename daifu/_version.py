"""daifu's version (one place: the package, the code cache and checkpoints read it)."""

__version__ = "0.1.0"
