"""Errors that the CLI reports as one clear message instead of a traceback."""


class RffmError(Exception):
    """Base class: a problem the user can fix; its message says what and how."""


class ConfigError(RffmError):
    """A configuration value is missing, malformed or inconsistent."""


class DataError(RffmError):
    """An input dataset or recording is malformed."""


class IntegrityError(RffmError):
    """A file no longer matches the sentinel that vouches for it."""


class ExposureError(RffmError):
    """Qualification would spend the test split's exposure in a way the procedure forbids."""
