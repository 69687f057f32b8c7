#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (the peer in `bench.bench --openai --llama-server PATH`) from the
# llama.cpp sources vendored in llama-cpp-python's sdist, and print the binary's path.
#   bash bench/build_llama_server.sh [BUILD_DIR]        (default ~/.cache/llmq/llama.cpp)
# x86-64 with AVX2/AVX-512 kernels, without AMX: on the VMs we measure on, llama.cpp's AMX matmul
# crashes (SIGSEGV in ggml_backend_amx_mul_mat), and a -march=native build turns it on.
set -euo pipefail
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
DIR=$(realpath -m "${1:-$HOME/.cache/llmq/llama.cpp}")
SRC=$DIR/llama_cpp_python-$VERSION/vendor/llama.cpp
mkdir -p "$DIR"
if [ ! -d "$SRC" ]; then
  python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$DIR" >&2
  tar -xzf "$DIR/llama_cpp_python-$VERSION.tar.gz" -C "$DIR"
fi
cmake -S "$SRC" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF >&2
cmake --build "$SRC/build" --target llama-server -j "$(nproc)" >&2
echo "$SRC/build/bin/llama-server"
