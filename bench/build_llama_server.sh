#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (the peer in `bench.bench --openai --llama-server PATH`) from the
# llama.cpp sources vendored in llama-cpp-python's sdist, and print the binary's path.
#   bash bench/build_llama_server.sh [BUILD_DIR]        (default ~/.cache/llmq/llama.cpp)
# x86-64 kernels for the extensions this CPU has (AVX2, AVX-512 where present), never AMX: on the VMs
# we measure on, llama.cpp's AMX matmul crashes (SIGSEGV in ggml_backend_amx_mul_mat), and a
# -march=native build turns it on.
set -euo pipefail
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
DIR=$(realpath -m "${1:-$HOME/.cache/llmq/llama.cpp}")
SRC=$DIR/llama_cpp_python-$VERSION/vendor/llama.cpp
mkdir -p "$DIR"
if [ ! -d "$SRC" ]; then
  python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$DIR" >&2
  tar -xzf "$DIR/llama_cpp_python-$VERSION.tar.gz" -C "$DIR"
fi
# the CPU's own vector extensions, read from /proc/cpuinfo (by the kernel's names: avx512vbmi has no
# underscore, avx512_vnni has one): a kernel for one it lacks dies of SIGILL
has() { grep -qw "$1" /proc/cpuinfo && echo ON || echo OFF; }
# a build folder per set of extensions: objects left by a build for another CPU would be linked in
FEATURES=$(for f in avx2 avx512f avx512vbmi avx512_vnni avx512_bf16; do if [ "$(has $f)" = ON ]; then echo $f; fi; done)
BUILD=$SRC/build-$(echo $FEATURES | tr ' ' '-')
cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=OFF -DGGML_AVX="$(has avx)" -DGGML_AVX2="$(has avx2)" \
  -DGGML_FMA="$(has fma)" -DGGML_F16C="$(has f16c)" -DGGML_BMI2="$(has bmi2)" -DGGML_AVX512="$(has avx512f)" \
  -DGGML_AVX512_VBMI="$(has avx512vbmi)" -DGGML_AVX512_VNNI="$(has avx512_vnni)" \
  -DGGML_AVX512_BF16="$(has avx512_bf16)" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF >&2
cmake --build "$BUILD" --target llama-server -j "$(nproc)" >&2
echo "$BUILD/bin/llama-server"
