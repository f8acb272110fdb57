#!/usr/bin/env bash
# The vs_vllm_server comparison on a lent NVIDIA GPU (the device tool's H200), in
# under 10 minutes: a random-weight Llama of the Llama-3.2-1B shape (no model can
# be downloaded there), served by vLLM's own OpenAI server and by inferbus, the
# same load through vLLM's serving benchmark.
#
# Run from the repository root on the device machine:
#   bash bench/gpu_check.sh            (results in $OUT, or ./gpu-check-out)
#
# That machine reaches no package registry. It has PyTorch but not vLLM, so vLLM
# and inferbus's own dependencies must travel as wheels in .whl/ (see
# /work/.library/device/README.md). Caveat found on 2026-11-29: vLLM's wheel alone is
# ~336 MB, over the 64 MiB a call may carry, and it pins its own torch; until a
# smaller route exists (a prebuilt image with vLLM), this script stops at the
# check below and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check-out}
mkdir -p "$out"
exec > >(tee "$out/gpu_check.log") 2>&1

nvidia-smi -L
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
if ! python3 -c "import vllm" 2>/dev/null; then
  echo "vllm is not importable on this machine: carry it (and its torch) as wheels in .whl/"
  exit 2
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . || export PYTHONPATH=$PWD:${PYTHONPATH:-}

model=/tmp/llama-1b-random
[ -f "$model/model.safetensors" ] || python3 -m inferbus.cli model make-tiny "$model" --arch 1b
timeout 540 python3 bench/vs_vllm_server.py --model "$model" --enforce-eager false \
  --max-model-len 4096 --max-num-seqs 256 --concurrency 16 --input-len 512 --output-len 128 \
  --num-prompts 256 --rounds 1 | tee "$out/vs_vllm_server.txt"
# KV spill on the GPU: the follow-up turn restored from host memory, disk and the
# shared folder against recomputing it (bench/kvspill.py; its own engine lives)
timeout 300 python3 bench/kvspill.py --model "$model" --lengths 2048,8192 \
  --json "$out/kvspill.json" | tee "$out/kvspill.txt" || echo "kvspill run failed or timed out"
