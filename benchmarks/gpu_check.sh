#!/usr/bin/env bash
# GPU check for the kernels: correctness on the device, then speed against each figure's ceiling.
#
#   bash benchmarks/gpu_check.sh            (from anywhere; one GPU; finishes within BUDGET_S, default 470 s)
#
# Environment: PYTHON (use this interpreter as is), VENV (default .venv), BUDGET_S (total seconds),
# FLASH_ATTN_WHEEL (a local flash-attn wheel to install), GPU_CHECK_OUT (folder for the results; default
# $OUT, where a rented device machine returns files from, else /tmp/servesim_gpu_check).
#
# What comes back is at most five files, none in a subfolder (a device machine returns at most 8 files,
# 2 folders down): gpu_check.log (everything printed), kernels.json, offline.jsonl (one JSON line per
# CUDA-graph run), h200-small-bfloat16.json (the GPU profile) and runs.tgz (the run directories).
# Wheels in .whl/ (pydantic, simpy, plotly... for a machine image without them and without a network)
# are installed into /tmp/servesim_site first, and a .whl/flash_attn-*.whl with them.
#
# Python, in this order: $PYTHON; $VENV if its torch sees a GPU; a machine image whose python3 already
# has a CUDA torch (used in a --system-site-packages venv, installing nothing from the network, so it
# works on machines without internet); otherwise a new $VENV with `pip install -e '.[test,triton]'`
# (the pinned torch wheel for Linux x86-64 is a CUDA build). flash-attn is installed only from a
# prebuilt wheel (PyPI ships source only, and building it takes far longer than this check's budget);
# without it the flash-attn tests and comparisons are skipped and say so.
#
# Figures measured, and their targets:
#   1. reshape_and_cache achieved bandwidth (bytes read + written / time), Triton and CUDA kernels,
#      against a 1 GiB tensor.copy_ timed the same way: target >= 80% of copy bandwidth at 65536 tokens.
#   2. paged decode (one query token per request, 32/8 heads x 128, bf16, 256-token blocks) Triton vs
#      flash-attn's flash_attn_with_kvcache on the same inputs: target Triton <= 1.3x flash-attn's time.
#   3. decode throughput with CUDA graphs vs without, small default model in bfloat16, through
#      `python -m benchmarks.offline --device cuda --cuda-graphs on|off --no-baseline`: target >= 1.5x at
#      max_num_seqs 1 (also measured at 64).
#   4. the closing-the-loop pipeline on CUDA: a real run of gpu_calibrate, `sim.calibrate` on it (the GPU
#      profile), and `sim.validate` of gpu_chat, gpu_overload and gpu_shared_prefix against that profile.
# Every step runs under `timeout`, capped by what is left of the budget; a summary ends the output.

# shellcheck disable=SC2317  # the functions below also run through `bash -c`, which shellcheck cannot see
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 1
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "benchmarks/gpu_check.sh needs an NVIDIA GPU (nvidia-smi finds none): nothing checked, nothing installed."
  exit 1
fi
SITE=/tmp/servesim_site  # the wheels of .whl/, installed without a network
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
START=$(date +%s)
BUDGET_S=${BUDGET_S:-470}
VENV=${VENV:-.venv}
# --all: nproc alone follows OMP_NUM_THREADS, and a 1 there would run the GPU tests one at a time.
WORKERS=${WORKERS:-$(($(nproc --all) > 8 ? 8 : $(nproc --all)))}
OUT_DIR=${GPU_CHECK_OUT:-${OUT:-/tmp/servesim_gpu_check}}
WORK_DIR=/tmp/servesim_gpu_work  # run directories: packed into $OUT_DIR/runs.tgz at the end
mkdir -p "$OUT_DIR" "$WORK_DIR"
# Everything printed also goes to the log: a device machine returns only the last 12,000 characters.
exec > >(tee -a "$OUT_DIR/gpu_check.log") 2>&1
SUMMARY=()
FAILED=0
# Seconds held back for the last step (the real runs, about 100-150 s on an H200): earlier steps are
# capped so that it always gets them.
RESERVE_S=0

remaining() { echo $((BUDGET_S - ($(date +%s) - START))); }

# step NAME LIMIT_S COMMAND...: run under timeout (capped by the budget left), record the verdict.
step() {
  local name=$1 limit=$2 left t0 rc verdict
  shift 2
  left=$(($(remaining) - RESERVE_S))
  if ((left < 15)); then
    SUMMARY+=("$name: skipped, time budget spent")
    echo "### $name: skipped, time budget spent"
    return 124
  fi
  ((limit > left)) && limit=$left
  echo
  echo "### $name (limit ${limit}s)"
  t0=$(date +%s)
  if declare -F "$1" >/dev/null; then
    # timeout runs programs, not shell functions: give the function to a child bash (see export -f below).
    # pipefail again: a child bash does not inherit it, and `cmd | tee` would report tee's success.
    timeout --kill-after=5 "$limit" bash -o pipefail -c '"$@"' _ "$@"
  else
    timeout --kill-after=5 "$limit" "$@"
  fi
  rc=$?
  case $rc in
    0) verdict=ok ;;
    124 | 137) verdict="TIMED OUT after ${limit}s" ;;
    *) verdict="FAILED (exit $rc)" ;;
  esac
  SUMMARY+=("$name: $verdict in $(($(date +%s) - t0))s")
  return $rc
}

cuda_torch() { "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; }

# Runs in a child shell (under timeout), so it reports its choice through $WORK_DIR/python.
choose_python() {
  local py
  if [[ -n ${PYTHON:-} ]]; then
    py=$PYTHON
  elif [[ -x $VENV/bin/python ]] && cuda_torch "$VENV/bin/python"; then
    py=$VENV/bin/python
  elif command -v python3 >/dev/null && cuda_torch python3 \
    && python3 -c 'import sys; sys.exit(0 if sys.prefix != sys.base_prefix else 1)'; then
    # The image's python3 is itself a venv with a CUDA torch: used as it is (a --system-site-packages venv
    # over it would see the base interpreter's packages, not its torch).
    py=$(command -v python3)
  elif command -v python3 >/dev/null && cuda_torch python3; then
    # The image's CUDA torch, triton, pytest... are reused; only the project itself is added.
    local env_dir=${VENV}_system
    [[ -x $env_dir/bin/python ]] || python3 -m venv --system-site-packages "$env_dir" || return 1
    py=$env_dir/bin/python
    "$py" -m pip install -q --no-deps --no-build-isolation -e . \
      || echo "(editable install failed; the project is found through PYTHONPATH instead)"
  else
    [[ -x $VENV/bin/python ]] || python3 -m venv "$VENV" || return 1
    py=$VENV/bin/python
    "$py" -m pip install -q -e '.[test,triton]' || return 1
  fi
  cuda_torch "$py" || { echo "$py has no torch that sees a GPU"; return 1; }
  echo "using $py"
  echo "$py" >"$WORK_DIR/python"
}

# The project's pure-Python dependencies from .whl/ (no network needed), for an image that lacks them.
install_wheels() {
  local wheels=(.whl/*.whl)
  [[ -e ${wheels[0]} ]] || { echo "no wheels in .whl/: the interpreter's own packages are used"; return 0; }
  if "$PY" -c 'import pydantic, simpy, plotly, yaml, pyarrow, rich, tqdm' 2>/dev/null; then
    echo "the interpreter has the project's dependencies already: .whl/ not needed"
    return 0
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "${wheels[@]}"
}

install_flash_attn() {
  if "$PY" -c 'import flash_attn' 2>/dev/null; then
    echo "flash-attn already installed"
  elif [[ -n ${FLASH_ATTN_WHEEL:-} ]]; then
    "$PY" -m pip install -q --no-deps "$FLASH_ATTN_WHEEL"
  else
    # PyPI ships flash-attn as source only, and the machine may have no network: only a local wheel.
    echo "no flash-attn wheel (FLASH_ATTN_WHEEL, or .whl/flash_attn-*.whl installed with the wheels above):"
    echo "flash-attn tests and comparisons are skipped"
  fi
}

report_environment() {
  nvidia-smi -L || true
  "$PY" - <<'EOF'
import importlib.util, sys, torch
print(f"python {sys.version.split()[0]}  torch {torch.__version__}  cuda {torch.version.cuda}  "
      f"device {torch.cuda.get_device_name() if torch.cuda.is_available() else 'NONE'}")
for name in ("triton", "flash_attn", "ninja", "pytest", "transformers"):
    spec = importlib.util.find_spec(name)
    version = getattr(__import__(name), "__version__", "?") if spec else "missing"
    print(f"  {name}: {version}")
EOF
}

cuda_graph_throughput() {
  local mode seqs requests
  # Batch 1 is the target's case (launch-bound decode); a fuller batch shows what graphs are worth there.
  for seqs in 1 64; do
    requests=$((seqs == 1 ? 8 : 256))
    for mode in off on; do
      echo "--- max_num_seqs $seqs, $requests requests, cuda graphs $mode"
      "$PY" -m benchmarks.offline --device cuda --dtype bfloat16 --cuda-graphs "$mode" --max-num-seqs "$seqs" \
        --num-requests "$requests" --no-baseline --json | tee -a "$OUT_DIR/offline.jsonl" || return $?
    done
  done
  echo "target: output-token throughput with graphs on >= 1.5x off at max_num_seqs 1"
}

# The closing-the-loop pipeline on the GPU: a calibration run, its profile, then validations on three
# other workloads (run directories without dashboards, small enough to bring back).
real_runs_on_cuda() {
  local runs=$WORK_DIR/runs profile=$OUT_DIR/h200-small-bfloat16.json workload
  local flags=(--device cuda --dtype bfloat16 --no-dashboard --no-progress)
  "$PY" -m sim.run workloads/examples/gpu_calibrate.yaml --executor real "${flags[@]}" --quiet \
    --out "$runs/gpu-calibrate" || return $?
  "$PY" -m sim.calibrate "$runs/gpu-calibrate" -o "$profile" | tail -3 || return $?
  for workload in gpu_chat gpu_overload gpu_shared_prefix; do
    "$PY" -m sim.validate "workloads/examples/$workload.yaml" --profile "$profile" "${flags[@]}" \
      --out "$runs/validate-$workload" || return $?
  done
  # Decode-only vs mixed step medians and the longest step of each run: a compilation or a new-shape
  # surcharge inside a measured step shows up here.
  "$PY" -m benchmarks.step_medians "$runs/gpu-calibrate" "$runs"/validate-*/real
}

# One archive instead of dozens of files three folders down, which a device machine would not return.
pack_runs() {
  [[ -d $WORK_DIR/runs ]] || return 0
  tar -czf "$OUT_DIR/runs.tgz" -C "$WORK_DIR" runs && echo "run directories packed into $OUT_DIR/runs.tgz"
}

export -f cuda_torch choose_python install_wheels install_flash_attn report_environment cuda_graph_throughput \
  real_runs_on_cuda
export VENV OUT_DIR WORK_DIR SITE
rm -f "$WORK_DIR/python" "$OUT_DIR/offline.jsonl"
step "environment" 300 choose_python || { echo "no usable Python with a CUDA torch"; FAILED=1; }
PY=$(cat "$WORK_DIR/python" 2>/dev/null || true)
export PY
if [[ -n $PY ]]; then
  step "wheels from .whl/" 60 install_wheels || FAILED=1
  step "flash-attn install" 60 install_flash_attn
  RESERVE_S=150  # for the real runs, whatever the steps before them take
  step "environment report" 30 report_environment
  # Many small Triton compilations: spread them over the machine's cores.
  step "tests/kernels on the GPU" 150 "$PY" -m pytest tests/kernels -q -rs -p no:cacheprovider -n "$WORKERS" \
    || FAILED=1
  step "tests/runner (CUDA graphs, flash-attn and device tests), KV offloading, speculative decoding, DeepSeek, gpt-oss, Llama 4, images" \
    120 "$PY" -m pytest tests/runner tests/engine/test_kv_offloading_real.py tests/engine/test_spec_decode_real.py \
    tests/engine/test_spec_decode_draft_model.py tests/engine/test_spec_decode_eagle.py tests/models/test_deepseek_model.py tests/models/test_gpt_oss_model.py \
    tests/models/test_llama4_model.py tests/models/test_default_vision_model.py -q -rs -p no:cacheprovider \
    -n "$WORKERS" \
    || FAILED=1
  step "kernel benchmark" 120 "$PY" -m benchmarks.kernels --quick --save "$OUT_DIR/kernels.json" || FAILED=1
  step "CUDA-graph decode throughput" 90 cuda_graph_throughput || FAILED=1
  RESERVE_S=0
  step "real runs on CUDA: calibrate, then validate" 150 real_runs_on_cuda || FAILED=1
  pack_runs
fi

echo
echo "=== gpu_check summary ($(($(date +%s) - START))s of ${BUDGET_S}s budget; results in $OUT_DIR)"
printf '  %s\n' "${SUMMARY[@]}"
exit $FAILED
