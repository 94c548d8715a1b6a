"""The relay's exception root. Every error the package raises derives from RelayError."""


class RelayError(Exception):
    """Root of every error raised by the relay."""

    retriable: bool = False


class ConfigError(RelayError):
    """The configuration is invalid. The message names the key and the fix."""
