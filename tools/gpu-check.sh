#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU (the CUDA toolkit under $CUDA_HOME or /usr/local/cuda):
#   tools/gpu-check.sh
# builds DTorch with the CUDA backend (release, -Dcuda=enabled) in build-gpu/, runs the CUDA suite
# (tests/test_cuda.c: every CUDA kernel against the CPU backend), installs the package built the same
# way into .venv and runs tests/python/test_cuda.py (ops against numpy, and the Llama's logits on
# cuda meshes of 1 and 2 actors, tp2 and pp2, against the numpy Llama and the cpu mesh), measures
# GEMM TFLOP/s beside cuBLAS called directly (bench/bench_cuda_matmul) and the decode loop's GPU-busy
# fraction at batch 1 (bench/bench_decode_busy.py, from CUDA events), then prints what passed. On a
# GPU machine a skipped test means the GPU could not be used, so a skip fails the check as a failure
# does.
# Uses the venv tools/run.sh makes (creating it, and installing meson, ninja, numpy and pytest from
# PyPI, only when it is missing). About 3 minutes on 16 cores, most of it nvcc.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/.venv
export PATH="$VENV/bin:$PATH"
LOG=$ROOT/build-gpu/gpu-check
status=0

if ! "$VENV/bin/python" -c "import numpy, mesonpy, pytest" 2>/dev/null || [ ! -x "$VENV/bin/meson" ]; then
    echo "== creating $VENV (meson, ninja, numpy, pytest from PyPI)"
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" || exit 1
    "$VENV/bin/pip" install -q --disable-pip-version-check numpy meson-python meson ninja pytest ml_dtypes || exit 1
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

echo "== building with the CUDA backend (build-gpu, release)"
if [ ! -f build-gpu/build.ninja ]; then
    "$VENV/bin/meson" setup build-gpu -Dbuildtype=release -Dcuda=enabled >/dev/null || exit 1
fi
mkdir -p "$LOG"
if ! "$VENV/bin/meson" compile -C build-gpu > "$LOG/build.log" 2>&1; then
    grep -E "error|FAILED" "$LOG/build.log" | head -20
    echo "the CUDA build failed"
    exit 1
fi

echo "== test_cuda (the CUDA backend against the CPU backend)"
DTORCH_WORKER_PATH=$ROOT/build-gpu/dtorch-worker ZSYS_SIGHANDLER=false \
    timeout 300 build-gpu/tests/test_cuda --tap="$LOG/test_cuda.tap" -j4 > "$LOG/test_cuda.out" 2>&1
c_pass=$(grep -c "^ok " "$LOG/test_cuda.tap" | tr -d ' ')
c_skip=$(grep -c "^ok .*# SKIP" "$LOG/test_cuda.tap" | tr -d ' ')
c_fail=$(grep -c "^not ok" "$LOG/test_cuda.tap" | tr -d ' ')
c_pass=$((c_pass - c_skip))
grep -E "^not ok|# SKIP" "$LOG/test_cuda.tap" | head -20
grep -E "^ +(Assertion|.*test_cuda.c:[0-9]+)" -m 40 "$LOG/test_cuda.out"
echo "test_cuda: $c_pass passed, $c_fail failed, $c_skip skipped"
[ "$c_fail" -eq 0 ] && [ "$c_skip" -eq 0 ] && [ "$c_pass" -gt 0 ] || status=1

echo "== the Python package with the CUDA backend, and tests/python/test_cuda.py"
if "$VENV/bin/pip" install -q --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps \
    --config-settings=setup-args=-Dcuda=enabled --config-settings=build-dir="$ROOT/build-py-gpu" "$ROOT" \
    > "$LOG/pip.log" 2>&1; then
    (cd tests/python && timeout 300 "$VENV/bin/python" -m pytest -q -rs -p no:cacheprovider \
        --junitxml="$LOG/pytest.xml" test_cuda.py) | tee "$LOG/pytest.out" | tail -15
    py=$("$VENV/bin/python" - "$LOG/pytest.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
s = ET.parse(sys.argv[1]).getroot()
s = s if s.tag == "testsuite" else s.find("testsuite")
n, f, e, k = (int(s.get(a, 0)) for a in ("tests", "failures", "errors", "skipped"))
print(n - f - e - k, f + e, k)
PY
) || py="0 1 0"
    read -r p_pass p_fail p_skip <<< "$py"
else
    tail -20 "$LOG/pip.log"
    p_pass=0 p_fail=1 p_skip=0
fi
echo "test_cuda.py: $p_pass passed, $p_fail failed, $p_skip skipped"
[ "$p_fail" -eq 0 ] && [ "$p_skip" -eq 0 ] && [ "$p_pass" -gt 0 ] || status=1

echo "== GEMM: DTorch's matmul beside cuBLAS called directly (bench/bench_cuda_matmul.c)"
DTORCH_WORKER_PATH=$ROOT/build-gpu/dtorch-worker ZSYS_SIGHANDLER=false \
    timeout 300 build-gpu/bench/bench_cuda_matmul > "$LOG/bench_cuda_matmul.out" 2>&1
bench_rc=$?
cat "$LOG/bench_cuda_matmul.out"
[ $bench_rc -eq 0 ] || { echo "bench_cuda_matmul failed (exit $bench_rc)"; status=1; }

echo "== decode at batch 1: the GPU's busy fraction from its own timeline (bench/bench_decode_busy.py)"
timeout 300 "$VENV/bin/python" bench/bench_decode_busy.py --device cuda > "$LOG/decode_busy.out" 2>&1
busy_rc=$?
cat "$LOG/decode_busy.out" | tail -20
[ $busy_rc -eq 0 ] || { echo "bench_decode_busy failed (exit $busy_rc)"; status=1; }

echo "== summary"
echo "$((c_pass + p_pass)) passed, $((c_fail + p_fail + c_skip + p_skip)) failed"
[ $bench_rc -eq 0 ] && sed -n '/TFLOP/,$p' "$LOG/bench_cuda_matmul.out"
[ $busy_rc -eq 0 ] && sed -n '/tok\/s/,$p' "$LOG/decode_busy.out"
[ $status -eq 0 ] && echo "the CUDA backend passes on this GPU" || echo "the CUDA check FAILED (logs in $LOG)"
exit $status
