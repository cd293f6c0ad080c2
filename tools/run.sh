#!/usr/bin/env bash
# One entry point for a fresh Debian 12 machine (as root) or a developer's checkout:
#   tools/run.sh demo    install what is missing, build, run examples/demo.py
#   tools/run.sh test    install what is missing, build, run every C and Python test
# Idempotent: a second run installs nothing and rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/.venv

APT_PACKAGES=(gcc libc6-dev pkg-config ninja-build libzmq3-dev libczmq-dev libmsgpack-dev libcriterion-dev
              libopenblas-dev python3 python3-venv python3-dev)
PY_PACKAGES=(numpy pytest meson-python meson ninja)

setup() {
    local missing=()
    for p in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if ((${#missing[@]})); then
        echo "== installing Debian packages: ${missing[*]}"
        local sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    if [ ! -x "$VENV/bin/python" ]; then
        echo "== creating $VENV"
        python3 -m venv "$VENV"
    fi
    if ! "$VENV/bin/python" -c "import numpy, pytest, mesonpy" 2>/dev/null; then
        echo "== installing Python packages: ${PY_PACKAGES[*]}"
        "$VENV/bin/pip" install -q --upgrade pip
        "$VENV/bin/pip" install -q "${PY_PACKAGES[@]}"
    fi
    echo "== building and installing dtorch into $VENV"
    "$VENV/bin/pip" install -q --no-build-isolation --force-reinstall --no-deps "$ROOT"
}

# A meson build directory of the C runtime with its tests; extra args go to meson setup.
c_build() {
    local dir=$1; shift
    if [ ! -f "$dir/build.ninja" ]; then
        "$VENV/bin/meson" setup "$dir" "$@" >/dev/null
    fi
    "$VENV/bin/meson" compile -C "$dir" >/dev/null
}

run_tests() {
    export PATH="$VENV/bin:$PATH"
    local status=0
    echo "== C tests (Criterion)"
    c_build build-test -Dbuildtype=debugoptimized
    meson test -C build-test --print-errorlogs --num-processes 2 || status=1
    echo "== C tests under AddressSanitizer (leaks are failures)"
    c_build build-asan -Dbuildtype=debug -Db_sanitize=address
    # Criterion passes a test whose process LeakSanitizer reports at exit, and --tap=- loses the
    # report: every sanitized process writes its reports to a file instead, and any file fails
    rm -rf build-asan/asan-logs && mkdir -p build-asan/asan-logs
    ASAN_OPTIONS=detect_leaks=1:log_path=$ROOT/build-asan/asan-logs/asan \
        meson test -C build-asan --print-errorlogs --num-processes 2 || status=1
    if [ -n "$(ls -A build-asan/asan-logs)" ]; then
        cat build-asan/asan-logs/* | head -80
        echo "AddressSanitizer reported errors or leaks"
        status=1
    fi
    echo "== Python tests (pytest), thread and process workers"
    (cd "$ROOT/tests/python" && "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
        --junitxml="$ROOT/build-test/pytest.xml" .) || status=1
    "$VENV/bin/python" "$ROOT/tools/summary.py" "$ROOT/build-test" "$ROOT/build-asan" "$ROOT/build-test/pytest.xml"
    return $status
}

case "${1:-}" in
    demo) setup; cd "$ROOT/examples" && "$VENV/bin/python" demo.py ;;
    test) setup; run_tests ;;
    *) echo "usage: tools/run.sh demo|test" >&2; exit 2 ;;
esac
