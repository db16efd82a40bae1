"""farout's exceptions. Every error farout reports is a :class:`FaroutError` carrying the
message the command line prints; it is also a ``ValueError`` (bad input: a config key, data,
shapes, labels, NaN) or an ``OSError`` (a file that cannot be read or written), so code that
catches those keeps working."""


class FaroutError(Exception):
    """Base class of every error farout raises."""


class InvalidInput(FaroutError, ValueError):
    """Bad input: a config key or value, malformed data, a wrong shape or dtype, NaN, a label
    out of range. The message names the key, file and line, or argument."""


class FileError(FaroutError, OSError):
    """A file or directory could not be read or written (the message names it)."""


__all__ = ["FaroutError", "InvalidInput", "FileError"]
