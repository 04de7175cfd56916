#!/bin/bash
# Runs benchmarks/executor_rpc_cost.py (the executor's cost per RPC, pristine beside patched) on the
# device machine, in one call: 16 idle cores instead of this 2-core shared machine, where a round's
# spinning ranks are often descheduled (docs/measurements.md).
#
#   benchmarks/executor_rpc_cost_device.sh carry          # here: build/rpc-device (git-ignored, ~25 MB)
#   BEFORE=<commit of build/patched> benchmarks/executor_rpc_cost_device.sh carry   # and an earlier series
#   bash build/rpc-device/executor_rpc_cost_device.sh run [BENCHMARK ARGS]   # on the device
#
# The carry: vllm/ at the upstream tag of build/patched, the vllm/ files the series changes at its
# last commit, the benchmark and the harness it builds the executor with
# (tests/patches/queue-event-ownership/qeo_worker_pipeline.py), and .whl/ (vLLM's pure-Python
# dependencies missing on the device; docs/qualification.md). The shims are those of
# benchmarks/device_qualify.sh (an empty vllm/_C_stable_libtorch.py, a vllm dist-info). Nothing
# here uses the GPU: the ranks are forked processes (each spinning on a core of its own), their
# worker a stand-in that answers at once, as on CPU; pristine and patched are each a whole vllm/ first on PYTHONPATH.
set -euo pipefail
mode=${1:?carry or run}
if [ "$mode" = carry ]; then
  cd "$(dirname "$0")/.."
  tree=build/patched
  base=$(git -C $tree describe --tags --abbrev=0 --match 'upstream/*' HEAD)
  d=build/rpc-device; rm -rf $d; mkdir -p $d/wheels $d/benchmarks $d/tests/patches/queue-event-ownership
  git -C $tree archive --format=tar "$base" vllm | gzip -6 >$d/vllm-base.tar.gz
  mapfile -t changed < <(git -C $tree diff --name-only "$base" HEAD -- vllm)
  git -C $tree archive --format=tar HEAD "${changed[@]}" | gzip >$d/overlay-patched.tar.gz
  if [ -n "${BEFORE:-}" ]; then
    # The earlier series' files: those it changes, plus those HEAD changes that it left as upstream.
    mapfile -t before_changed < <(git -C $tree diff --name-only "$base" "$BEFORE" -- vllm)
    git -C $tree archive --format=tar "$BEFORE" "${before_changed[@]}" | gzip >$d/overlay-before.tar.gz
  fi
  cp benchmarks/executor_rpc_cost.py $d/benchmarks/
  cp tests/patches/queue-event-ownership/qeo_worker_pipeline.py $d/tests/patches/queue-event-ownership/
  cp benchmarks/executor_rpc_cost_device.sh $d/
  cp .whl/*.whl $d/wheels/
  {
    echo "pristine $(git -C $tree rev-parse "$base") ($base)"
    echo "patched $(git -C $tree rev-parse HEAD) ($(git -C $tree rev-list --count "$base"..HEAD) patches)"
    [ -z "${BEFORE:-}" ] || echo "before $(git -C $tree rev-parse "$BEFORE")"
    echo "project $(git rev-parse HEAD)"
    printf '%s\n' "${changed[@]}"
  } >$d/MANIFEST
  du -sh $d
  exit 0
fi
[ "$mode" = run ] || { echo "usage: $0 carry|run [BENCHMARK ARGS]" >&2; exit 2; }
shift
d=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 VLLM_LOGGING_LEVEL=WARNING
{
  date -u; nproc; uptime
  python3 -c 'import sys,torch;print(sys.version.split()[0],"torch",torch.__version__)'
  cat "$d/MANIFEST"
} >"$OUT/env.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$d"/wheels/*.whl
sides=(pristine patched)
[ ! -f "$d/overlay-before.tar.gz" ] || sides+=(before)
for v in "${sides[@]}"; do
  t=/tmp/v/$v; rm -rf $t; mkdir -p $t
  tar -xzf "$d/vllm-base.tar.gz" -C $t
  [ $v = pristine ] || tar -xzf "$d/overlay-$v.tar.gz" -C $t
  printf '# stand-in: compiled extension not carried to the device\n' >$t/vllm/_C_stable_libtorch.py
  mkdir -p $t/vllm-0.33.0.dist-info
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n' >$t/vllm-0.33.0.dist-info/METADATA
done
export PYTHONPATH=/tmp/site
before=""; [ ! -d /tmp/v/before ] || before=1
python3 "$d/benchmarks/executor_rpc_cost.py" --python python3 --pythonpath-of-trees \
  --pristine /tmp/v/pristine --tree /tmp/v/patched ${before:+--before /tmp/v/before} "$@" 2>&1 | tee "$OUT/executor_rpc_cost.txt"
echo "exit status: ${PIPESTATUS[0]}" | tee -a "$OUT/executor_rpc_cost.txt"
