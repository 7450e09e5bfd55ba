"""The two user-facing error kinds. Stage entry points print either as one ``error:`` line and exit 2."""


class ConfigError(ValueError):
    """A params problem, phrased as one line: ``<file>: <key>: <reason>``."""


class StageError(RuntimeError):
    """A problem with inputs (a missing or corrupt file, a tampered checkpoint): reported as one line."""


class Terminated(KeyboardInterrupt):
    """SIGTERM to a stage process: handled as an interruption (runs ended KILLED and resumable), exit 143."""
