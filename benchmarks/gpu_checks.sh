#!/usr/bin/env bash
# The GPU checks in one run, for a lent machine with a CUDA device and no package registry:
#   one process as one rank of 8 (bench_simulate.py: every layout at Llama-3-8B and -70B layer shapes,
#   seq 4096, then 8192 for shardcore alone), the GPU benchmark at TP=1 (bench_gpu.py, 3 runs,
#   repeat.py) and the GPU test subset (pytest -m gpu): within 10 minutes of device time.
#
#   python -m pip wheel --no-deps --no-build-isolation -w .whl . plugins/shard-*   # here, where pip works
#   bash benchmarks/gpu_checks.sh [OUT_DIR] [bench_gpu.py args...]                  # there
#
# The wheels (.whl/) install with --no-deps into /tmp/site over the machine's own torch and
# transformers (their versions are printed first). Each part has its own time bound and log, and a
# failing part does not stop the next; the exit status is the first failure's.
set -u
out=${1:-${OUT:-/tmp/gpu-out}}
shift || true
mkdir -p "$out"
status=0
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch, transformers, shardcore; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), '| transformers', transformers.__version__, '| shardcore from', shardcore.__file__)"
    python3 -m shardcore plugins
} 2>&1 | tee "$out/versions.txt"

part() {  # part NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    echo "=== $name (at most ${limit}s) ==="
    local start=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    tail -n 40 "$out/$name.log"
    echo "=== $name: exit $rc in $((SECONDS - start))s ==="
    [ $rc -ne 0 ] && [ $status -eq 0 ] && status=$rc
}

part simulate-4096 "${SIMULATE_LIMIT:-230}" python3 benchmarks/bench_simulate.py --seq 4096 --out "$out/simulate_4096.json"
part simulate-8192 "${SIMULATE_8192_LIMIT:-100}" python3 benchmarks/bench_simulate.py --seq 8192 --contestants shardcore --out "$out/simulate_8192.json"
part bench-gpu "${BENCH_GPU_LIMIT:-110}" python3 benchmarks/repeat.py --name gpu -- python3 benchmarks/bench_gpu.py "$@"
cp benchmarks/results/gpu.json "$out/gpu.json" 2>/dev/null
part gpu-tests "${GPU_TESTS_LIMIT:-130}" python3 -m pytest -m gpu -p no:cacheprovider -rA tests/integration/test_llama_gpu.py plugins/shard-llama/tests/test_llama_kernels.py
exit $status
