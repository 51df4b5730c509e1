"""The package version: the one source for pyproject.toml and `ember.__version__` (leaf).

imports: nothing of ember
"""

__version__ = "0.1.0"
