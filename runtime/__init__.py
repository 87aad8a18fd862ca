"""dflash_trt: DFlash speculative decoding, a native PyTorch runtime and a TensorRT-LLM engine builder."""
__version__ = "0.1.0"

from .errors import CheckpointError, DFlashError, PairError  # noqa: E402
from .sampling import SamplingParams  # noqa: E402


def __getattr__(name):  # keep `import dflash_trt` light: the engine pulls in torch models lazily
    if name in ("LLM", "RequestOutput"):
        from . import llm
        return getattr(llm, name)
    if name == "EngineConfig":
        from .engine_config import EngineConfig
        return EngineConfig
    raise AttributeError(name)


__all__ = ["LLM", "RequestOutput", "SamplingParams", "EngineConfig", "DFlashError", "CheckpointError",
           "PairError", "__version__"]
