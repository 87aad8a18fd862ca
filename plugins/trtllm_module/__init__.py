"""TensorRT-LLM custom module: registers the DFlash custom ops on import.

    trtllm-serve serve TARGET_DIR --backend pytorch --custom_module_dirs /path/to/plugins/trtllm_module ...

TensorRT-LLM imports a custom module directory as a package (it puts the directory's parent on sys.path and
imports the directory's name), so importing this package builds (JIT, cached) and loads the extension and
registers its fake kernels: torch.ops.dflash_trt.dflash_prepare_draft_blocks, dflash_greedy_verify,
dflash_sampling_verify and dflash_context_append are then available to the model code, to torch.compile and
to CUDA-graph capture. It uses the installed `dflash_trt` package when there is one, else the plugins/ folder
this directory sits in (keep it there: the C++ sources are read from ../csrc).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys

OPS = ("dflash_prepare_draft_blocks", "dflash_greedy_verify", "dflash_sampling_verify", "dflash_context_append")


def _plugins():
    try:
        from dflash_trt.plugins import dflash_ops
        return dflash_ops
    except ImportError:
        pass
    plugins_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    name = "_dflash_trt_plugins"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(plugins_dir, "__init__.py"),
                                                      submodule_search_locations=[plugins_dir])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return importlib.import_module(name + ".dflash_ops")


dflash_ops = _plugins()
dflash_ops.load()

prepare_draft_blocks = dflash_ops.prepare_draft_blocks
greedy_verify = dflash_ops.greedy_verify
sampling_verify = dflash_ops.sampling_verify
context_append = dflash_ops.context_append

__all__ = ["OPS", "dflash_ops", "prepare_draft_blocks", "greedy_verify", "sampling_verify", "context_append"]
