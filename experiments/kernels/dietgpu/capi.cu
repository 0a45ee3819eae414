// C entry points over DietGPU's float codec for BF16 (experiments/bench_peers.py loads them by ctypes).
#include <cassert>
#include <cuda_runtime.h>
#include <vector>
#include "dietgpu/float/GpuFloatCodec.h"
#include "dietgpu/utils/StackDeviceMemory.h"
using namespace dietgpu;
extern "C" {
void* dg_new(int device, void* tmp, size_t bytes) { return new StackDeviceMemory(device, tmp, bytes); }
void dg_free(void* res) { delete static_cast<StackDeviceMemory*>(res); }
unsigned dg_max_size(unsigned n) { return getMaxFloatCompressedSize(FloatType::kBFloat16, n); }
int dg_compress(void* res, const void* in, unsigned n, void* out, unsigned* out_size_dev, void* stream) {
  auto cfg = FloatCompressConfig(FloatType::kBFloat16, ANSCodecConfig(10, false), false, false);
  const void* ins[1] = {in};
  unsigned sizes[1] = {n};
  void* outs[1] = {out};
  floatCompress(*static_cast<StackDeviceMemory*>(res), cfg, 1, ins, sizes, outs, out_size_dev,
                static_cast<cudaStream_t>(stream));
  return 0;
}
int dg_decompress(void* res, const void* in, void* out, unsigned cap, unsigned char* ok_dev,
                  unsigned* size_dev, void* stream) {
  auto cfg = FloatDecompressConfig(FloatType::kBFloat16, ANSCodecConfig(10, false), false, false);
  const void* ins[1] = {in};
  void* outs[1] = {out};
  unsigned caps[1] = {cap};
  auto st = floatDecompress(*static_cast<StackDeviceMemory*>(res), cfg, 1, ins, outs, caps, ok_dev,
                            size_dev, static_cast<cudaStream_t>(stream));
  return static_cast<int>(st.error);
}
}
