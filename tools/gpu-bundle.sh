#!/usr/bin/env bash
# Builds the GPU tests and benchmarks (and the many-rank and resident-table benchmarks, whose
# absolute numbers come from the GPU host's 16 cores) and gathers them, with the shared libraries they load, into
# .gpu-bundle/ (git-ignored) so that a GPU machine without our -dev libraries can run them:
#   tools/gpu-bundle.sh            # here: build and gather
#   bash .gpu-bundle/run.sh        # there: run the GPU tests (add --bench for the benchmark)
#   bash .gpu-bundle/run.sh --model-step [ARGS]   # there: only engram-model-step (bench/model)
#   bash .gpu-bundle/run.sh --serve --platform h200|gb10 [ARGS]  # there: engram-serve (bench/serve)
#   bash .gpu-bundle/run.sh --spark-targets [--quick] # there: the DGX Spark row-cache targets
#                                                     # (bench/spark-targets.sh; no GPU needed)
# A token trace from tools/trace (ENGRAM_TRACE, default /var/tmp/debian-doc.trace) goes into the
# bundle when it exists, as trace.bin, for engram-model-step's and engram-serve's --trace.
# glibc, libstdc++/libgcc_s (the target's are newer) and the NVIDIA driver (libcuda) are left to
# the target machine; everything else ldd lists (Abseil, fmt, libcudart, ...) is copied.
set -euo pipefail
cd "$(dirname "$0")/.."
builddir=${ENGRAM_GPU_BUILD_DIR:-build-gpu}
bundle=.gpu-bundle
if [[ ! -f "$builddir/build.ninja" ]]; then
  meson setup "$builddir"
fi
targets=(tests/gpu/gpu_dequant_ref_test tests/gpu/gpu_register_test tests/gpu/gpu_kernel_test
         tests/gpu/gpu_wait_test tests/gpu/gpu_hash_test tests/gpu/gpu_step_test
         tests/gpu/gpu_engramd_test tests/gpu/gpu_cache_test daemon/engramd
         tools/tables/engram-synth bench/gpu/gpu_dequant_bench bench/gpu/gpu_step_bench
         bench/gpu/gpu_cache_bench
         bench/daemon/engram-ranks bench/store/engram-resident-bench
         bench/model/engram-model-step bench/serve/engram-serve
         bench/store/engram-miss-cpu bench/store/engram-trace-replay tools/engramctl/engramctl)
# ENGRAM_BUNDLE_MODEL_STEP_ONLY=1: only engramd and engram-model-step (a bundle for
# `run.sh --model-step`, built in a fraction of the time; the GPU tests are not in it).
# ENGRAM_BUNDLE_SERVE_ONLY=1: engramd, engram-model-step and engram-serve (`run.sh --serve`).
if [[ -n "${ENGRAM_BUNDLE_SERVE_ONLY:-}" ]]; then ENGRAM_BUNDLE_MODEL_STEP_ONLY=1; fi
if [[ -n "${ENGRAM_BUNDLE_MODEL_STEP_ONLY:-}" ]]; then
  targets=(daemon/engramd bench/model/engram-model-step)
  if [[ -n "${ENGRAM_BUNDLE_SERVE_ONLY:-}" ]]; then targets+=(bench/serve/engram-serve); fi
  ninja -C "$builddir" -j"${ENGRAM_JOBS:-2}" "${targets[@]}"
else
  ninja -C "$builddir" -j"${ENGRAM_JOBS:-2}" "${targets[@]}" tests/gpu/libfake_cudart.so
fi

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
for t in "${targets[@]}"; do
  cp "$builddir/$t" "$bundle/bin/"
  strip --strip-debug "$bundle/bin/$(basename "$t")"
done
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libstdc\+\+|libgcc_s|libcuda\.so)'
# ldd on the build tree's binaries: their RUNPATH finds our own libraries there.
for t in "${targets[@]}"; do
  ldd "$builddir/$t" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
  if [[ "$name" =~ $skip ]]; then continue; fi
  cp -L "$path" "$bundle/lib/$name"
done
# The stand-in CUDA runtime gpu_register_test checks the pin-or-unified-memory choice with.
if [[ -z "${ENGRAM_BUNDLE_MODEL_STEP_ONLY:-}" ]]; then
  cp "$builddir/tests/gpu/libfake_cudart.so" "$bundle/lib/"
fi
for lib in "$bundle"/lib/*; do strip --strip-debug "$lib" 2>/dev/null || true; done
# The DGX Spark targets' driver and the Python parts it runs (standard library only), at their
# places relative to each other as in the repository.
if [[ -z "${ENGRAM_BUNDLE_MODEL_STEP_ONLY:-}" ]]; then
  mkdir -p "$bundle/bench/store" "$bundle/tools"
  cp bench/spark-targets.sh "$bundle/bench/"
  cp bench/store/restart_hit_rate.py "$bundle/bench/store/"
  cp tools/fdstore.py "$bundle/tools/"
fi

# A model directory with a tokenizer fixture and its derived tables, for the GPU hasher's
# tokenizer-id test (the target machine runs no Python of ours).
/usr/bin/python3 - "$bundle/hash-model" <<'PY'
import pathlib, sys
sys.path.insert(0, "tests/hash")
import test_hash
d = pathlib.Path(sys.argv[1])
d.mkdir(parents=True, exist_ok=True)
test_hash.build_tokenizer_model(d)
PY

trace=${ENGRAM_TRACE:-/var/tmp/debian-doc.trace}
if [[ -f "$trace" ]]; then cp "$trace" "$bundle/trace.bin"; fi

cat > "$bundle/run.sh" <<'RUNNER'
#!/usr/bin/env bash
# Runs the bundled GPU tests (and with --bench the GPU benchmark). Exit status: 0 if every test
# passed, 1 otherwise. Logs go to $OUT when it is set.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ENGRAMD="$here/bin/engramd"  # the daemon gpu_engramd_test starts
export ENGRAM_HASH_MODEL="$here/hash-model"  # tokenizer ids for gpu_hash_test
export FAKE_CUDART="$here/lib/libfake_cudart.so"  # gpu_register_test's stand-in runtime
logs=${OUT:-$here/logs}
mkdir -p "$logs"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
if [[ "${1:-}" == "--model-step" ]]; then
  # Only the DeepSeek-V4.1-shaped step (it starts its own engramd daemons); the bundled trace
  # when there is one, unless the arguments name another.
  shift
  args=("$@")
  if [[ -f "$here/trace.bin" && " ${args[*]} " != *" --trace "* ]]; then
    args=(--trace "$here/trace.bin" "${args[@]}")
  fi
  echo "engram-model-step ${args[*]}"
  exec "$here/bin/engram-model-step" "${args[@]}"
fi
if [[ "${1:-}" == "--serve" ]]; then
  # engram-serve (bench/serve): --platform h200 or gb10, each about 3-4 minutes with its
  # defaults (it starts its own engramd daemons); the bundled trace unless another is named.
  shift
  args=("$@")
  if [[ -f "$here/trace.bin" && " ${args[*]} " != *" --trace "* ]]; then
    args=(--trace "$here/trace.bin" "${args[@]}")
  fi
  echo "engram-serve ${args[*]}"
  exec "$here/bin/engram-serve" "${args[@]}"
fi
if [[ "${1:-}" == "--spark-targets" ]]; then
  # The DGX Spark row-cache targets (CPU and disk only): raw outputs under $logs/spark-targets.
  shift
  exec bash "$here/bench/spark-targets.sh" "$here/bin" --out "$logs/spark-targets" "$@"
fi
failed=0
for t in gpu_dequant_ref_test gpu_register_test gpu_kernel_test gpu_wait_test gpu_hash_test \
         gpu_step_test gpu_engramd_test gpu_cache_test; do
  start=$(date +%s.%N)
  # A hung GPU wait must not eat the machine's time: each test gets a bounded run (the step
  # test's 18,000 replays, each checked against the host path, take 5-7 minutes).
  timeout "${ENGRAM_GPU_TEST_TIMEOUT:-600}" "$here/bin/$t" >"$logs/$t.log" 2>&1
  rc=$?
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  case $rc in
    0) verdict=OK ;;
    77) verdict=SKIP ;;
    *) verdict="FAIL ($rc)"; failed=1 ;;
  esac
  printf '%-24s %-10s %6ss  %s\n' "$t" "$verdict" "$secs" "$(tail -n 2 "$logs/$t.log" | tr '\n' ' ')"
  if [[ $rc -ne 0 && $rc -ne 77 ]]; then tail -n 40 "$logs/$t.log"; fi
done
if [[ "${1:-}" == "--bench" ]]; then
  # The benchmark's end-to-end part needs a daemon: a synthetic checkpoint and engramd serving
  # it on a private socket, stopped afterwards.
  work=$(mktemp -d)
  rows=${ENGRAM_BENCH_TABLE_ROWS:-500000}
  "$here/bin/engram-synth" "$work/model" --rows "$rows" >"$logs/engram-synth.log" 2>&1
  "$here/bin/engramd" --model "$work/model" --socket "$work/engramd.sock" \
    --log-level warning >"$logs/engramd.log" 2>&1 &
  daemon=$!
  for _ in $(seq 300); do [[ -S "$work/engramd.sock" ]] && break; sleep 0.1; done
  timeout "${ENGRAM_GPU_BENCH_TIMEOUT:-240}" "$here/bin/gpu_dequant_bench" \
    --socket "$work/engramd.sock" --table 14 --table-rows "$rows" 2>&1 |
    tee "$logs/gpu_dequant_bench.log"
  kill "$daemon" 2>/dev/null
  wait "$daemon" 2>/dev/null
  rm -rf "$work"
  # The GPU-driven decode step against the host-driven one (it starts its own engramd).
  timeout "${ENGRAM_GPU_BENCH_TIMEOUT:-240}" "$here/bin/gpu_step_bench" 2>&1 |
    tee "$logs/gpu_step_bench.log"
  # The cache tier's hits read in place against the resident tier (its own two engramds).
  timeout "${ENGRAM_GPU_BENCH_TIMEOUT:-240}" "$here/bin/gpu_cache_bench" 2>&1 |
    tee "$logs/gpu_cache_bench.log"
fi
exit $failed
RUNNER
chmod +x "$bundle/run.sh"
du -sh "$bundle"
ls "$bundle/lib"
