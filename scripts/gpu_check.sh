#!/usr/bin/env bash
# The GPU path's one prepared device check, for a machine with one GPU, sized for a
# 9-minute slot on an H200 (the steps' time limits add up to 8.8 minutes). Usage, from the
# repository root with the venv active and the gpu extra installed
# (pip install -e '.[dev,gpu]'):
#
#     scripts/gpu_check.sh OUT_DIR
#
# Writes into OUT_DIR: env.txt (GPU, driver, torch, CuPy), one log per step, the cuda
# tests' JUnit XML, the benchmark's JSON, the runs' folders, and summary.txt (each step's
# exit status and seconds). Every step runs even if an earlier one fails; the script
# exits non-zero if any did. On a machine without a GPU it stops at once and says so.
#
# Several replicas share the one GPU, so every link of a schedule still runs on its own
# stream with events between dependent blocks, and the peer kernel reads "across" within
# the GPU. What one GPU cannot check: peer copies and peer reads between distinct GPUs
# (P2P over NVLink or PCIe), and NCCL between GPUs (one process per GPU).
set -uo pipefail

out=${1:?usage: scripts/gpu_check.sh OUT_DIR}
PY=${PYTHON:-python}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."

if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_check: needs a CUDA GPU, and torch.cuda.is_available() is False here (or $PY has no torch)" >&2
    exit 2
fi

status=0
summary="$out/summary.txt"
: >"$summary"

# step NAME SECONDS COMMAND...: run with a time limit, log to OUT_DIR/NAME.log, record the outcome.
step() {
    local name=$1 limit=$2
    shift 2
    local began=$SECONDS
    echo "== $name (at most ${limit} s)"
    timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    local verdict=ok
    if [ "$rc" -ne 0 ]; then
        verdict="FAILED (rc $rc$([ "$rc" -eq 124 ] && echo ', timed out'))"
        status=1
    fi
    printf '%-22s %-28s %4d s\n' "$name" "$verdict" $((SECONDS - began)) | tee -a "$summary"
}

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
    "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
    "$PY" -c 'import cupy; print("cupy", cupy.__version__)' 2>&1 || echo "cupy: not installed (the peer kernel is skipped)"
} >"$out/env.txt" 2>&1

# 1. The cuda-marked tests: the executor's streams and events, both reduction paths, the
#    failure mid-plan, NCCL's dtypes, the seeding of replicas sharing a GPU.
step cuda_tests 200 "$PY" -m pytest -m cuda -q -p no:cacheprovider tests --junitxml="$out/cuda_tests.xml"

# 2. The schedules on four replicas of the GPU, each with both reduction kernels.
step bench 60 "$PY" -m lptrain.bench --devices cuda:0,cuda:0,cuda:0,cuda:0 --algo lp,mst,be,ring \
    --reduce-kernel peer,staged -b 1M -e 256M -f 4 --trials 3 --target-time 0.1 --json "$out/bench.json"

# 3. AlexNet at 224 px on synthetic data, 30 steps, four replicas of the GPU, each communicator.
step alexnet 120 "$PY" -m lptrain -m +recipe=alexnet data=synthetic model.image_size=224 \
    'trainer.devices=[cuda:0,cuda:0,cuda:0,cuda:0]' trainer.device_type=cuda trainer.batch_per_device=32 \
    trainer.steps=30 trainer.eval_every=0 trainer.checkpoint_every=0 trainer.progress=false \
    comm=lp,mst,be,ring "hydra.sweep.dir=$out/alexnet"

# 4. The trainer and the benchmark under torchrun with the NCCL backend, in one process.
step torchrun_train 60 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 -m lptrain \
    +recipe=alexnet data=synthetic model.image_size=224 trainer.devices=auto trainer.batch_per_device=32 \
    trainer.steps=10 trainer.eval_every=0 trainer.checkpoint_every=10 trainer.progress=false \
    "hydra.run.dir=$out/torchrun"
step torchrun_bench 30 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 -m lptrain.bench \
    --algo lp,ring,nccl -b 1M -e 16M --trials 2 --target-time 0.05

# 5. lptrain.ddp's CUDA paths: the hook's CUDA futures and side streams, the backend over NCCL.
step ddp_cuda 60 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 scripts/ddp_gpu_check.py

echo "gpu_check: $(grep -c ' ok ' "$summary") of $(wc -l <"$summary") steps passed; results in $out"
exit $status
