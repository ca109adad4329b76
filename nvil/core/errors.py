"""User-facing errors: each carries a one-line message that names the problem.

The entry points (train.py, evaluate.py) catch ``UserError`` and print ``error: <message>`` with a
non-zero exit code instead of a traceback from deep inside torch.
"""


class UserError(Exception):
    """Bad input from the user: a config value, a file, a dataset. Printed as one line."""

    exit_code = 2


class ConfigError(UserError):
    pass


class CheckpointError(UserError):
    pass


class DataError(UserError, ValueError):
    """Rows an estimator or a dataset cannot take (non-finite values, a wrong shape or support): one line naming
    the problem and the remedy (``nvil.estimators.door``)."""


class TrainingDiverged(UserError):
    pass


class CertificateFailed(UserError):
    """An estimate failed its certificate under ``estimator.strict=true``: exit code 3, after the JSON line."""

    exit_code = 3


class StorageError(UserError):
    """A write the storage refused (a full disk, a read-only file system, no permission): one line naming the path
    (``nvil.core.files.writing``); whatever was written before it is kept."""


class OutOfMemory(UserError):
    """An estimate that asked for more memory than the machine has: one line naming the estimator and the settings
    to lower (``nvil.app.evaluation``)."""
