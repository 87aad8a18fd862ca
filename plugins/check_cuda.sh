#!/usr/bin/env bash
# Proves the DFlash CUDA kernels build for Hopper and Blackwell on a machine without a GPU:
#   1. nvcc compiles plugins/csrc/dflash_ops_cuda.cu (raw kernels, no torch headers) to an object holding
#      SASS for sm_90a (H100/H200), sm_100a (B200) and sm_103a (B300);
#   2. the torch glue plugins/csrc/dflash_ops_cuda_glue.cpp compiles (syntax only, no link) against the
#      installed torch's headers and the CUDA toolkit's, when torch is importable;
#   3. cuobjdump lists the cubins and disassembles each: every kernel must be there for every arch.
# Usage: bash plugins/check_cuda.sh [OUTDIR]
# Needs nvcc (CUDA 12.9+ / 13 for sm_103a) and cuobjdump + nvdisasm:
#   pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
# Exit: 0 all archs present, 1 a build or SASS check failed, 3 a tool is missing (the last line says which).
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CSRC="$HERE/csrc"
OUT="${1:-$(mktemp -d)}"
mkdir -p "$OUT"
ARCHS=(sm_90a sm_100a sm_103a)
PY="${PYTHON:-python3}"

find_tool() {  # PATH, CUDA_HOME, /usr/local/cuda, then the pip wheels' nvidia/*/bin
  local name="$1" dir
  if command -v "$name" >/dev/null 2>&1; then command -v "$name"; return 0; fi
  for dir in "${CUDA_HOME:-}/bin" /usr/local/cuda/bin; do
    [ -x "$dir/$name" ] && { echo "$dir/$name"; return 0; }
  done
  dir="$("$PY" - "$name" 2>/dev/null <<'EOF'
import glob, os, sys
try:
    import nvidia
except ImportError:
    sys.exit(0)
for root in list(nvidia.__path__):
    for p in sorted(glob.glob(os.path.join(root, "*", "bin", sys.argv[1]))):
        if os.access(p, os.X_OK):
            print(p)
            sys.exit(0)
EOF
)"
  [ -n "$dir" ] && { echo "$dir"; return 0; }
  return 1
}

NVCC="$(find_tool nvcc)" || { echo "nvcc not found (install the CUDA toolkit)"; exit 3; }
CUOBJDUMP="$(find_tool cuobjdump)" || {
  echo "cuobjdump not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"; exit 3; }
NVDISASM="$(find_tool nvdisasm)" || {
  echo "nvdisasm not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"; exit 3; }
echo "nvcc:      $NVCC ($("$NVCC" --version | grep -o 'release [0-9.]*'))"
echo "cuobjdump: $CUOBJDUMP"

GENCODE=()
for a in "${ARCHS[@]}"; do GENCODE+=(-gencode "arch=compute_${a#sm_},code=$a"); done

# a stamp of the inputs: an OUTDIR that already holds their checked object is not rebuilt
STAMP="$(cat "$CSRC"/dflash_ops*.cu "$CSRC"/dflash_ops*.cuh "$CSRC"/dflash_ops*.h "$CSRC"/dflash_ops_cuda_glue.cpp \
  "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)-$("$NVCC" --version | tail -1 | tr -dc 'A-Za-z0-9._')"
FRESH=0
[ -f "$OUT/dflash_ops_cuda.o" ] && [ "$(cat "$OUT/stamp" 2>/dev/null)" = "$STAMP" ] && FRESH=1

# the torch glue, in the background while nvcc runs (syntax only: a CPU torch cannot link CUDA code)
GLUE_PID=""
if [ "$FRESH" = 1 ]; then
  echo "glue: checked with these sources before"
elif "$PY" -c "import torch" >/dev/null 2>&1; then
  INCS="$("$PY" -c "from torch.utils.cpp_extension import include_paths as p; print(' '.join('-I' + i for i in p()))")"
  CUDA_INC=""
  NVCC_ROOT="$(dirname "$(dirname "$(readlink -f "$NVCC")")")"
  for d in "${CUDA_HOME:-}/include" "$NVCC_ROOT/include" /usr/local/cuda/include; do
    [ -f "$d/cuda_runtime.h" ] && { CUDA_INC="$d"; break; }
  done
  # shellcheck disable=SC2086
  ( ${CXX:-g++} -std=c++20 -fsyntax-only $INCS -I"$CUDA_INC" -DC10_CUDA_NO_CMAKE_CONFIGURE_FILE \
      "$CSRC/dflash_ops_cuda_glue.cpp" >"$OUT/glue.log" 2>&1 ) &
  GLUE_PID=$!
fi

OBJ="$OUT/dflash_ops_cuda.o"
start=$(date +%s)
if [ -f "$OBJ" ] && [ "$(cat "$OUT/stamp" 2>/dev/null)" = "$STAMP" ]; then
  echo "nvcc: $(basename "$OBJ") is up to date for these sources (delete $OUT/stamp to rebuild)"
else
  rm -f "$OUT/stamp"
  if ! "$NVCC" -c -O3 -std=c++17 "${GENCODE[@]}" --threads 2 -Xptxas -warn-spills -o "$OBJ" \
      "$CSRC/dflash_ops_cuda.cu" >"$OUT/nvcc.log" 2>&1; then
    cat "$OUT/nvcc.log"; echo "nvcc failed"; [ -n "$GLUE_PID" ] && wait "$GLUE_PID"; exit 1
  fi
  echo "nvcc: compiled $(basename "$OBJ") for ${ARCHS[*]} in $(( $(date +%s) - start )) s"
  grep -i "spill\|warning" "$OUT/nvcc.log" || true
fi

status=0
if [ "$FRESH" = 1 ]; then
  :
elif [ -n "$GLUE_PID" ]; then
  if wait "$GLUE_PID"; then
    echo "glue: dflash_ops_cuda_glue.cpp compiles against torch $("$PY" -c 'import torch; print(torch.__version__)') headers"
  else
    cat "$OUT/glue.log"; echo "glue: compile failed"; status=1
  fi
else
  echo "glue: skipped (torch is not importable)"
fi

"$CUOBJDUMP" -lelf "$OBJ" | tee "$OUT/elf.txt"
PATH="$(dirname "$NVDISASM"):$PATH" "$CUOBJDUMP" -sass "$OBJ" >"$OUT/sass.txt" 2>&1 || {
  cat "$OUT/sass.txt"; echo "cuobjdump -sass failed"; exit 1; }
# kernels per arch: "arch = sm_XX" opens a cubin, "Function : name" a kernel
awk '/arch = /{arch=$3} /Function :/{n[arch]++} END{for (a in n) print a, n[a]}' "$OUT/sass.txt" \
  | sort >"$OUT/counts.txt"
expected=""
for a in "${ARCHS[@]}"; do
  n="$(awk -v a="$a" '$1==a{print $2}' "$OUT/counts.txt")"
  instr="$(awk -v a="$a" '/arch = /{on=($3==a)} on && /\/\*[0-9a-f][0-9a-f][0-9a-f][0-9a-f]\*\//{c++}
    END{print c+0}' "$OUT/sass.txt")"
  if [ -z "$n" ] || [ "$n" -eq 0 ]; then
    echo "SASS $a: MISSING"; status=1
  elif [ -n "$expected" ] && [ "$n" != "$expected" ]; then
    echo "SASS $a: $n kernels, but $expected for ${ARCHS[0]}"; status=1
  elif ! grep -q "$a" "$OUT/elf.txt"; then
    echo "SASS $a: no cubin listed by cuobjdump -lelf"; status=1
  else
    echo "SASS $a: ok ($n kernels, $instr instructions)"
    expected="${expected:-$n}"
  fi
done
echo "objects and listings in $OUT"
[ "$status" = 0 ] && echo "$STAMP" >"$OUT/stamp"
exit $status
