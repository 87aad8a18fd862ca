# dflash-serve on NVIDIA's TensorRT-LLM release container (the version builder/trtllm.py pins: TRTLLM_VERSION).
#
#   docker build -t dflash-trt .
#   docker run --gpus all --ipc=host -p 8000:8000 -v /models/engine:/engine dflash-trt /engine --backend trtllm
#   docker run --gpus all -p 8000:8000 dflash-trt                     # native engine, embedded default pair
#
# The container's own PyTorch (CUDA build) is kept: this package is installed with --no-deps, and only the
# dependencies the container lacks are added (none of them requires torch). See docs/serving.md.
ARG TRTLLM_VERSION=1.4.0rc1
FROM nvcr.io/nvidia/tensorrt-llm/release:${TRTLLM_VERSION}

# Kernels for Hopper (H100/H200) and Blackwell (B200, B300), plus PTX for newer GPUs. The image is built without
# a GPU, so the list must be given (older torch builds without 10.3: --build-arg CUDA_ARCHS="9.0;10.0+PTX").
ARG CUDA_ARCHS="9.0;10.0;10.3+PTX"
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TORCH_CUDA_ARCH_LIST=${CUDA_ARCHS} \
    DFLASH_TRT_CACHE=/opt/dflash-trt/cache \
    DFLASH_TRT_BUILD=/opt/dflash-trt/ops \
    DFLASH_HOST=0.0.0.0 \
    DFLASH_PORT=8000

WORKDIR /opt/dflash-trt
COPY pyproject.toml README.md ./
COPY runtime ./runtime
COPY builder ./builder
COPY plugins ./plugins

# 1. this package, editable, without touching the container's torch / transformers / tensorrt_llm
# 2. what the container may lack (pure-Python or numpy-only packages)
# 3. fail the build now, not at the first request, if an import is missing
RUN pip install --no-deps -e . \
 && pip install "gguf>=0.10" rich tqdm sentencepiece safetensors tokenizers fastapi uvicorn prometheus_client \
 && python -c "import importlib.util, torch, transformers, accelerate, fastapi, uvicorn, prometheus_client, gguf; \
import dflash_trt.server.app, dflash_trt.server.trtllm; assert importlib.util.find_spec('tensorrt_llm'); \
print('torch', torch.__version__, 'CUDA', torch.version.cuda)"

# The DFlash CUDA ops (plugins/): compiled once here (no GPU needed with TORCH_CUDA_ARCH_LIST set) into
# $DFLASH_TRT_BUILD, where the runtime finds them again by source hash and torch version. $DFLASH_TRT_CACHE (the
# embedded model, converted on first use) is separate, so a volume can be mounted there.
RUN python -c "from dflash_trt.plugins import dflash_ops; dflash_ops.load(); \
print('DFlash ops loaded, CUDA kernels:', dflash_ops.has_cuda_kernels())"

EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s \
  CMD python -c "import os, urllib.request as u; \
u.urlopen('http://127.0.0.1:%s/health' % os.environ.get('DFLASH_PORT', '8000'), timeout=4)" || exit 1
ENTRYPOINT ["dflash-serve"]
