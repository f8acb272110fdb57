"""Errors every part of the platform may raise. No I/O, no imports: pure cores use it."""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting, or a file a setting names, is wrong. Library code raises it; the
    process says why and exits in one place: ``runtime.main`` for a service, the
    ``inferbus`` command's group for a command."""
