#!/usr/bin/env bash
# The prepared call for a lent GPU machine (one `run` of the device tool, <= 5 min end to end):
#   1. bench/kernels.py: kernel checks, copy bandwidth, the extend launch sweep (TMA, lazy
#      rescale, 2-stage candidates) and the extend table with the sweep's winner;
#      bench/extend_winner.py then names the winner per head layout and whether it meets the
#      1.3x-SDPA target (to make it kernels.default_extend_config's choice);
#   2. bench/gpu_engine.py: the engine on CUDA, triton vs torch backend (small random model),
#      then the Llama-3-8B-shaped bf16 section (decode vs floor, eager and CUDA graphs; prefill vs
#      matmul rate; CUDA-graph vs eager greedy tokens; shared-prefix workload).
# Step 2 needs the tokenizer files carried in .gpu_carry/tok (the embedded model's
# tokenizer.json, tokenizer_config.json). Logs and JSON go to $OUT (bench/results without it).
# Each step has its own time limit, so a slow step cannot eat the others' time; every script
# rewrites its JSON after each section. SECTIONS overrides the kernels.py sections.
#
#   run: bash bench/gpu_run.sh        carry: [".gpu_carry"]        timeout_s: 330
#   CPU dry run of step 2: python bench/gpu_engine.py --tokenizer DIR --dry-run
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-bench/results}
export OUT
mkdir -p "$OUT"
start=$(date +%s)
# runtime/ and kernels/ import as agentlang.runtime / agentlang.kernels (setup.py maps them):
# an editable install of this checkout, offline, no dependencies (the image has torch/triton)
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . \
    || echo "editable install failed: agentlang.runtime will not import"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
timeout 130 python3 bench/kernels.py --sections "${SECTIONS:-checks,ceiling,sweep-extend,extend}" \
    2>&1 | tee "$OUT/kernels.log"
rc=${PIPESTATUS[0]}
python3 bench/extend_winner.py "$OUT" 2>&1 | tee "$OUT/extend_winner.log"
echo "kernels: $(( $(date +%s) - start )) s"
if [ -f .gpu_carry/tok/tokenizer.json ]; then
    timeout 50 python3 bench/gpu_engine.py --tokenizer .gpu_carry/tok --sections check \
        --max-tokens 32 2>&1 | tee "$OUT/gpu_engine_check.log"
    rc=$(( rc | PIPESTATUS[0] ))
    cp "$OUT/gpu_engine.json" "$OUT/gpu_engine_check.json" 2>/dev/null || true
    timeout 110 python3 bench/gpu_engine.py --tokenizer .gpu_carry/tok --sections llama8b \
        2>&1 | tee "$OUT/gpu_engine_llama8b.log"
    rc=$(( rc | PIPESTATUS[0] ))
    cp "$OUT/gpu_engine.json" "$OUT/gpu_engine_llama8b.json" 2>/dev/null || true
else
    echo "no .gpu_carry/tok/tokenizer.json: engine sections skipped"
    rc=$(( rc | 1 ))
fi
echo "total: $(( $(date +%s) - start )) s, exit $rc"
exit "$rc"
