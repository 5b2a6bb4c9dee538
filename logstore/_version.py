"""The package's version: its one source (``pyproject.toml`` reads it, the facade re-exports it).

A module of its own so that any module may import it without importing the package facade
(``logstore/__init__.py`` imports the clients, so a client reaching for it there would be a cycle).
"""

__version__ = "0.1.0"
