#!/usr/bin/env bash
# The GPU path's prepared device check, in one call on a bare machine with one GPU and its
# own python3 (torch, torchvision, pytest, pytest-timeout; no package registry). Within
# 6.5 minutes: the steps' time limits add up to 385 s (the whole check took
# 241 s on the H200 with every step inside its limit but the cuda tests', before the
# lp_memcpy step was added).
#
# Preparation, where pip reaches a registry (the wheels go into .whl/, which git ignores):
#     python3 scripts/gpu_wheels.py
# Then, on the GPU machine, from the checkout (no pip install -e), with .whl carried along:
#     bash scripts/gpu_check.sh OUT_DIR
#
# It installs .whl/*.whl with pip --target into a temporary folder, runs every step from
# the checkout (PYTHONPATH), writes logs into a temporary folder, and leaves in OUT_DIR
# two files (and experiment/, the experiment's tables, when that step runs): gpu_check.tgz
# (every step's log, the cuda tests' JUnit XML, the benchmark's JSON, the runs'
# metrics.jsonl and summary.txt; no checkpoints, no event files) and summary.txt (each
# step's outcome and seconds). Every step runs even if an earlier one failed; the exit
# status is 1 if any failed, 2 without a GPU.
#
#     bash scripts/gpu_check.sh --setup-only OUT_DIR   # no GPU needed: wheels, imports, collection
#     GPU_CHECK_STEPS="cuda_tests cli" GPU_CHECK_K="graph or resume" bash scripts/gpu_check.sh OUT_DIR
#                                                      # a rerun of some steps and some cuda tests
#     GPU_CHECK_STEPS=experiment bash scripts/gpu_check.sh OUT_DIR   # the paper's experiment alone, in
#                                                      # about 6 minutes (its step, 6, below)
#
# Several replicas share the one GPU, so every link of a schedule still runs on its own
# stream with events between dependent blocks, and the peer kernel reads "across" within
# the GPU. What one GPU cannot check: peer copies and reads between distinct GPUs, and
# NCCL between GPUs (one process per GPU; at world size 1 NCCL moves nothing).
set -uo pipefail

setup_only=0
if [ "${1:-}" = "--setup-only" ]; then
    setup_only=1
    shift
fi
out=${1:-${OUT:-}}
if [ -z "$out" ]; then
    echo "usage: scripts/gpu_check.sh [--setup-only] OUT_DIR (or set OUT)" >&2
    exit 2
fi
PY=${PYTHON:-python3}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
repo=$(pwd)
if [ "$setup_only" -eq 0 ] && ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_check: needs a CUDA GPU, and torch.cuda.is_available() is False here (or $PY has no torch)" >&2
    exit 2
fi
work=$(mktemp -d /tmp/gpu_check.XXXXXX)
logs=$work/logs
site=$work/site
mkdir -p "$logs"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 MPLBACKEND=Agg
started=$SECONDS

status=0
summary="$logs/summary.txt"
: >"$summary"

# step NAME SECONDS COMMAND...: run with a time limit, log to logs/NAME.log, record the outcome.
# GPU_CHECK_STEPS="cuda_tests overlap" runs only those of the GPU steps (a short rerun). The steps
# in OPT_IN run only when GPU_CHECK_STEPS names them: each needs a call of its own.
OPT_IN=" experiment "
step() {
    local name=$1 limit=$2
    shift 2
    local chosen=${GPU_CHECK_STEPS:-$name}
    case "$OPT_IN" in *" $name "*) chosen=${GPU_CHECK_STEPS:-} ;; esac
    case " wheels requirements imports collect experiment_plan $chosen " in
    *" $name "*) ;;
    *)
        printf '%-16s %-28s %4d s\n' "$name" "skipped (GPU_CHECK_STEPS)" 0 | tee -a "$summary"
        return
        ;;
    esac
    limit=$((limit * ${GPU_CHECK_TIME_FACTOR:-1})) # a slower machine (the dry run here) may stretch them
    local began=$SECONDS
    echo "== $name (at most ${limit} s)"
    timeout --kill-after=5 "$limit" "$@" >"$logs/$name.log" 2>&1
    local rc=$?
    local verdict=ok
    if [ "$rc" -ne 0 ]; then
        verdict="FAILED (rc $rc$([ "$rc" -eq 124 ] && echo ', timed out'))"
        status=1
    fi
    printf '%-16s %-28s %4d s\n' "$name" "$verdict" $((SECONDS - began)) | tee -a "$summary"
}

# finish: the archive and the summary into OUT_DIR, the failed steps' last lines on stdout.
finish() {
    echo "total $((SECONDS - started)) s" >>"$summary"
    find "$work/runs" -name metrics.jsonl 2>/dev/null | while read -r f; do
        cp "$f" "$logs/metrics-$(basename "$(dirname "$f")").jsonl"
    done
    tar -czf "$out/gpu_check.tgz" -C "$work" logs
    cp "$summary" "$out/summary.txt"
    for log in "$logs"/*.log; do
        name=$(basename "$log" .log)
        if grep -q "^$name .*FAILED" "$summary"; then
            echo "---- last lines of $name.log"
            tail -n 15 "$log"
        fi
    done
    echo "gpu_check: $(awk '$2 == "ok"' "$summary" | wc -l) steps passed, $(grep -c ' FAILED ' "$summary") failed," \
        "$(grep -c ' skipped ' "$summary") skipped in $((SECONDS - started)) s; $out/gpu_check.tgz and $out/summary.txt"
    rm -rf "$work"
}

# 0. The carried wheels, installed beside the machine's packages; then every requirement
#    checked (lptrain's declared torch range too), every module imported, the tests collected.
shopt -s nullglob
wheels=(.whl/*.whl)
shopt -u nullglob
if [ ${#wheels[@]} -eq 0 ]; then
    echo "gpu_check: no wheels in .whl/: run python3 scripts/gpu_wheels.py where pip reaches a registry, and carry .whl" \
        | tee "$logs/wheels.log" >&2
    printf '%-16s %-28s %4d s\n' wheels "FAILED (no .whl/*.whl)" 0 | tee -a "$summary"
    status=1
else
    step wheels 20 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" "${wheels[@]}"
fi
export PYTHONPATH="$repo:$site${PYTHONPATH:+:$PYTHONPATH}"
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
    "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
        "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
    "$PY" -c 'import cupy; print("cupy", cupy.__version__)' 2>&1 || echo "cupy: not installed (the peer kernel is skipped)"
} >"$logs/env.txt" 2>&1
step requirements 15 "$PY" scripts/gpu_wheels.py check "$site"
step imports 25 "$PY" -c 'import importlib, pkgutil, lptrain
names = [m.name for m in pkgutil.walk_packages(lptrain.__path__, "lptrain.") if not m.name.endswith("__main__")]
for name in names:
    importlib.import_module(name)
print(len(names), "modules imported")'

if [ "$setup_only" -eq 1 ]; then
    step experiment_plan 60 "$PY" scripts/gpu_experiment.py --setup-only --out "$out/experiment"
    step collect 60 "$PY" -m pytest --collect-only -q -p no:cacheprovider tests
    finish
    exit $status
fi

# 1. The cuda-marked tests, each with a time limit (pytest-timeout), four at a time (pytest-xdist)
#    where those plugins are there.
#    With xdist a test past its limit ends its worker (thread method: stacks dumped, the
#    worker replaced, the other tests go on); without it the limit raises in the test.
options=()
if "$PY" -c 'import xdist' 2>/dev/null; then
    options+=(-n 4)
    "$PY" -c 'import pytest_timeout' 2>/dev/null && options+=(--timeout=60 --timeout-method=thread)
else
    "$PY" -c 'import pytest_timeout' 2>/dev/null && options+=(--timeout=60)
fi
[ -n "${GPU_CHECK_K:-}" ] && options+=(-k "$GPU_CHECK_K") # GPU_CHECK_K: only the cuda tests it selects
step cuda_tests 150 "$PY" -m pytest -m cuda -v -rfEs --durations=15 -p no:cacheprovider "${options[@]}" \
    --junitxml="$logs/cuda_tests.xml" tests

# 2. The schedules on four replicas of the GPU, each with both reduction kernels.
step bench 25 "$PY" -m lptrain.bench --devices cuda:0,cuda:0,cuda:0,cuda:0 --algo lp,mst,be,ring \
    --reduce-kernel peer,staged -b 1M -e 64M -f 8 --trials 3 --target-time 0.05 --json "$logs/bench.json"

# 2b. LP against memcpy at 64 MiB over the four replicas (goal: at least 0.8x), and what one
#     LP allreduce issues on the device: blocks, events recorded, stream waits.
step lp_memcpy 20 "$PY" scripts/gpu_lp_check.py --json "$logs/lp_memcpy.json"

# 3. AlexNet at 224 px on synthetic data, four replicas of the GPU, 25 MiB buckets: each
#    communicator with overlap on and off, the parameters compared.
alexnet=(+recipe=alexnet data=synthetic model.image_size=224 trainer.batch_per_device=32 trainer.bucket_mb=25)
step overlap 45 "$PY" scripts/gpu_overlap_check.py --comm lp,ring -- "${alexnet[@]}" \
    'trainer.devices=[cuda:0,cuda:0,cuda:0,cuda:0]' trainer.device_type=cuda trainer.steps=10

# 4. The same comparison under torchrun with the NCCL backend (one process, one GPU), then
#    the command line itself (its first lines name the buckets), then the benchmark under torchrun.
step torchrun_overlap 30 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 \
    scripts/gpu_overlap_check.py --comm lp -- "${alexnet[@]}" trainer.devices=auto trainer.steps=8
step cli 15 "$PY" -m lptrain "${alexnet[@]}" 'trainer.devices=[cuda:0,cuda:0]' trainer.device_type=cuda \
    trainer.steps=5 trainer.eval_every=0 trainer.checkpoint_every=0 trainer.tensorboard=false \
    trainer.progress=false "hydra.run.dir=$work/runs/cli"
step torchrun_bench 15 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 -m lptrain.bench \
    --algo lp,ring,nccl -b 1M -e 16M --trials 2 --target-time 0.05

# 5. lptrain.ddp's CUDA paths: the hook's CUDA futures and side streams, the backend over NCCL.
step ddp_cuda 25 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 scripts/ddp_gpu_check.py

# 6. The paper's experiment (scripts/gpu_experiment.py), only when named, in a call of its own:
#    GPU_CHECK_STEPS=experiment. AlexNet, GoogLeNet and VGG-16 from their recipes (160, 150 and
#    150 steps) under lp, mst, be, ring, nccl and the reordering control, four replicas sharing
#    one GPU (one replica per GPU on several). Its time guard keeps it within 300 s; the step's
#    limit is the last resort. Its tables are written into OUT_DIR/experiment/ as each run ends.
step experiment 330 "$PY" scripts/gpu_experiment.py --budget 300 --out "$out/experiment" \
    --work "$work/runs/experiment"

finish
exit $status
