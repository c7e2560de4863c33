#!/usr/bin/env bash
# One prepared GPU check for lmcache-cuda (tests + bench + the SGLang connector on CUDA),
# sized for < 8 min on one H200.
#
# Here (no GPU, network): fetch the core's runtime deps the GPU image lacks, once:
#     benchmarks/gpu_check.sh --prepare          # -> .whl/ (git-ignored)
# Then with the device tool, from the repo root:
#     run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=540)
# Results land in $OUT: build.log, pytest.log, bench.log, bench.json, sglang.log, env.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"

if [[ "${1:-}" == "--prepare" ]]; then
    mkdir -p .whl
    $PY -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux_2_28_x86_64 -d .whl msgspec pyzmq
    exit $?
fi

SITE=/tmp/lmcache-site
rm -rf "$SITE" /tmp/lmcache-wheels && mkdir -p "$SITE" /tmp/lmcache-wheels
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{
    nvidia-smi -L; nvcc --version | tail -1
    $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
} 2>&1 | tee "$OUT/env.txt"

step() { echo "== $*"; }
step "install carried wheels (msgspec, pyzmq) and lmcache-core"
if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --target "$SITE" .whl/*.whl || exit 1
fi
$PY -m pip wheel -q --no-deps --no-build-isolation -w /tmp/lmcache-wheels packages/lmcache-core \
    || exit 1

step "build lmcache-cuda with nvcc (sm_90 only, 16 jobs)"
start=$(date +%s)
LMCACHE_CUDA_REQUIRE_NATIVE=ON CMAKE_BUILD_PARALLEL_LEVEL=16 \
    CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=90-real" \
    $PY -m pip wheel --no-deps --no-build-isolation -w /tmp/lmcache-wheels plugins/lmcache-cuda \
    >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "build took $(( $(date +%s) - start )) s" | tee -a "$OUT/build.log"
$PY -m pip install -q --no-index --no-deps --target "$SITE" /tmp/lmcache-wheels/*.whl || exit 1

step "tests (GPU + CPU) of the plugin"
rc=0
timeout 330 $PY -m pytest -q -rs -p no:cacheprovider plugins/lmcache-cuda/tests \
    2>&1 | tee "$OUT/pytest.log"
rc=${PIPESTATUS[0]}

step "bench: native vs torch baseline vs memcpy bound"
timeout 120 $PY plugins/lmcache-cuda/benchmarks/bench_cuda_ops.py --json "$OUT/bench.json" \
    2>&1 | tee "$OUT/bench.log"
brc=${PIPESTATUS[0]}

step "lmcache bench ops (selected backend)"
timeout 60 $PY -m lmcache.cli.main bench ops --quick --json "$OUT/bench_ops.json" 2>&1 | tail -25

step "SGLang connector on CUDA: KV pools on the GPU, both transfer modes, real server"
# SGLang itself (CUDA wheels, gigabytes) cannot reach this machine (no network, 64 MiB
# carry): the connector runs with SGLang-shaped pools (tests/integration/sglang), and a
# real `sglang --enable-lmcache` run happens only where the image already has SGLang.
LMCACHE_SGLANG_TEST_DEVICE=cuda timeout 100 $PY -m pytest -q -rs -p no:cacheprovider \
    tests/integration/sglang/test_unified_connector.py 2>&1 | tee "$OUT/sglang.log" | tail -5
src=${PIPESTATUS[0]}
if $PY -c "import sglang" 2>/dev/null; then
    echo "SGLang is installed here: $($PY -c 'import sglang; print(sglang.__version__)')" \
        | tee -a "$OUT/sglang.log"
else
    echo "SGLang not installed on this image: real sglang --enable-lmcache CUDA run skipped" \
        | tee -a "$OUT/sglang.log"
fi

echo "pytest rc=$rc bench rc=$brc sglang rc=$src"
exit $(( rc != 0 || brc != 0 || src != 0 ))
