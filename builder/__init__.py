"""dflash_trt.builder: `dflash-build`, a TensorRT-LLM deployment directory from a target + DFlash drafter pair.

The builder validates the pair, quantizes the target with NVIDIA ModelOpt (FP8 / NVFP4, optional FP8 KV cache),
copies the drafter in BF16 (z-lab format) and writes the TensorRT-LLM LLM-API YAML and launch scripts, all into one
directory written atomically and described by `engine.json` (with a sha256 of every file).
Heavy imports (torch, transformers, modelopt) happen inside the functions, so `dflash-build --help` stays instant.
"""
from .errors import BuildError  # noqa: F401
from .trtllm import TRTLLM_VERSION  # noqa: F401

FORMAT_VERSION = 1

__all__ = ["BuildError", "FORMAT_VERSION", "TRTLLM_VERSION", "build_engine", "check_engine"]


def __getattr__(name):
    if name == "build_engine":
        from .build import build_engine
        return build_engine
    if name == "check_engine":
        from .check import check_engine
        return check_engine
    raise AttributeError(name)
