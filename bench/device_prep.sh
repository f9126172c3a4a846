#!/usr/bin/env bash
# The ignored folders bench/h200.sh needs on a GPU machine without a registry, made here, where pip reaches one.
# Idempotent: what exists is kept.
#   bash bench/device_prep.sh
#   .anchors/   the vendored llama.cpp source as a tarball, for a CUDA build there
#   .whl/       wheels that machine's Python 3.12 lacks (llama-cpp-python without its library: Hypura loads its
#               own build; the server's stack and the openai client for the serving benchmark)
#   .device/    tiny synthetic models: the GPU tests' models and the synthetic models' tokenizer
# .prebuilt/ holds a packed CUDA build (lib-<patch hash>.tar.xz.part*), which h200.sh writes to its output, and
# llama-server.tar.xz: vanilla llama-server built here without a GPU (its own code needs none), which runs there on
# the CUDA build's libraries of the same source (h200.sh ttft).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || { echo "device_prep.sh: run ./build.sh first (needs $PY)" >&2; exit 1; }

if [ ! -f .anchors/llamacpp-src.tar.xz ]; then
    [ -d vendor/llama.cpp ] || { echo "device_prep.sh: run ./build.sh first (needs vendor/llama.cpp)" >&2; exit 1; }
    mkdir -p .anchors
    # the pristine source: build.sh applies patches/ there as here
    tmp=$(mktemp -d)
    "$PY" -m pip download -q --no-binary :all: --no-deps -d "$tmp" "llama-cpp-python==0.3.36"
    tar xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp"
    # what a CUDA build of the library and the tools needs (76 MB of models, docs and other backends left out)
    tar cJf .anchors/llamacpp-src.tar.xz -C "$tmp/llama_cpp_python-0.3.36/vendor" \
        --exclude=llama.cpp/models --exclude=llama.cpp/docs --exclude=llama.cpp/tools/ui --exclude=llama.cpp/benches \
        --exclude='llama.cpp/ggml/src/ggml-'{sycl,vulkan,opencl,hexagon,metal,et,cann,musa,webgpu,zdnn,openvino} llama.cpp
    rm -rf "$tmp"
fi

mkdir -p .whl
wheels() {
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "$@"
}
ls .whl/cffi-*.whl > /dev/null 2>&1 || wheels cffi pycparser diskcache gguf
ls .whl/starlette-*.whl > /dev/null 2>&1 || wheels starlette uvicorn openai pydantic pydantic-core annotated-types \
    typing-inspection jiter distro sniffio httpx2 httpcore2 truststore idna anyio h11 certifi typing-extensions
ls .whl/llama_cpp_python-*.whl > /dev/null 2>&1 ||
    CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$PY" -m pip wheel -q --no-deps -w .whl "llama-cpp-python==0.3.36"

if [ ! -f .prebuilt/llama-server.tar.xz ]; then
    srv=$(mktemp -d)
    cmake -S vendor/llama.cpp -B "$srv" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF \
        -DGGML_RPC=ON > "$srv/cmake.log"
    cmake --build "$srv" -j "$(nproc)" --target llama-server > "$srv/build.log"
    mkdir -p .prebuilt "$srv/pack" && cp "$srv"/bin/llama-server "$srv"/bin/libllama-server-impl.so "$srv/pack/"
    cp "$srv"/bin/libmtmd.so.0.* "$srv/pack/libmtmd.so.0" && strip "$srv"/pack/*
    tar cJf .prebuilt/llama-server.tar.xz -C "$srv/pack" . && rm -rf "$srv"
fi

mkdir -p .device
for shape in tiny-llama tiny-qwen3moe; do
    [ -f .device/$shape.gguf ] || "$PY" -m hypura.cli.main synth $shape .device/$shape.gguf > /dev/null
done
echo "carry: $(ls -d .anchors .whl .device .prebuilt 2> /dev/null | tr '\n' ' ')"
du -sh .anchors .whl .device 2> /dev/null
