#!/bin/sh
# DietGPU's float codec as a plain shared library for sm_90 (static cudart), C entry points in
# capi.cu, for experiments/bench_peers.py: no torch needed.
#   experiments/kernels/dietgpu/build.sh DIETGPU_CHECKOUT [OUT_DIR=.peers]
# DIETGPU_CHECKOUT: a checkout of github.com/facebookresearch/dietgpu (measured: a4d70a1).
set -e
SRC=$(cd "$1" && pwd); OUT=$(mkdir -p "${2:-.peers}" && cd "${2:-.peers}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
B=$OUT/dietgpu_build; mkdir -p "$B/glog" "$B/obj"
cp "$HERE/glog_logging.h" "$B/glog/logging.h"
F="-O3 -std=c++17 -arch=sm_90 -Xcompiler -fPIC -I$SRC -I$B --expt-relaxed-constexpr -DNDEBUG"
for s in dietgpu/float/GpuFloatCompress.cu dietgpu/float/GpuFloatDecompress.cu dietgpu/float/GpuFloatInfo.cu \
         dietgpu/ans/GpuANSEncode.cu dietgpu/ans/GpuANSDecode.cu dietgpu/ans/GpuANSInfo.cu \
         dietgpu/utils/DeviceUtils.cpp dietgpu/utils/StackDeviceMemory.cpp; do
  nvcc $F -x cu -c "$SRC/$s" -o "$B/obj/$(basename $s).o" &
done
nvcc $F -c "$HERE/capi.cu" -o "$B/obj/capi.o" &
wait
nvcc -arch=sm_90 -shared -o "$OUT/libdietgpu_bf16.so" "$B"/obj/*.o
echo "built $OUT/libdietgpu_bf16.so"
