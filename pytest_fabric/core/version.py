"""The project's version, defined once (pyproject.toml reads it): every record stamps it."""

VERSION = "0.2.0"
