#!/usr/bin/env bash
# One entry point for a fresh Debian 12 machine (as root) or a developer's checkout:
#   tools/run.sh demo    install what is missing, build, run examples/llama.py (the main demo)
#   tools/run.sh test    install what is missing, build, run every C and Python test (and the fuzzers)
#   tools/run.sh fuzz    the fuzzers alone
# The builds include the CUDA backend when the CUDA toolkit is found ($CUDA_HOME, else /usr/local/cuda;
# meson's -Dcuda=auto); without a GPU its tests skip, saying why. tools/gpu-check.sh is the check
# for a machine with one.
# Idempotent: a second run installs nothing and rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/.venv
# Every tool setup installs lives in the venv (meson, ninja, pytest): it comes first on PATH so that
# meson-python, meson and the tests find those and never one that happens to be on this machine.
export PATH="$VENV/bin:$PATH"

APT_PACKAGES=(gcc libc6-dev pkg-config ninja-build libzmq3-dev libczmq-dev libmsgpack-dev libcriterion-dev libdnnl-dev
              libopenblas-dev python3 python3-venv python3-dev)
TEST_APT_PACKAGES=(clang libclang-rt-14-dev   # the fuzz targets (libFuzzer, ASan, UBSan)
                   iproute2                   # hosts of their own for the tests of remote workers (ip netns)
                   liblzma-dev libgfortran-12-dev)  # tests/test_install.sh: what `pkg-config --static dtorch`
                                              # names that no -dev above brings (libxml2's -llzma, OpenBLAS's -lgfortran)
PY_BUILD_PACKAGES=(numpy meson-python meson ninja)   # what building and the demo need
PY_TEST_PACKAGES=(pytest ml_dtypes atheris             # what the tests need besides (atheris: the Python fuzzers,
                  tokenizers jinja2                     # tests only; tokenizers, jinja2: dtorch[text]; aiohttp,
                  aiohttp prometheus_client openai)     # prometheus_client: dtorch[serve], the server; openai: the
                                                        # official client the server's tests drive it with, tests only)

# Installs what pip lacks in the venv: $1 is a Python import check, the rest the packages.
pip_ensure() {
    local check=$1; shift
    if ! "$VENV/bin/python" -c "$check" 2>/dev/null \
        || [ ! -x "$VENV/bin/meson" ] || [ ! -x "$VENV/bin/ninja" ]; then
        echo "== installing Python packages: $*"
        "$VENV/bin/pip" install -q --disable-pip-version-check "$@"
    fi
}

# setup [test]: Debian packages, the venv, dtorch built and installed into it (and the test tools).
setup() {
    local missing=() packages=("${APT_PACKAGES[@]}")
    [ "${1:-}" != test ] || packages+=("${TEST_APT_PACKAGES[@]}")
    for p in "${packages[@]}"; do
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
    pip_ensure "import numpy, mesonpy" "${PY_BUILD_PACKAGES[@]}"
    [ "${1:-}" != test ] || pip_ensure "import pytest, ml_dtypes, atheris, tokenizers, jinja2, aiohttp, prometheus_client, openai" \
        "${PY_TEST_PACKAGES[@]}"
    echo "== building and installing dtorch into $VENV"
    # A build folder of its own that stays between runs: a second run recompiles only what changed.
    # The demo runs on CPU devices: its build leaves the CUDA backend out (nvcc would take half a
    # minute of a first run); the tests build it wherever the toolkit is.
    local cuda=auto; [ "${1:-}" = test ] || cuda=disabled
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-build-isolation --force-reinstall \
        --no-deps --config-settings=build-dir="$ROOT/build-py" --config-settings=setup-args=-Dcuda=$cuda "$ROOT"
}

# A meson build directory of the C runtime with its tests; extra args go to meson setup.
c_build() {
    local dir=$1; shift
    if [ ! -f "$dir/build.ninja" ]; then
        "$VENV/bin/meson" setup "$dir" "$@" >/dev/null
    fi
    if ! "$VENV/bin/meson" compile -C "$dir" >/dev/null; then
        "$VENV/bin/meson" compile -C "$dir" 2>&1 | grep -E "error|FAILED" | head -20
        return 1
    fi
}

# Each fuzz target from the seeds make_corpus writes and the wire's dictionary, for a fixed number
# of inputs with a fixed seed (about 10 minutes in all here; the inputs still differ between
# machines and runs, since coverage that the worker's threads reach steers the mutations): any
# crash, leak or sanitizer report fails, and the input is kept in build-fuzz/findings/. The
# executions are printed. FUZZ_SCALE multiplies the counts (FUZZ_SCALE=10 for a longer look).
declare -A FUZZ_RUNS=([envelope]=5000000 [records]=2000000 [worker]=1000000 [peer]=250000 [controller]=450000)
# Then the Python harnesses (tests/fuzz/python, atheris: libFuzzer guided by the coverage of the
# dtorch package's bytecode) from the seeds each writes, the same way: the safetensors reader, the
# config.json of every model class, the C extension's argument conversion through the public API,
# and the server's request handling, dtorch.serving (about 2 minutes in all here). Any exception their
# contract does not allow, crash or hang fails; the input is kept in build-fuzz/findings/py_*.
declare -A PYFUZZ_RUNS=([safetensors]=70000 [config]=8000 [api]=70000 [serve]=15000)
run_fuzz() {
    local status=0
    # (the targets read the wire alone: no CUDA backend, whatever this machine has)
    if ! CC=clang c_build build-fuzz -Dbuildtype=debugoptimized -Db_sanitize=address,undefined -Db_lundef=false \
        -Dfuzz=true -Dtests=false -Dcuda=disabled; then
        echo "the fuzz targets did not build"
        run_pyfuzz
        return 1
    fi
    rm -rf build-fuzz/corpus build-fuzz/findings && mkdir -p build-fuzz/findings
    build-fuzz/tests/fuzz/make_corpus build-fuzz/corpus
    for target in envelope records worker peer controller; do
        local log=build-fuzz/findings/$target.log
        if (cd build-fuzz/findings && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
            ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1 \
            "$ROOT/build-fuzz/tests/fuzz/fuzz_$target" -seed=1 -runs=$((FUZZ_RUNS[$target] * ${FUZZ_SCALE:-1})) \
            -dict="$ROOT/tests/fuzz/wire.dict" -rss_limit_mb=2048 \
            -timeout=20 "$ROOT/build-fuzz/corpus/$target") > "$log" 2>&1; then
            echo "fuzz_$target: $(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "$log" | tail -1), no finding"
        else
            echo "fuzz_$target FAILED:"; grep -E "ERROR|SUMMARY|Test unit written" "$log" | head -10
            status=1
        fi
    done
    run_pyfuzz || status=1
    return $status
}

run_pyfuzz() {
    local status=0
    rm -rf build-fuzz/pycorpus build-fuzz/findings/py_* && mkdir -p build-fuzz/pycorpus build-fuzz/findings
    for target in safetensors config api serve; do
        local log=build-fuzz/findings/py_$target.log
        if (cd build-fuzz/findings && timeout $((1800 * ${FUZZ_SCALE:-1})) "$VENV/bin/python" \
            "$ROOT/tests/fuzz/python/fuzz_$target.py" "$ROOT/build-fuzz/pycorpus/$target" -seed=1 \
            -runs=$((PYFUZZ_RUNS[$target] * ${FUZZ_SCALE:-1})) -rss_limit_mb=1024 -timeout=120 \
            -artifact_prefix=py_$target-) > "$log" 2>&1; then
            echo "fuzz_$target.py: $(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "$log" | tail -1), no finding"
        else
            echo "fuzz_$target.py FAILED:"; grep -E -A4 "Uncaught|ERROR|SUMMARY|Test unit written" "$log" | head -24
            status=1
        fi
    done
    rm -rf build-fuzz/findings/fuzz-scratch-*   # the files the inputs made (checkpoints, configs)
    return $status
}

run_tests() {
    local status=0
    echo "== C tests (Criterion)"
    c_build build-test -Dbuildtype=debugoptimized
    "$VENV/bin/meson" test -C build-test --print-errorlogs --num-processes 2 || status=1
    echo "== C tests under AddressSanitizer (leaks are failures)"
    c_build build-asan -Dbuildtype=debug -Db_sanitize=address
    # Criterion passes a test whose process LeakSanitizer reports at exit, and --tap=- loses the
    # report: every sanitized process writes its reports to a file instead, and any file fails
    rm -rf build-asan/asan-logs && mkdir -p build-asan/asan-logs
    ASAN_OPTIONS=detect_leaks=1:log_path=$ROOT/build-asan/asan-logs/asan \
        "$VENV/bin/meson" test -C build-asan --print-errorlogs --num-processes 2 || status=1
    if [ -n "$(ls -A build-asan/asan-logs)" ]; then
        cat build-asan/asan-logs/* | head -80
        echo "AddressSanitizer reported errors or leaks"
        status=1
    fi
    echo "== Fuzzing the wire (libFuzzer under ASan and UBSan, fixed seeds and run counts)"
    run_fuzz || status=1
    echo "== Python tests (pytest), thread and process workers"
    (cd "$ROOT/tests/python" && "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
        --junitxml="$ROOT/build-test/pytest.xml" .) || status=1
    "$VENV/bin/python" "$ROOT/tools/summary.py" "$ROOT/build-test" "$ROOT/build-asan" "$ROOT/build-test/pytest.xml"
    return $status
}

case "${1:-}" in
    demo) setup; cd "$ROOT/examples" && "$VENV/bin/python" llama.py ;;
    test) setup test; run_tests ;;
    fuzz) setup test; run_fuzz ;;   # the fuzzing part of test alone
    *) echo "usage: tools/run.sh demo|test|fuzz" >&2; exit 2 ;;
esac
