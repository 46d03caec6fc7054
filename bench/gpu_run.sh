#!/usr/bin/env bash
# The prepared call for a lent GPU machine (one `run` of the device tool, ~5 min):
#   kernel checks, copy bandwidth, the extend launch sweep and the extend table
#   (bench/kernels.py), then the engine on CUDA, triton vs torch backend (bench/gpu_engine.py,
#   when the tokenizer files were carried in .gpu_carry/tok). Logs and JSON go to $OUT
#   (bench/results without it). SECTIONS overrides the kernels.py sections.
#
#   run: bash bench/gpu_run.sh        carry: [".gpu_carry"]        timeout_s: 480
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-bench/results}
export OUT
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 bench/kernels.py --sections "${SECTIONS:-checks,ceiling,sweep-extend,extend}" 2>&1 \
    | tee "$OUT/kernels.log"
rc=${PIPESTATUS[0]}
if [ -f .gpu_carry/tok/tokenizer.json ]; then
    timeout 150 python3 bench/gpu_engine.py --tokenizer .gpu_carry/tok 2>&1 \
        | tee "$OUT/gpu_engine.log"
    rc=$(( rc | PIPESTATUS[0] ))
else
    echo "no .gpu_carry/tok/tokenizer.json: engine check skipped"
fi
exit "$rc"
