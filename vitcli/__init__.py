"""vitcli: follow one photograph through a Vision Transformer, with measured numbers."""

__version__ = "0.1.0"
