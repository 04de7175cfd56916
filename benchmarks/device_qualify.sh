#!/bin/bash
# GPU qualification driver (docs/qualification.md; run on the device machine, repo root).
# Needs the parts benchmarks/device_carry.sh makes (build/stage/p0..pN, carried
# by consecutive calls on one warm machine; the last part holds carry.sha256).
# Unpacks vllm/ twice under /tmp/v: pristine (the upstream tag) and patched
# (the whole series at HEAD), installs the carried wheels into /tmp/site, and
# runs each benchmark once per tree. Raw outputs go to $OUT.
#
# STAGES (default: all) picks among:
#   probe  which modules import, which platform vLLM resolves
#   qeo    queue-event-ownership: CPU-offload stores with real streams/events
#   rs     route-sanitization: the real per-layer route guard under graph replay
#   rsq    route-sanitization: the Triton guard against the torch path, first
#          call of each B12x backend's guard inside CUDA-graph capture
#   wr     workspace-reuse: 48 B12x wrappers, allocator statistics
#   ba     byte-accounting: planner block size, page tensors on CUDA
#
# /tmp/site/nvidia_cutlass_dsl/dsl_packages goes on PYTHONPATH because the
# CUTLASS DSL adds it through a .pth file, which Python reads only in site dirs.
# Environment shims, none of them vLLM code:
# * vllm/_C_stable_libtorch.py, empty: the compiled extension is not carried
#   (built for another torch; vllm.platforms.cuda imports it at module top);
# * vllm-0.33.0.dist-info/METADATA: platform detection reads the version;
# * vllm_qualification_platform: a vLLM platform plugin (entry point group
#   vllm.platform_plugins) that, when VLLM_QUALIFICATION_PLATFORM=unspecified,
#   makes vLLM resolve UnspecifiedPlatform in every process (the model registry
#   inspects architectures in a subprocess). Used by rs, wr and ba: with the
#   CUDA platform, importing the fused-MoE layers and the Qwen4Exp model calls
#   compiled ops (torch.ops._C.cutlass_scaled_mm_supports_block_fp8) at import
#   time. Tensors are still CUDA tensors; qeo runs on the CUDA platform.
set -u
STAGES=${STAGES:-wr ba rs}
on() { [[ " $STAGES " == *" $1 "* ]]; }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_LOGGING_LEVEL=WARNING
C=/tmp/carry; rm -rf $C; mkdir -p $C
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c 'import torch,sys;print(sys.version);print("torch",torch.__version__,"cuda",torch.version.cuda,torch.cuda.get_device_name(),torch.cuda.get_device_capability())'
  ls -l build/stage/*/
  want=$(cat build/stage/p*/carry.sha256)
  cat build/stage/p*/carry.part.* > $C/carry.tar
  got=$(sha256sum $C/carry.tar | cut -d' ' -f1)
  echo "carry sha256 want $want got $got"
  if [ "$want" = "$got" ]; then
    tar -C $C -xf $C/carry.tar && rm $C/carry.tar &&
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $C/wheels/*.whl &&
      echo "wheels installed: $(ls $C/wheels | wc -l)"
    ls $C/wheels; cat $C/qual/MANIFEST
  else
    echo "CARRY INCOMPLETE OR CORRUPT: stop"
  fi
} > "$OUT/env.txt" 2>&1
grep -q "^wheels installed" "$OUT/env.txt" || { tail -20 "$OUT/env.txt"; exit 1; }
cat > /tmp/site/vllm_qualification_platform.py <<'PY'
import os
def unspecified_platform():
    if os.environ.get("VLLM_QUALIFICATION_PLATFORM") == "unspecified":
        return "vllm.platforms.interface.UnspecifiedPlatform"
    return None
PY
mkdir -p /tmp/site/vllm_qualification_platform-0.dist-info
printf 'Metadata-Version: 2.1\nName: vllm-qualification-platform\nVersion: 0\n' > /tmp/site/vllm_qualification_platform-0.dist-info/METADATA
printf '[vllm.platform_plugins]\nunspecified = vllm_qualification_platform:unspecified_platform\n' > /tmp/site/vllm_qualification_platform-0.dist-info/entry_points.txt
mk() {  # mk VARIANT [OVERLAY]
  local d=/tmp/v/$1; rm -rf "$d"; mkdir -p "$d"
  tar -xzf $C/qual/vllm-base.tar.gz -C "$d"
  [ -n "${2:-}" ] && tar -xzf "$C/qual/$2" -C "$d"
  printf '# stand-in: compiled extension not carried to the device\n' > "$d/vllm/_C_stable_libtorch.py"
  mkdir -p "$d/vllm-0.33.0.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n' > "$d/vllm-0.33.0.dist-info/METADATA"
}
mk pristine; mk patched overlay-patched.tar.gz
py() { local v=$1 t=$2; shift 2; timeout "$t" env PYTHONPATH=/tmp/v/$v:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages python3 "$@"; echo "exit status: $?"; }
unspec() { VLLM_QUALIFICATION_PLATFORM=unspecified py "$@"; }
on probe && for v in pristine patched; do
  echo "== $v"; unspec $v 200 - <<'PY'
import importlib, time
for m in ["vllm.platforms", "flashinfer", "flashinfer.fused_moe",
          "vllm.model_executor.layers.fused_moe.experts.flashinfer_b12x_moe",
          "vllm.models.qwen4_exp.nvidia.model", "vllm.v1.worker.utils",
          "vllm.v1.attention.backends.flashinfer"]:
    t = time.time()
    try:
        mod = importlib.import_module(m); print(f"OK   {m} ({time.time()-t:.1f}s) {getattr(mod,'__file__','')}")
    except Exception as e:
        print(f"FAIL {m}: {type(e).__name__}: {e}")
from vllm.platforms import current_platform
print("current_platform:", type(current_platform).__name__)
PY
done > "$OUT/probe.txt" 2>&1
on qeo && for v in pristine patched; do
  echo "## variant $v"; py $v 240 benchmarks/queue_event_ownership_gpu.py --rounds 5
done > "$OUT/queue_event_ownership.txt" 2>&1
on wr && for v in pristine patched; do
  echo "## variant $v"; unspec $v 200 benchmarks/workspace_reuse_gpu.py --layers 48 --max-tokens 8192
done > "$OUT/workspace_reuse.txt" 2>&1
on ba && for v in pristine patched; do
  echo "## variant $v"; unspec $v 240 benchmarks/byte_accounting_pages.py
done > "$OUT/byte_accounting.txt" 2>&1
on rs && {
  unspec patched 240 benchmarks/route_sanitization_guard.py --ids-dtype int32
  unspec patched 200 benchmarks/route_sanitization_guard.py --ids-dtype int64
  for b in 128 512 1024; do
    unspec patched 100 benchmarks/route_sanitization_guard.py --block-size $b --tokens 1 1024 4096 8192 --top-k 10
  done
} > "$OUT/route_sanitization.txt" 2>&1
on rsq && unspec patched 400 benchmarks/route_sanitization_qualify.py > "$OUT/route_sanitization_qualify.txt" 2>&1
cd "$OUT" && grep -h -v -E "^W[0-9]{4}|Warning|warn" *.txt | grep -E "^(OK|FAIL|current|##|==|TUNING|guard|vllm)|exit status|^ +[0-9]+ +(8|10) |allocated_bytes|reserved_bytes|distinct_static|segments|allocations|wrapper_bytes|^(fp8|nvfp4|octave)|platform method|CARRY|^(int32|int64) |RESULT|MISMATCH|budget|first call captured" | cut -c1-200
