"""Builder errors: DFlashError subclasses, so the CLI prints them as one `error: ...` line."""
from dflash_trt.errors import DFlashError


class BuildError(DFlashError):
    """A bad build request (flags, output directory, calibration data) or a failed build step."""
