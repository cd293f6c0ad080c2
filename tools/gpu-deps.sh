#!/usr/bin/env bash
# Packs the libraries DTorch builds against, as this Debian machine has them (ZeroMQ, CZMQ, msgpack-c,
# OpenBLAS, Criterion, every library they load in turn, their headers, and pkgconf), into
# .gpu-deps/deps.tar.xz:
#   tools/gpu-deps.sh
# for a GPU machine that has the CUDA toolkit, a C compiler and Python with numpy, pytest, meson and
# ninja, but not these libraries, and no package registry to install them from. tools/gpu-check.sh
# unpacks it there when the machine's pkg-config cannot find them and builds against it, the
# binaries finding every packed library through their own DT_RPATH. The .pc files are written here,
# relative to their own folder, so that the tree works wherever it is unpacked.
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/lib/pkgconfig" "$STAGE/include" "$STAGE/bin"

# the libraries DTorch links, by the names the linker looks for, and the pkg-config name of each
declare -A PC=([zmq]=libzmq [czmq]=libczmq [msgpackc]=msgpack-c [openblas]=openblas [criterion]=criterion)
direct=()
for lib in "${!PC[@]}"; do
    dir=$(pkg-config --libs-only-L "${PC[$lib]/msgpack-c/msgpack}" | sed 's/^ *-L//; s/ *$//')
    path=$( [ -n "$dir" ] && echo "$dir/lib$lib.so" || gcc -print-file-name="lib$lib.so")
    [ -e "$path" ] || { echo "gpu-deps: $path not found (install the -dev packages first: tools/run.sh test)" >&2; exit 1; }
    direct+=("$(readlink -f "$path")")
    soname=$(objdump -p "$path" | awk '$1 == "SONAME" {print $2}')
    ln -sf "$soname" "$STAGE/lib/lib$lib.so"
done

# every library those load, except the C library's own and the C++/GCC runtime, which the GPU
# machine's compiler brings
skip='^(libc|libm|libdl|libpthread|librt|libresolv|libutil|ld-linux-x86-64|libstdc\+\+|libgcc_s)\.so'
copy_lib() {  # copy_lib PATH: the file, under its soname
    local soname
    soname=$(objdump -p "$1" | awk '$1 == "SONAME" {print $2}')
    cp -L "$1" "$STAGE/lib/${soname:-$(basename "$1")}"
}
for path in "${direct[@]}" "$(readlink -f "$(command -v pkgconf)")"; do
    [[ $path == *.so* ]] && copy_lib "$path"
    ldd "$path" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name dep; do
        [[ $name =~ $skip ]] || copy_lib "$dep"
    done
done
cp -L "$(command -v pkgconf)" "$STAGE/bin/pkgconf"

# the headers of the -dev packages (OpenBLAS keeps its own under its multiarch folder)
for pkg in libzmq3-dev libczmq-dev libmsgpack-dev libcriterion-dev; do
    dpkg -L "$pkg" | grep '^/usr/include/.' | while read -r f; do
        [ -f "$f" ] || continue
        mkdir -p "$STAGE/include/$(dirname "${f#/usr/include/}")"
        cp "$f" "$STAGE/include/${f#/usr/include/}"
    done
done
cp "$(pkg-config --variable=includedir openblas)"/{cblas.h,openblas_config.h} "$STAGE/include/"

# one .pc file per library, with no Requires: what a shared link needs, nothing of a static one
for lib in "${!PC[@]}"; do
    cflags=-I\${includedir}
    [ "$lib" = criterion ] && cflags="$cflags -DBXF_STATIC_LIB=1"
    cat > "$STAGE/lib/pkgconfig/${PC[$lib]}.pc" <<EOF
prefix=\${pcfiledir}/../..
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: ${PC[$lib]}
Description: ${PC[$lib]} as packed by tools/gpu-deps.sh
Version: $(pkg-config --modversion "${PC[$lib]/msgpack-c/msgpack}")
Libs: -L\${libdir} -l$lib
Cflags: $cflags
EOF
done

mkdir -p .gpu-deps
tar -C "$STAGE" -cJf .gpu-deps/deps.tar.xz .
echo "gpu-deps: $(ls "$STAGE/lib" | grep -c '\.so\.') libraries, $(find "$STAGE/include" -type f | wc -l) headers:" \
    "$(du -h .gpu-deps/deps.tar.xz | cut -f1) in .gpu-deps/deps.tar.xz (for $ARCH)"
