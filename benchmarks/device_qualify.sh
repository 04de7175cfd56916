#!/bin/bash
# GPU qualification driver for issue 8 (run on the device machine, repo root).
# Needs (carried, git-ignored): .whl/ (vLLM's pure-Python deps as cp312 wheels)
# and build/qual/ (vllm-base.tar.gz = vllm/ at tag upstream-0.33.0,
# overlay-<series>.tar.gz = the files each series' HEAD changes, MANIFEST).
# Builds one vllm package dir per variant under /tmp/v/<variant>, adds what the
# sdist tree lacks for an import without the compiled extension, and runs the
# benchmarks once per variant. Writes raw outputs to $OUT.
# STAGES (default: all) picks among: probe qeo ba ba_cuda wr
#   ba      byte-accounting with vLLM's platform forced to UnspecifiedPlatform
#           (its planner method is the one CudaPlatform inherits); CUDA tensors
#   ba_cuda byte-accounting with the CUDA platform (needs vLLM's compiled
#           extensions: fails on a machine without them, and says why)
set -u
STAGES=${STAGES:-probe qeo ba ba_cuda wr}
on() { [[ " $STAGES " == *" $1 "* ]]; }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_LOGGING_LEVEL=WARNING
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c 'import torch,sys;print(sys.version);print("torch",torch.__version__,"cuda",torch.version.cuda,torch.cuda.get_device_name(),torch.cuda.get_device_capability())'
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && echo "wheels installed: $(ls .whl | wc -l)"
  ls .whl; cat build/qual/MANIFEST
} > "$OUT/env.txt" 2>&1
mk() {  # mk VARIANT [SERIES]
  local d=/tmp/v/$1; rm -rf "$d"; mkdir -p "$d"
  tar -xzf build/qual/vllm-base.tar.gz -C "$d"
  [ -n "${2:-}" ] && tar -xzf "build/qual/overlay-$2.tar.gz" -C "$d"
  # Environment shims (not vLLM code): the compiled extension is not carried;
  # vllm.platforms.cuda imports it at module top; no op of it runs on these paths.
  printf '# stand-in: compiled extension not carried to the device\n' > "$d/vllm/_C_stable_libtorch.py"
  # Distribution metadata (platform detection reads importlib.metadata.version("vllm")).
  mkdir -p "$d/vllm-0.33.0.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n' > "$d/vllm-0.33.0.dist-info/METADATA"
}
mk pristine; mk qeo queue-event-ownership; mk ba byte-accounting; mk b12x b12x
py() { local v=$1; shift; PYTHONPATH=/tmp/v/$v:/tmp/site python3 "$@"; }
# 1. import probe (which modules import on the device, which are missing)
on probe && for v in pristine qeo ba b12x; do
  echo "== $v"; py $v - <<'PY'
import importlib, sys, time
for m in ["vllm.platforms", "vllm.v1.simple_kv_offload.worker", "vllm.v1.simple_kv_offload.copy_backend",
          "vllm.platforms.interface", "vllm.config", "vllm.models.qwen4_exp.nvidia.model",
          "vllm.models.qwen4_exp.amd.model", "vllm.v1.worker.utils",
          "vllm.model_executor.layers.fused_moe.experts.flashinfer_b12x_moe",
          "vllm.v1.attention.backends.flashinfer", "flashinfer"]:
    t = time.time()
    try:
        mod = importlib.import_module(m); print(f"OK   {m} ({time.time()-t:.1f}s) {getattr(mod,'__file__','')}")
    except Exception as e:
        print(f"FAIL {m}: {type(e).__name__}: {e}")
from vllm.platforms import current_platform
print("current_platform:", type(current_platform).__name__, current_platform.get_device_capability())
PY
done > "$OUT/probe.txt" 2>&1
# 2. queue-event-ownership harness, pristine then patched
on qeo && for v in pristine qeo; do
  echo "## variant $v: $(py $v -c 'import vllm.v1.simple_kv_offload.worker as w; print(w.__file__)' 2>/dev/null)"
  timeout 240 env PYTHONPATH=/tmp/v/$v:/tmp/site python3 benchmarks/queue_event_ownership_gpu.py --rounds 5; echo "exit status: $?"
done > "$OUT/queue_event_ownership.txt" 2>&1
# 3. byte-accounting planner + CUDA page tensors, pristine then patched
on ba && for v in pristine ba; do
  echo "## variant $v (vLLM platform forced to UnspecifiedPlatform)"
  timeout 200 env PYTHONPATH=/tmp/v/$v:/tmp/site python3 benchmarks/byte_accounting_pages.py --unspecified-platform --json --cache-dtype fp8 --cache-dtype octave_k3v4 --cache-dtype octave_k3v3 --cache-dtype octave_k3v3_compact; echo "exit status: $?"
done > "$OUT/byte_accounting_unspecified_platform.txt" 2>&1
on ba_cuda && for v in pristine ba; do
  echo "## variant $v"
  timeout 200 env PYTHONPATH=/tmp/v/$v:/tmp/site python3 benchmarks/byte_accounting_pages.py --json --cache-dtype fp8 --cache-dtype octave_k3v4 --cache-dtype octave_k3v3 --cache-dtype octave_k3v3_compact; echo "exit status: $?"
  timeout 120 env PYTHONPATH=/tmp/v/$v:/tmp/site python3 benchmarks/byte_accounting_pages.py --json --cache-dtype nvfp4; echo "exit status (nvfp4/flashinfer scenario): $?"
done > "$OUT/byte_accounting.txt" 2>&1
# 4. workspace-reuse: needs flashinfer's B12xMoEWrapper
on wr && { py b12x -c 'import flashinfer' ; echo "import flashinfer exit status: $?"; } > "$OUT/workspace_reuse.txt" 2>&1
cd "$OUT" && grep -h -E "^(OK|FAIL|current)|^## |round|warm-up|checks failed|exit status|^(fp8|octave)|planner|platform method" *.txt | cut -c1-220
