"""Exception root of the producer package.

Every exception the producer raises on purpose is a :class:`ProducerError`. Callers
catch that one class; ``emit()`` itself never raises (see ``producer.kafka``).
"""

from __future__ import annotations


class ProducerError(Exception):
    """Root of every error raised by ``producer``."""


class ConfigError(ProducerError, ValueError):
    """A configuration value is missing, unknown or invalid.

    The message names the key (in the spelling the user wrote it) and the fix.
    """


class JournalError(ProducerError):
    """The on-disk journal cannot be opened or is locked by another live process."""


class MissingDependency(ProducerError, ImportError):
    """An optional dependency is not installed; the message says what to install."""
