"""Exceptions the runtime raises. The CLI prints their message and exits non-zero; nothing else is caught."""


class PowerInferError(Exception):
    """Base class: an error whose message is meant for the user as it is."""


class ModelFileError(PowerInferError):
    """A model file is unreadable, corrupt, truncated, or describes something we cannot run."""


class UnsupportedError(PowerInferError):
    """A valid file that uses an architecture, tensor type or feature this version does not support."""


class ContextFullError(PowerInferError):
    """The prompt (or prompt plus requested tokens) does not fit in the context window."""
