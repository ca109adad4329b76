#!/usr/bin/env bash
# Every GPU row of docs/benchmarks.md ("On a GPU") and the DBN rows of docs/reproductions.md, in one go, each
# command's table into $OUT (default bench/out/gpu). About 12 minutes on an H100; needs CUDA, and for the peers
# `pip install -e '.[bench]'` (pyro-ppl, scikit-learn, jax, blackjax). Run from the repository root:
#     bash bench/gpu_rows.sh
set -uo pipefail
OUT=${OUT:-bench/out/gpu}
mkdir -p "$OUT"
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'bench/gpu_rows.sh needs a CUDA device')" || exit 1
run() { local name=$1; shift; echo "== $name: $*"; "$@" > "$OUT/$name.log" 2>&1 || echo "   failed (see $OUT/$name.log)"; }
run sequential_sweeps python bench/sequential_sweeps.py --device cuda \
    --rows pixel_100,pixel_100_sparse,sap_srbm500,sbn200_500,dbn_500,dbn_500_ais --accel auto --baseline-accel none \
    --rounds 2 --calls 5 --threads 4
run ais_rbm python bench/ais_rbm.py --device cuda --chains 100,1000,10000 --num-betas 14500 \
    --accel none,compile,cudagraphs --rounds 3
run profile_hot_loops python bench/profile_hot_loops.py --device cuda --threads 0 --accel none,compile,cudagraphs \
    --repeats 3
run peer_sklearn python bench/peer_sklearn.py --device cuda
run peer_pyro python bench/peer_pyro.py --device cuda --batch-size 100 --val-examples 1000 --updates 2000
run peer_blackjax python bench/peer_blackjax.py --device cuda
run chib_vs_ais python bench/chib_vs_ais.py --checkpoint bench/checkpoints/dbn_mnist.pt --out "$OUT/chib_vs_ais" \
    --log-z-betas 100000 --log-z-chains 1000 --steps 5,10,20,40 --ais-betas 100,1000,10000 --full-test 10000 \
    --full-batch 5000 --device cuda
grep -h "^|" "$OUT"/*.log
