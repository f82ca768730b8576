"""The package version, on the ground floor so that anything may read it."""

__version__ = "0.1.0"
