"""User-facing errors: one line that names the problem and the fix, printed without a traceback by the CLIs."""


class DFlashError(Exception):
    """A mistake in what the user gave us (paths, configs, flags, requests)."""


class CheckpointError(DFlashError):
    """A checkpoint directory is missing, unreadable or inconsistent."""


class PairError(DFlashError):
    """The target and the drafter do not fit together."""
