#!/usr/bin/env bash
# Gathers what the Python tests need on a machine without our build dependencies: engramd,
# engram-synth, engramctl (the row store's tests read its JSON), libengram_client,
# libengram_kernels_cuda, the stand-in CUDA runtime (libfake_cudart, for test_gpu_in_place's
# route decisions) and the shared libraries they load.
#   tests/python/gpu_bundle.sh [BUILD_DIR] [OUT_DIR]      # here (defaults: build, .gpu-bundle/python)
#   LD_LIBRARY_PATH=OUT/lib ENGRAM_BIN_DIR=OUT/bin ENGRAM_LIB_DIR=OUT/lib ENGRAM_REQUIRE_GPU=1 \
#     python -m pytest -rs tests/python -k gpu            # there, from the repository root
# LD_LIBRARY_PATH lets the client library find the Debian libraries bundled beside it.
# glibc, libstdc++/libgcc_s and the NVIDIA driver are left to the target machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
builddir=${1:-build}
out=${2:-.gpu-bundle/python}
# The kernels library links the client library, so building it builds both.
ninja -C "$builddir" -j"${ENGRAM_JOBS:-2}" daemon/engramd tools/tables/engram-synth \
  tools/engramctl/engramctl kernels/libengram_kernels_cuda.so tests/gpu/libfake_cudart.so
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
cp "$builddir/daemon/engramd" "$builddir/tools/tables/engram-synth" \
  "$builddir/tools/engramctl/engramctl" "$out/bin/"
cp -L "$builddir/client/libengram_client.so.0" "$out/lib/libengram_client.so.0"
cp -L "$builddir/kernels/libengram_kernels_cuda.so" "$out/lib/"
cp -L "$builddir/tests/gpu/libfake_cudart.so" "$out/lib/"
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libstdc\+\+|libgcc_s|libcuda\.so|libengram_)'
for f in "$out"/bin/* "$out"/lib/*; do
  ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
  if [[ "$name" =~ $skip ]]; then continue; fi
  cp -L "$path" "$out/lib/$name"
done
strip --strip-debug "$out"/bin/* "$out"/lib/* 2>/dev/null || true
if ! nm -D --defined-only "$out/lib/libengram_client.so.0" | grep -q ' engram_gpu_register@'; then
  echo "warning: libengram_client does not export engram_gpu_register: the GPU tests will fail" >&2
fi
du -sh "$out"
