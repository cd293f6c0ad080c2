#!/usr/bin/env bash
# The C library as its users meet it: `meson install` of this build into a temporary tree, then the
# README's C example (the block between its example.c markers, taken from README.md here, so the
# two cannot drift) built from that tree with `cc example.c $(pkg-config --cflags --libs dtorch)`
# and run, in both worker modes; then built against libdtorch.a alone with `pkg-config --static`.
# Its output is checked against values worked out by hand.
#
#   test_install.sh SOURCE_DIR BUILD_DIR LIBDIR INCLUDEDIR BINDIR SANITIZE CC MESON
#
# LIBDIR, INCLUDEDIR and BINDIR are absolute (prefix included); SANITIZE is meson's b_sanitize
# ("none" or e.g. "address"): a sanitized library needs its runtime in the example too. MESON is
# the meson that configured BUILD_DIR.
set -euo pipefail
src=$1 build=$2 libdir=$3 includedir=$4 bindir=$5 sanitize=$6 cc=$7 meson=$8

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dtorch-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# the tree as `meson install` lays it out (the C library's files carry the runtime and devel tags;
# the Python package's, python-runtime)
"$meson" install -C "$build" --no-rebuild --quiet --destdir "$tmp/root" --tags runtime,devel
root=$tmp/root
lib=$root$libdir
pc=$lib/pkgconfig
for f in "$root$includedir/dtorch.h" "$lib/libdtorch.so" "$lib/libdtorch.so.0" "$lib/libdtorch.a" "$pc/dtorch.pc" \
    "$root$bindir/dtorch-worker"; do
    [ -e "$f" ] || fail "meson install did not install ${f#"$root"}"
done
echo "installed: $(cd "$root" && find . -type f -o -type l | sort | tr '\n' ' ')"
readelf -d "$lib/libdtorch.so" | grep -q 'SONAME.*\[libdtorch\.so\.0\]' \
    || fail "libdtorch.so's soname is not libdtorch.so.0"
# a real archive holds its objects; a thin one ("!<thin>") only names them in the build folder
magic=$(head -c 8 "$lib/libdtorch.a")
[ "$magic" = '!<arch>' ] || fail "libdtorch.a is not a real archive: it starts with $magic"
# the shared library exports the functions dtorch.h declares (at the start of a line, outside
# comments), and no other symbol
grep -E '^[a-z]' "$root$includedir/dtorch.h" | grep -oE '\bdt_[a-z0-9_]+\(' | tr -d '(' | sort -u > "$tmp/declared"
nm -D --defined-only "$lib/libdtorch.so" | awk '{print $3}' | sort -u > "$tmp/exported"
[ "$(wc -l < "$tmp/declared")" -gt 50 ] || fail "found only $(wc -l < "$tmp/declared") functions in dtorch.h"
diff "$tmp/declared" "$tmp/exported" > "$tmp/symbols.diff" || {
    cat "$tmp/symbols.diff" >&2
    fail "libdtorch.so's functions differ from dtorch.h's (<: declared not exported, >: exported not declared)"
}

# the README's example, verbatim
awk '/^<!-- end example\.c -->/ {on = 0} on && !/^```/ {print} /^<!-- example\.c / {on = 1}' "$src/README.md" \
    > "$tmp/example.c"
grep -q 'int main' "$tmp/example.c" || fail "no example.c block between the markers in README.md"

# a sanitized build's library needs the sanitizer's runtime in the program that loads it
extra=()
[ "$sanitize" = none ] || extra=("-fsanitize=$sanitize")
export PKG_CONFIG_PATH=$pc
# (meson test points LD_LIBRARY_PATH at the build folder's libdtorch.so)
unset LD_LIBRARY_PATH DTORCH_WORKER_PATH DTORCH_WORKERS
cd "$tmp"

# x = [[0 1 2] [3 4 5] [6 7 8] [9 10 11]], y = 2x, s = y.sum(0) = 2 * [0+3+6+9, 1+4+7+10, 2+5+8+11]
expected='shape [3]: 36 44 52'
check() {  # check LABEL OUTPUT-FILE
    [ "$(cat "$2")" = "$expected" ] || fail "$1: printed '$(cat "$2")', expected '$expected'"
    echo "$1: $expected"
}

echo "+ cc example.c \$(pkg-config --cflags --libs dtorch): $(pkg-config --cflags --libs dtorch)"
# shellcheck disable=SC2046  # pkg-config's output is words
$cc example.c $(pkg-config --cflags --libs dtorch) "${extra[@]}" -o example
readelf -d example | grep -q 'NEEDED.*\[libdtorch\.so\.0\]' || fail "example does not link libdtorch.so.0"
LD_LIBRARY_PATH=$lib ./example > out.thread
check "shared, thread workers" out.thread
# process workers: the installed dtorch-worker, found on PATH
PATH=$root$bindir:$PATH DTORCH_WORKERS=process LD_LIBRARY_PATH=$lib ./example > out.process
check "shared, process workers" out.process

# libdtorch.a alone: with no libdtorch.so beside it, -ldtorch is the archive, and --static adds
# what it links (Requires.private, Libs.private)
rm "$lib"/libdtorch.so*
# Debian 12's norm.pc (libnorm-dev, in libzmq's static link) names libprotokit.a without its folder,
# so every `pkg-config --static` that reaches libzmq prints a word ld looks for in the current folder;
# a copy naming ${libdir}/libprotokit.a stands in for it where the system's is so
if normdir=$(pkg-config --variable=pcfiledir norm 2>/dev/null) \
    && grep -q '^Libs\.private:.* libprotokit\.a' "$normdir/norm.pc"; then
    mkdir pc-fix
    sed 's|^\(Libs\.private:.*\) libprotokit\.a|\1 ${libdir}/libprotokit.a|' "$normdir/norm.pc" > pc-fix/norm.pc
    export PKG_CONFIG_PATH=$PKG_CONFIG_PATH:$tmp/pc-fix
fi
echo "+ cc example.c \$(pkg-config --static --cflags --libs dtorch): $(pkg-config --static --cflags --libs dtorch)"
# shellcheck disable=SC2046
$cc example.c $(pkg-config --static --cflags --libs dtorch) "${extra[@]}" -o example-static
if readelf -d example-static | grep -q 'NEEDED.*libdtorch'; then fail "example-static needs libdtorch.so"; fi
./example-static > out.static
check "static, thread workers" out.static
