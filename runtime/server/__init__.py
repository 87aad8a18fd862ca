"""dflash_trt.server: `dflash-serve`, an OpenAI-compatible HTTP server (FastAPI + uvicorn) on the native engine,
or a launcher of TensorRT-LLM's `trtllm-serve` for an engine directory from dflash-build.

    from dflash_trt import LLM
    from dflash_trt.server import create_app
    app = create_app(LLM(target=..., draft=...), api_key="secret")   # then: uvicorn.run(app, port=8000)

Heavy imports (fastapi, the engine) happen on first use, so `dflash-serve --help` stays quick.
"""


def __getattr__(name):
    if name in ("create_app", "DFlashServer"):
        from . import app
        return getattr(app, name)
    raise AttributeError(name)


__all__ = ["create_app", "DFlashServer"]
