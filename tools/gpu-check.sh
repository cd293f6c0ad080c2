#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU (the CUDA toolkit under $CUDA_HOME, /usr/local/cuda,
# or wherever the nvcc on PATH lives):
#   tools/gpu-check.sh
# builds DTorch with the CUDA backend (release, for this GPU's architecture) in build-gpu/, runs the
# CUDA suite (tests/test_cuda.c: every CUDA kernel against the CPU backend), runs
# tests/python/test_cuda.py against the package staged from that same build (ops against numpy, and
# the Llama's logits on cuda meshes of 1 and 2 actors, tp2 and pp2, against the numpy Llama and the
# cpu mesh), measures GEMM TFLOP/s beside cuBLAS called directly (bench/bench_cuda_matmul), one small
# op's cost beside the CUDA calls it makes (bench/bench_cuda_op_cost) and the decode loop's GPU-busy
# fraction at batch 1 (bench/bench_decode_busy.py, from CUDA events), then prints what passed. On a
# GPU machine a skipped test means the GPU could not be used, so a skip fails the check as a failure
# does. Logs: build-gpu/gpu-check/.
#
# What it needs: a C compiler, the CUDA toolkit, and a Python with numpy, pytest, meson and ninja
# (the venv tools/run.sh makes, or else the machine's python3; where neither has them, a new venv
# from PyPI). Where the machine's pkg-config finds no ZeroMQ, CZMQ, msgpack-c, OpenBLAS or
# Criterion and cannot install them, .gpu-deps/deps.tar.xz (tools/gpu-deps.sh, made on a Debian
# machine that has them) supplies them: the libraries and all they load, their headers, pkgconf.
# About a minute of building on 16 cores, most of it nvcc, then a few minutes of tests.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
LOG=$ROOT/build-gpu/gpu-check
mkdir -p "$LOG"
status=0
log() { echo "== $*"; }

# ---- the toolkit ---------------------------------------------------------------------------------
if [ -z "${CUDA_HOME:-}" ] && [ ! -x /usr/local/cuda/bin/nvcc ] && command -v nvcc >/dev/null; then
    CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    export CUDA_HOME
fi
export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
    arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
fi
arch=${arch:-90}
echo "CUDA toolkit: ${CUDA_HOME:-/usr/local/cuda} ($(nvcc --version | grep -o 'release [0-9.]*')), kernels for sm_$arch"

# ---- Python --------------------------------------------------------------------------------------
has_tools() {
    "$1" -c "import numpy, pytest, mesonbuild" 2>/dev/null \
        && { "$1" -c "import ninja" 2>/dev/null || command -v ninja >/dev/null; }
}
if has_tools "$ROOT/.venv/bin/python"; then
    PY=$ROOT/.venv/bin/python
elif has_tools "$(command -v python3)"; then
    PY=$(command -v python3)
else
    log "creating $ROOT/.venv (meson, ninja, numpy, pytest from PyPI)"
    [ -x "$ROOT/.venv/bin/python" ] || python3 -m venv "$ROOT/.venv" || exit 1
    "$ROOT/.venv/bin/pip" install -q --disable-pip-version-check numpy meson ninja pytest ml_dtypes || exit 1
    PY=$ROOT/.venv/bin/python
fi
PATH="$(dirname "$PY"):$PATH"
NINJA_BIN=$("$PY" -c "import ninja, os; print(os.path.join(ninja.BIN_DIR, 'ninja'))" 2>/dev/null)
[ -x "$NINJA_BIN" ] && export NINJA="$NINJA_BIN"
MESON=("$PY" -m mesonbuild.mesonmain)
echo "Python: $PY ($("$PY" -c 'import sys, numpy; print(sys.version.split()[0], "numpy", numpy.__version__)'))"

# ---- the libraries, from .gpu-deps where this machine lacks them --------------------------------
have_libs() {
    pkg-config --exists libzmq libczmq openblas criterion 2>/dev/null \
        && { pkg-config --exists msgpack-c 2>/dev/null || pkg-config --exists msgpack 2>/dev/null; }
}
if ! have_libs; then
    [ -f .gpu-deps/deps.tar.xz ] || { echo "no ZeroMQ/CZMQ/msgpack-c/OpenBLAS/Criterion here, and no .gpu-deps/deps.tar.xz (tools/gpu-deps.sh)"; exit 1; }
    DEPS=$ROOT/build-gpu/deps
    rm -rf "$DEPS" && mkdir -p "$DEPS" && tar -C "$DEPS" -xJf .gpu-deps/deps.tar.xz || exit 1
    # all of them, found through the binaries' own search path (DT_RPATH, which covers the libraries
    # they load in turn): a packed library gets the packed versions of what it needs (krb5's go
    # together), while the machine's own programs (python3 and its modules) keep the machine's
    echo "libraries from .gpu-deps: $(cd "$DEPS/lib" && ls *.so.* | tr '\n' ' ')"
    export PKG_CONFIG_PATH=$DEPS/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    export LDFLAGS="-Wl,--disable-new-dtags,-rpath,$DEPS/lib${LDFLAGS:+ $LDFLAGS}"
    if ! command -v pkg-config >/dev/null; then
        printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$DEPS/lib" "$DEPS/bin/pkgconf" > "$DEPS/bin/pkg-config"
        chmod +x "$DEPS/bin/pkg-config"
        export PATH=$DEPS/bin:$PATH
    fi
fi

# ---- build ---------------------------------------------------------------------------------------
log "building with the CUDA backend (build-gpu, release, sm_$arch)"
if [ ! -f build-gpu/build.ninja ]; then
    if ! "${MESON[@]}" setup build-gpu -Dbuildtype=release -Dcuda=enabled -Dnvcc_archs="$arch" \
            > "$LOG/setup.log" 2>&1; then
        tail -30 "$LOG/setup.log"
        echo "meson setup failed"
        exit 1
    fi
fi
if ! "${MESON[@]}" compile -C build-gpu > "$LOG/build.log" 2>&1; then
    grep -E "error|FAILED|undefined" "$LOG/build.log" | head -30
    echo "the CUDA build failed"
    exit 1
fi
export DTORCH_WORKER_PATH=$ROOT/build-gpu/dtorch-worker ZSYS_SIGHANDLER=false OPENBLAS_NUM_THREADS=1

# ---- the C suite ---------------------------------------------------------------------------------
log "test_cuda (the CUDA backend against the CPU backend)"
timeout 240 build-gpu/tests/test_cuda --tap="$LOG/test_cuda.tap" -j4 > "$LOG/test_cuda.out" 2>&1
echo "test_cuda exit $?"
c_pass=$(grep -c "^ok " "$LOG/test_cuda.tap" 2>/dev/null)
c_skip=$(grep -c "^ok .*# SKIP" "$LOG/test_cuda.tap" 2>/dev/null)
c_fail=$(grep -c "^not ok" "$LOG/test_cuda.tap" 2>/dev/null)
c_pass=$((${c_pass:-0} - ${c_skip:-0}))
grep -E "^not ok|# SKIP" "$LOG/test_cuda.tap" | head -30
grep -E "test_cuda.c:[0-9]+|Assertion|CRASH|[Tt]imed out" -m 60 "$LOG/test_cuda.out"
echo "test_cuda: $c_pass passed, ${c_fail:-0} failed, ${c_skip:-0} skipped"
[ "${c_fail:-0}" -eq 0 ] && [ "${c_skip:-0}" -eq 0 ] && [ "$c_pass" -gt 0 ] || status=1

# ---- the Python suite, on the package staged from build-gpu --------------------------------------
log "tests/python/test_cuda.py (the package from build-gpu)"
PKG=$ROOT/build-gpu/pkg
rm -rf "$PKG" && mkdir -p "$PKG" && cp -r bindings/dtorch "$PKG/" && cp -r python/dtorch/. "$PKG/dtorch/" \
    && ln -s "$ROOT"/build-gpu/bindings/_C*.so "$ROOT/build-gpu/dtorch-worker" "$PKG/dtorch/"
export PYTHONPATH=$PKG
(cd tests/python && timeout 300 "$PY" -m pytest -q -rs -p no:cacheprovider --junitxml="$LOG/pytest.xml" \
    test_cuda.py) > "$LOG/pytest.out" 2>&1
echo "pytest exit $?"
grep -E "^(FAILED|ERROR|SKIPPED)|Error|assert" "$LOG/pytest.out" | head -40
tail -3 "$LOG/pytest.out"
read -r p_pass p_fail p_skip <<< "$("$PY" - "$LOG/pytest.xml" <<'PY' 2>/dev/null || echo "0 1 0"
import sys, xml.etree.ElementTree as ET
s = ET.parse(sys.argv[1]).getroot()
s = s if s.tag == "testsuite" else s.find("testsuite")
n, f, e, k = (int(s.get(a, 0)) for a in ("tests", "failures", "errors", "skipped"))
print(n - f - e - k, f + e, k)
PY
)"
echo "test_cuda.py: $p_pass passed, $p_fail failed, $p_skip skipped"
[ "$p_fail" -eq 0 ] && [ "$p_skip" -eq 0 ] && [ "$p_pass" -gt 0 ] || status=1

# ---- the figures ---------------------------------------------------------------------------------
log "GEMM: DTorch's matmul beside cuBLAS called directly (bench/bench_cuda_matmul.c)"
timeout 120 build-gpu/bench/bench_cuda_matmul > "$LOG/bench_cuda_matmul.out" 2>&1
bench_rc=$?
cat "$LOG/bench_cuda_matmul.out"
[ $bench_rc -eq 0 ] || { echo "bench_cuda_matmul failed (exit $bench_rc)"; status=1; }

log "one small op on a GPU actor beside the CUDA calls it makes (bench/bench_cuda_op_cost.c)"
timeout 120 build-gpu/bench/bench_cuda_op_cost > "$LOG/bench_cuda_op_cost.out" 2>&1
cost_rc=$?
cat "$LOG/bench_cuda_op_cost.out"
[ $cost_rc -eq 0 ] || { echo "bench_cuda_op_cost failed (exit $cost_rc)"; status=1; }

log "decode at batch 1: the GPU's busy fraction from its own timeline (bench/bench_decode_busy.py)"
timeout 180 "$PY" bench/bench_decode_busy.py --device cuda > "$LOG/decode_busy.out" 2>&1
busy_rc=$?
tail -20 "$LOG/decode_busy.out"
[ $busy_rc -eq 0 ] || { echo "bench_decode_busy failed (exit $busy_rc)"; status=1; }

log "summary"
echo "$((c_pass + p_pass)) passed, $((${c_fail:-0} + p_fail + ${c_skip:-0} + p_skip)) failed or skipped"
[ $bench_rc -eq 0 ] && sed -n '/TFLOP/,$p' "$LOG/bench_cuda_matmul.out"
[ $cost_rc -eq 0 ] && sed -n '/(a)/,$p' "$LOG/bench_cuda_op_cost.out"
[ $busy_rc -eq 0 ] && sed -n '/tok\/s/,$p' "$LOG/decode_busy.out"
[ $status -eq 0 ] && echo "the CUDA backend passes on this GPU" || echo "the CUDA check FAILED (logs in $LOG)"
exit $status
