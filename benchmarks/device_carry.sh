#!/bin/bash
# Builds what benchmarks/device_qualify.sh needs on the GPU machine (GPU qualification),
# here, from the committed series: the device has no package registry and a
# call carries at most 64 MiB, so everything goes into one tar split into parts
# that consecutive calls on one warm machine carry (build/stage/pN, git-ignored).
#
#   benchmarks/device_carry.sh            # needs .whl/ (vLLM's pure-Python deps)
#   APPLY_ARGS="--only route-sanitization" benchmarks/device_carry.sh   # one series only
#
# Contents of the tar:
#   qual/vllm-base.tar.gz       vllm/ at the upstream tag of build/patched
#   qual/overlay-patched.tar.gz the vllm/ files the whole series changes, at HEAD
#   qual/MANIFEST               commits and files
#   wheels/                     .whl/*.whl plus flashinfer-python 0.7.2.post1 and
#                               the CUTLASS DSL / cuDNN frontend / cuda-tile wheels
#                               its B12x allocation path imports
set -euo pipefail
cd "$(dirname "$0")/.."
PARTS=${PARTS:-4}
scripts/apply-patches -o build/patched ${APPLY_ARGS:-} >/dev/null
tree=build/patched
base=$(git -C $tree describe --tags --abbrev=0 --match 'upstream/*' HEAD)
work=build/carry; rm -rf $work build/stage; mkdir -p $work/qual $work/wheels build/stage
git -C $tree archive --format=tar "$base" vllm | gzip -6 >$work/qual/vllm-base.tar.gz
mapfile -t changed < <(git -C $tree diff --name-only "$base" HEAD -- vllm)
git -C $tree archive --format=tar HEAD "${changed[@]}" | gzip >$work/qual/overlay-patched.tar.gz
{
  echo "pristine $(git -C $tree rev-parse "$base") ($base)"
  echo "patched $(git -C $tree rev-parse HEAD) ($(git -C $tree rev-list --count "$base"..HEAD) patches)"
  echo "project $(git rev-parse HEAD)"
  printf '%s\n' "${changed[@]}"
} >$work/qual/MANIFEST
cp .whl/*.whl $work/wheels/
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d $work/wheels \
  flashinfer-python==0.7.2.post1 nvidia-cutlass-dsl==4.8.0 nvidia-cutlass-dsl-libs-base==4.8.0 \
  nvidia-cutlass-dsl-libs-core==4.8.0 nvidia-cutlass-dsl-libs-cu12==4.8.0 \
  nvidia-cudnn-frontend==1.32.0 cuda-tile==1.7.0
tar -C $work -cf build/carry.tar qual wheels
size=$(stat -c %s build/carry.tar)
part=$(((size + PARTS - 1) / PARTS))
split -b "$part" -d -a 1 build/carry.tar build/carry.part.
for i in $(seq 0 $((PARTS - 1))); do mkdir -p build/stage/p$i && mv build/carry.part.$i build/stage/p$i/; done
sha256sum build/carry.tar | cut -d' ' -f1 >build/stage/p$((PARTS - 1))/carry.sha256
rm build/carry.tar
cat $work/qual/MANIFEST | head -3
ls -l build/stage/*/
