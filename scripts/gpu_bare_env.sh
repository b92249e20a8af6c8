#!/usr/bin/env bash
# A dry run of the GPU check's set-up, here: a fresh virtual environment that holds only
# torch, torchvision and other packages the lent GPU machine lists (no hydra-core, no
# omegaconf, no antlr4, no mlxtend, no lptrain install), then scripts/gpu_check.sh
# --setup-only in it: the carried wheels installed with pip --target, every requirement
# met, every lptrain module imported and every test collected. Usage, from the checkout,
# after python3 scripts/gpu_wheels.py:
#
#     bash scripts/gpu_bare_env.sh [VENV_DIR [OUT_DIR]]    # default /tmp/lptrain-bare, /tmp/lptrain-bare-out
#
# Exit status: gpu_check.sh's (0 when the wheel set is complete).
set -euo pipefail
venv=${1:-/tmp/lptrain-bare}
out=${2:-/tmp/lptrain-bare-out}
cd "$(dirname "$0")/.."
TORCH=${TORCH:-torch==2.14.1}
TORCHVISION=${TORCHVISION:-torchvision==0.29.1}
# The packages lptrain or the carried wheels import that the GPU machine has (KINDS.md's
# list): nothing else.
THERE=(numpy pyyaml packaging pillow matplotlib tensorboard tqdm pytest pytest-timeout pytest-xdist scipy pandas scikit-learn
    joblib)
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q "$TORCH" "$TORCHVISION" "${THERE[@]}"
fi
for absent in hydra omegaconf antlr4 mlxtend lptrain; do
    if (cd / && "$venv/bin/python" -c "import $absent" 2>/dev/null); then
        echo "gpu_bare_env: $venv has $absent installed; it must not (remove the folder and run again)" >&2
        exit 2
    fi
done
# The time limits are the GPU machine's (16 cores); a shared 2-core machine gets four times them.
PYTHON="$venv/bin/python" GPU_CHECK_TIME_FACTOR=${GPU_CHECK_TIME_FACTOR:-4} bash scripts/gpu_check.sh --setup-only "$out"
