"""Errors that the CLI reports as one clear message instead of a traceback."""


class RffmError(Exception):
    """Base class: a problem the user can fix; its message says what and how."""


class ConfigError(RffmError):
    """A configuration value is missing, malformed or inconsistent."""


class DataError(RffmError):
    """An input dataset or recording is malformed."""


class IntegrityError(RffmError):
    """A file no longer matches the sentinel that vouches for it."""


def checked_yet_disagree(what: str) -> IntegrityError:
    """A sealed record and the file it vouches for disagree although both passed their checks moments before: a forged
    record or a bug. No rerun repairs that (the workflow rebuilds nothing whose checks pass), so the Fix claims none."""
    return IntegrityError(f"{what}, although both passed their checks (a forged record or a bug). Fix: report this line.")


class ExposureError(RffmError):
    """Qualification would spend the test split's exposure in a way the procedure forbids."""


class PlanRefused(SystemExit):
    """Snakemake must not carry out the plan it is building; the message says why and how to proceed.

    Raised from an input function while Snakemake builds the DAG (before any job runs or any file is
    deleted). It is a SystemExit so that Snakemake passes it up unwrapped: the user sees the one line,
    not an input-function traceback.
    """
