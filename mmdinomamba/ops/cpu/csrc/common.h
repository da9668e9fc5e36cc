// Native CPU kernels of the bidirectional Mamba-2 mixer's fast path (mmdinomamba.ops.native_cpu)
// and of the blocks' RMSNorm: both directions' depthwise conv + SiLU, and the gated merge (both
// directions' gated RMSNorms and their average), forward and backward; in the SSD scan's
// quadratic form, the strongly decaying heads, the element-wise work around its matrix products
// and those products themselves, block by block in parallel; the chunked SSD scan, forward and
// backward. The reference (mmdinomamba/ops/reference:
// bidir_mixer_ref, ssd_scan_ref, ssd_mixing_matrix, the chunked scan;
// torch.nn.functional.rms_norm) is the specification.
//
// Conv layout: a zero-padded input xp (L + 2 (K - 1) tokens), filters
// (2, C, K), bias (2, C); direction 0 (causal) reads xp[t + k] with tap k, direction 1 (the conv
// of the flipped sequence, read in the original order) reads xp[t + 2 (K - 1) - k]. The kernels
// read the token-major projection (b, L, C) and work token-major, a block of 16 channels as one
// vector, building the block's xp in cache; only the channel-major output (b, 2, C, L) and its
// gradient are transposed. The backward pass recomputes the pre-activations instead of reading
// them. The merge reads its gate and writes its output token-major too.
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <dlfcn.h>

#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>


#pragma once

namespace {


// Work buffers aligned to a cache line: the kernels load and store whole vectors of 16 floats
// (64 bytes) from them, and an unaligned one (malloc's blocks are 16-byte aligned) splits every
// such access over two cache lines, which costs Intel cores far more than AMD ones.
constexpr std::size_t CACHE_LINE = 64;

template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(CACHE_LINE)));
  }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t(CACHE_LINE)); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const CacheLineAllocator<U>&) const { return false; }
};

template <typename T>
using Buffer = std::vector<T, CacheLineAllocator<T>>;

// ---------------------------------------------------------------------------------------------
// Tile transposes between the token-major projections (b, L, C) and the channel-major layout
// of these kernels (b, C, L): dst[b, i, j] = src[b, j, i], inside the conv and the merge.
// PyTorch's strided copy reads or writes one element per cache line; here tiles of 16 x 16
// (AVX-512) or 8 x 8 (AVX) floats are loaded row by row, transposed in registers and stored row
// by row. Edge tiles and doubles go element by element (inside a tile, so both sides still stay
// in cache).
constexpr int64_t TRANSPOSE_TILE = 16;

template <typename T>
inline void transpose_tile_scalar(const T* s, int64_t ss, T* d, int64_t ds, int64_t rows,
                                  int64_t cols) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) d[i * ds + j] = s[j * ss + i];
}

#if defined(__AVX512F__)
// One 16 x 16 float tile: d[i * ds + j] = s[j * ss + i].
inline void transpose_tile16(const float* s, int64_t ss, float* d, int64_t ds) {
  __m512 r[16], t[16];
  for (int k = 0; k < 16; ++k) r[k] = _mm512_loadu_ps(s + k * ss);
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  for (int k = 0; k < 4; ++k) {
    r[4 * k] = _mm512_shuffle_ps(t[4 * k], t[4 * k + 2], 0x44);
    r[4 * k + 1] = _mm512_shuffle_ps(t[4 * k], t[4 * k + 2], 0xEE);
    r[4 * k + 2] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0x44);
    r[4 * k + 3] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0xEE);
  }
  for (int k = 0; k < 2; ++k) {
    for (int q = 0; q < 4; ++q) {
      t[8 * k + q] = _mm512_shuffle_f32x4(r[8 * k + q], r[8 * k + 4 + q], 0x88);
      t[8 * k + 4 + q] = _mm512_shuffle_f32x4(r[8 * k + q], r[8 * k + 4 + q], 0xDD);
    }
  }
  for (int q = 0; q < 8; ++q) {
    r[q] = _mm512_shuffle_f32x4(t[q], t[8 + q], 0x88);
    r[8 + q] = _mm512_shuffle_f32x4(t[q], t[8 + q], 0xDD);
  }
  for (int k = 0; k < 16; ++k) _mm512_storeu_ps(d + k * ds, r[k]);
}
#elif defined(__AVX__)
// One 8 x 8 float tile: d[i * ds + j] = s[j * ss + i].
inline void transpose_tile8(const float* s, int64_t ss, float* d, int64_t ds) {
  __m256 r[8], t[8];
  for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(s + k * ss);
  for (int k = 0; k < 4; ++k) {
    t[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  for (int k = 0; k < 2; ++k) {
    r[4 * k] = _mm256_shuffle_ps(t[4 * k], t[4 * k + 2], 0x44);
    r[4 * k + 1] = _mm256_shuffle_ps(t[4 * k], t[4 * k + 2], 0xEE);
    r[4 * k + 2] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0x44);
    r[4 * k + 3] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0xEE);
  }
  for (int q = 0; q < 4; ++q) {
    t[q] = _mm256_permute2f128_ps(r[q], r[4 + q], 0x20);
    t[4 + q] = _mm256_permute2f128_ps(r[q], r[4 + q], 0x31);
  }
  for (int k = 0; k < 8; ++k) _mm256_storeu_ps(d + k * ds, t[k]);
}
#endif

// A TRANSPOSE_TILE x TRANSPOSE_TILE block (or its edge part: rows x cols) of dst.
template <typename T>
inline void transpose_block(const T* s, int64_t ss, T* d, int64_t ds, int64_t rows,
                            int64_t cols) {
  transpose_tile_scalar(s, ss, d, ds, rows, cols);
}

template <>
inline void transpose_block<float>(const float* s, int64_t ss, float* d, int64_t ds,
                                   int64_t rows, int64_t cols) {
  if (rows == TRANSPOSE_TILE && cols == TRANSPOSE_TILE) {
#if defined(__AVX512F__)
    transpose_tile16(s, ss, d, ds);
    return;
#elif defined(__AVX__)
    for (int64_t i = 0; i < TRANSPOSE_TILE; i += 8)
      for (int64_t j = 0; j < TRANSPOSE_TILE; j += 8)
        transpose_tile8(s + j * ss + i, ss, d + i * ds + j, ds);
    return;
#endif
  }
  transpose_tile_scalar(s, ss, d, ds, rows, cols);
}

// dst (rows x cols, row stride ds) = the transpose of src (cols x rows, row stride ss), tile by
// tile, a row of tiles of dst at a time: token-major to channel-major (rows = channels) and back
// (rows = tokens).
template <typename T>
void transpose_tiles(const T* src, int64_t ss, T* dst, int64_t ds, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; i += TRANSPOSE_TILE)
    for (int64_t j = 0; j < cols; j += TRANSPOSE_TILE)
      transpose_block(src + j * ss + i, ss, dst + i * ds + j, ds,
                      std::min(TRANSPOSE_TILE, rows - i), std::min(TRANSPOSE_TILE, cols - j));
}

// A token-major (b, L, C) operand (a view into the projections or their gradient): its data and
// strides (unit channel stride).
template <typename T>
struct Tokens {
  T* data;
  int64_t batch_stride, token_stride;
  T* at(int64_t b, int64_t t, int64_t c) const {
    return data + b * batch_stride + t * token_stride + c;
  }
};

template <typename T, typename Ten>
Tokens<T> tokens(Ten& t) {
  return {static_cast<T*>(t.data_ptr()), t.stride(0), t.stride(1)};
}

// A (b, L, C) token-major operand: unit channel stride, tokens and samples apart.
void check_token_major(const at::Tensor& t, int64_t batch, int64_t length, int64_t channels,
                       at::ScalarType dtype, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 3 &&
                  t.sizes() == at::IntArrayRef({batch, length, channels}) &&
                  (t.stride(2) == 1 || channels == 1) && t.stride(1) >= channels &&
                  (batch == 1 || t.stride(0) >= length * t.stride(1)) && t.scalar_type() == dtype,
              what, " must be a (b, L, C) = (", batch, ", ", length, ", ", channels,
              ") CPU tensor of the right dtype with unit channel stride (a view into the "
              "projections is fine), got ", t.sizes(), " strides ", t.strides());
}


// exp(x) for the element-wise loops: std::exp in float64; in float32 inlined, so that a loop
// vectorizes without a call into the vector math library per vector and without scalar calls
// for its remainder: exp(x) = 2^n exp(r) with n = round(x / ln 2), r = x - n ln 2 (ln 2 in two
// parts), exp(r) by its polynomial of degree 7 on |r| <= ln 2 / 2 (the coefficients of Cephes'
// expf, within 1.5 ulp of exp), 2^n built in the exponent bits. x is clamped to [-87, 88], where
// both 2^n and the result are normal floats: callers only pass arguments whose results below
// exp(-87) or above exp(88) do not matter (they cap them themselves).
template <typename T>
inline T exp_inline(T x) {
  return std::exp(x);
}

template <>
inline float exp_inline<float>(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(n, -0.693359375f, x);
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r + 1.0f);
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// exp(-p) with the exponent capped at 80 (under -ffast-math, a division by an infinite
// 1 + exp(-p) may give NaN; exp(-80) is far below the resolution of SiLU at such p).
template <typename T>
inline T exp_neg(T p) {
  return exp_inline(std::min(-p, T(80)));
}

// 1 / sqrt(mean + eps) of a sum of squares over n values: the RMSNorm scale.
template <typename T>
inline T inverse_rms(T sum_sq, int64_t n, T eps) {
  return T(1) / std::sqrt(sum_sq / T(n) + eps);
}

// silu(p) = p / (1 + exp(-p)).
template <typename T>
inline T silu(T p) {
  return p / (T(1) + exp_neg(p));
}

// silu'(p) = s (1 + p (1 - s)) from e = exp_neg(p) and s = 1 / (1 + e), written with
// 1 - s = e s: no difference of near-equal terms that reassociation could create. p is capped
// below at -80 as e is: -ffast-math may multiply p e first, which overflows float32 for
// p < -6000 or so against e = exp(80); below -80 the derivative is below 1.5e-33 anyway.
template <typename T>
inline T silu_grad(T p, T e, T s) {
  return s * (T(1) + std::max(p, T(-80)) * e * s);
}

}  // namespace
