#!/bin/bash
# Runs the route-sanitization GPU test (tests/patches/route-sanitization/test_route_guard_gpu.py:
# the production Triton route-guard kernel against its CPU path) on the device machine, in one call.
#
#   benchmarks/route_guard_gpu_device.sh carry   # here: build/rt-device (git-ignored, ~30 MB)
#   bash build/rt-device/route_guard_gpu_device.sh run   # on the device, carry build/rt-device
#
# The test imports only vLLM's route guard and MoE config (no flashinfer), so the carry is small
# enough for one call: vllm/ at the upstream tag, the vllm/ files the series changes at the
# series' last commit of build/patched, the test file, and .whl/ (vLLM's pure-Python dependencies
# missing on the device; see docs/qualification.md). The environment shims are those of
# benchmarks/device_qualify.sh (empty vllm/_C_stable_libtorch.py, a vllm dist-info, and the
# platform plugin that makes vLLM resolve UnspecifiedPlatform: with the CUDA platform, importing
# the fused-MoE package calls compiled ops that are not carried). Tensors are CUDA tensors and the
# kernel is the real Triton launch.
set -euo pipefail
mode=${1:?carry or run}
if [ "$mode" = carry ]; then
  cd "$(dirname "$0")/.."
  tree=build/patched
  base=$(git -C $tree describe --tags --abbrev=0 --match 'upstream/*' HEAD)
  d=build/rt-device; rm -rf $d; mkdir -p $d/wheels
  git -C $tree archive --format=tar "$base" vllm | gzip -6 >$d/vllm-base.tar.gz
  mapfile -t changed < <(git -C $tree diff --name-only "$base" HEAD -- vllm)
  git -C $tree archive --format=tar HEAD "${changed[@]}" | gzip >$d/overlay-patched.tar.gz
  cp tests/patches/route-sanitization/test_route_guard_gpu.py benchmarks/route_guard_gpu_device.sh $d/
  cp .whl/*.whl $d/wheels/
  {
    echo "pristine $(git -C $tree rev-parse "$base") ($base)"
    echo "patched $(git -C $tree rev-parse HEAD) ($(git -C $tree rev-list --count "$base"..HEAD) patches)"
    echo "project $(git rev-parse HEAD)"
    echo "test sha256 $(sha256sum tests/patches/route-sanitization/test_route_guard_gpu.py | cut -d' ' -f1)"
    printf '%s\n' "${changed[@]}"
  } >$d/MANIFEST
  du -sh $d
  exit 0
fi
[ "$mode" = run ] || { echo "usage: $0 carry|run" >&2; exit 2; }
d=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_LOGGING_LEVEL=WARNING
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import sys,torch,triton;print(sys.version.split()[0],"torch",torch.__version__,"triton",triton.__version__,torch.cuda.get_device_name())'
  cat "$d/MANIFEST"
  echo "test sha256 here $(sha256sum "$d/test_route_guard_gpu.py" | cut -d' ' -f1)"
} >"$OUT/env.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$d"/wheels/*.whl
v=/tmp/v/patched; rm -rf $v; mkdir -p $v
tar -xzf "$d/vllm-base.tar.gz" -C $v && tar -xzf "$d/overlay-patched.tar.gz" -C $v
printf '# stand-in: compiled extension not carried to the device\n' >$v/vllm/_C_stable_libtorch.py
mkdir -p $v/vllm-0.33.0.dist-info
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n' >$v/vllm-0.33.0.dist-info/METADATA
cat >/tmp/site/vllm_qualification_platform.py <<'PY'
import os
def unspecified_platform():
    if os.environ.get("VLLM_QUALIFICATION_PLATFORM") == "unspecified":
        return "vllm.platforms.interface.UnspecifiedPlatform"
    return None
PY
p=/tmp/site/vllm_qualification_platform-0.dist-info; mkdir -p $p
printf 'Metadata-Version: 2.1\nName: vllm-qualification-platform\nVersion: 0\n' >$p/METADATA
printf '[vllm.platform_plugins]\nunspecified = vllm_qualification_platform:unspecified_platform\n' >$p/entry_points.txt
mkdir -p /tmp/t && cp "$d/test_route_guard_gpu.py" /tmp/t/
cd /tmp/t
set +e
VLLM_QUALIFICATION_PLATFORM=unspecified PYTHONPATH=$v:/tmp/site timeout 500 python3 -m pytest -v -p no:cacheprovider \
  -W ignore::DeprecationWarning --junitxml="$OUT/route_guard_gpu.xml" test_route_guard_gpu.py 2>&1 | tee "$OUT/route_guard_gpu.txt"
echo "pytest exit status: ${PIPESTATUS[0]}" | tee -a "$OUT/route_guard_gpu.txt"
