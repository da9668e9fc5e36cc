// Native CPU kernels of the bidirectional Mamba-2 mixer's fast path (mmdinomamba.ops.native_cpu)
// and of the blocks' RMSNorm: both directions' depthwise conv + SiLU, and the gated merge (both
// directions' gated RMSNorms and their average), forward and backward; in the SSD scan's
// quadratic form, the strongly decaying heads' (L, L) weights and their gradients, the
// element-wise work around its matrix products and those products themselves, block by block
// in parallel; the transposed copies between the token-major projections and the channel-major
// layout of all of these; the chunked SSD scan, forward and backward. The PyTorch compositions
// they replace (shift_conv.py, bidir_inner.merge_forward / merge_backward,
// ssd_quadratic_heads.py, ssd_quadratic.py, ssd_triangles.py, torch.nn.functional.rms_norm,
// Tensor.copy_ of a transposed view, ssd_chunked.py and ssd_chunked_bwd.py) are the
// specification.
//
// Conv layout (that of shift_conv.py): a zero-padded input xp (L + 2 (K - 1) tokens), filters
// (2, C, K), bias (2, C); direction 0 (causal) reads xp[t + k] with tap k, direction 1 (the conv
// of the flipped sequence, read in the original order) reads xp[t + 2 (K - 1) - k]. The kernels
// read the token-major projection (b, L, C) and work token-major, a block of 16 channels as one
// vector, building the block's xp in cache; only the channel-major output (b, 2, C, L) and its
// gradient are transposed. The backward pass recomputes the pre-activations instead of reading
// them. The merge reads its gate and writes its output token-major too, so between the
// projections only the merge without RMSNorm still copies whole tensors across layouts.
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
// of these kernels (b, C, L): dst[b, i, j] = src[b, j, i], for the copies (transpose_into, at
// the end) and inside the merge. PyTorch's strided copy reads or
// writes one element per cache line; here tiles of 16 x 16 (AVX-512) or 8 x 8 (AVX) floats are
// loaded row by row, transposed in registers and stored row by row. Edge tiles and doubles go
// element by element (inside a tile, so both sides still stay in cache).
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

// The conv runs token-major, with a block of W = TRANSPOSE_TILE channels as one vector: per
// sample and block, the block's input rows are copied into a zero-padded token-major buffer
// (L + 2 (K - 1)) x W, token t of direction 0 (causal) reads its padded rows t + k with tap k,
// direction 1 its rows t + 2 (K - 1) - k; the channel-major outputs and gradients are transposed
// to or from W-wide token-major buffers. Every vector is full whatever L is (a channel-major
// pass would run rows of L = 17 or 65 tokens: one or four vectors and a scalar remainder each).

// One token's W lanes, a fixed-size copy (vector loads and stores, no library call).
template <typename T>
inline void copy_lanes(const T* src, T* dst) {
#pragma omp simd
  for (int64_t i = 0; i < TRANSPOSE_TILE; ++i) dst[i] = src[i];
}

// A block's filters tap-major, w[k][i] (zero for channels past the block's nc), and biases.
template <int K, typename T>
struct BlockFilters {
  T w[2][K][TRANSPOSE_TILE];
  T b[2][TRANSPOSE_TILE];
  BlockFilters(const T* weight, const T* bias, int64_t channels, int64_t c0, int64_t nc) {
    for (int r = 0; r < 2; ++r)
      for (int64_t i = 0; i < TRANSPOSE_TILE; ++i) {
        const int64_t c = r * channels + c0 + i;
        for (int k = 0; k < K; ++k) w[r][k][i] = i < nc ? weight[c * K + k] : T(0);
        b[r][i] = i < nc && bias ? bias[c] : T(0);
      }
  }
};

// The block's input rows of sample b into the padded token-major xt ((L + 2 (K - 1)) x W,
// padding rows zero); columns past nc zero.
template <int K, typename T>
void load_block_rows(Tokens<const T> x, int64_t b, int64_t c0, int64_t nc, int64_t length,
                     T* xt) {
  constexpr int64_t W = TRANSPOSE_TILE;
  for (int64_t t = 0; t < length; ++t) {
    const T* src = x.at(b, t, c0);
    T* dst = xt + (t + K - 1) * W;
    if (nc == W) {
      copy_lanes(src, dst);
    } else {
      std::copy(src, src + nc, dst);
      std::fill(dst + nc, dst + W, T(0));
    }
  }
}

// Pre-activations of both directions at the token whose padded rows start at xr (lane i).
template <int K, typename T>
inline void pre_activations(const BlockFilters<K, T>& f, const T* xr, int64_t i, T* p0, T* p1) {
  constexpr int64_t W = TRANSPOSE_TILE;
  T a = f.b[0][i], c = f.b[1][i];
#pragma GCC unroll 8
  for (int k = 0; k < K; ++k) {
    a += f.w[0][k][i] * xr[k * W + i];
    c += f.w[1][k][i] * xr[(2 * (K - 1) - k) * W + i];
  }
  *p0 = a;
  *p1 = c;
}

template <int K, typename T>
void forward_kernel(Tokens<const T> x, const T* weight, const T* bias, T* act, int64_t batch,
                    int64_t channels, int64_t length) {
  constexpr int64_t W = TRANSPOSE_TILE;
  const int64_t padded = length + 2 * (K - 1);
  const int64_t blocks = (channels + W - 1) / W;
  at::parallel_for(0, batch * blocks, 1, [&](int64_t begin, int64_t end) {
    Buffer<T> xt(padded * W, T(0)), out(2 * length * W);  // xt's padding stays zero
    Buffer<T> rows(W * length);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / blocks, c0 = (item % blocks) * W;
      const int64_t nc = std::min(W, channels - c0);
      const BlockFilters<K, T> f(weight, bias, channels, c0, nc);
      load_block_rows<K>(x, b, c0, nc, length, xt.data());
      T* o0 = out.data();
      T* o1 = o0 + length * W;
      for (int64_t t = 0; t < length; ++t) {
        const T* xr = xt.data() + t * W;
#pragma omp simd
        for (int64_t i = 0; i < W; ++i) {
          T p0, p1;
          pre_activations(f, xr, i, &p0, &p1);
          o0[t * W + i] = silu(p0);
          o1[t * W + i] = silu(p1);
        }
      }
      // a block's rows of act are one contiguous range per direction: transposed in cache,
      // then copied in one sequential pass (the kernel 1.0-1.14x faster at DinoVim-T's size,
      // 1.13-1.3x at the demo's 65 tokens, than storing the tiles' rows straight into act)
      transpose_tiles(o0, W, rows.data(), length, nc, length);
      std::copy(rows.data(), rows.data() + nc * length, act + (b * 2 * channels + c0) * length);
      transpose_tiles(o1, W, rows.data(), length, nc, length);
      std::copy(rows.data(), rows.data() + nc * length,
                act + ((b * 2 + 1) * channels + c0) * length);
    }
  });
}

// The gradient of the conv's output (b, 2, C, L) given as channel ranges of up to three
// contiguous (b, 2, C_i, L) tensors (the scan's du, dB, dC), so that nobody concatenates them.
template <typename T>
struct ChannelParts {
  const T* data[3];
  int64_t end[3];  // channels [end[i - 1], end[i]) are part i's
  int count;
  // Rows [c0, c0 + nc) of direction r of sample b, transposed into the token-major out
  // (L x W): out[t * W + c - c0] = dact[b, r, c, t], run by run of channels inside one part.
  void transpose_block(int64_t b, int64_t r, int64_t c0, int64_t nc, int64_t length,
                       T* out) const {
    int64_t start = 0;
    for (int i = 0; i < count; ++i) {
      const int64_t lo = std::max(c0, start), hi = std::min(c0 + nc, end[i]);
      if (lo < hi) {
        const T* src = data[i] + ((b * 2 + r) * (end[i] - start) + lo - start) * length;
        transpose_tiles(src, length, out + (lo - c0), TRANSPOSE_TILE, length, hi - lo);
      }
      start = end[i];
    }
  }
};

// The filter gradients of one (sample, block) work item, lane i: channel c0 + i.
template <int K, typename T>
struct FilterGrads {
  T w[2][K][TRANSPOSE_TILE];
  T b[2][TRANSPOSE_TILE];
};

template <int K, typename T>
void backward_kernel(Tokens<const T> x, const T* weight, const T* bias, ChannelParts<T> dact,
                     Tokens<T> dx, T* dw, T* db, int64_t batch, int64_t channels, int64_t length) {
  constexpr int64_t W = TRANSPOSE_TILE;
  const int64_t padded = length + 2 * (K - 1);
  const int64_t blocks = (channels + W - 1) / W;
  // (sample, block) items in parallel, sample by sample as the forward pass runs them: a
  // sample's token rows of the projection and of its gradient (one 4 KB page apart or more)
  // stay in the TLB and in cache while its blocks read and write their 16 channels of each
  // row; running a block through every sample instead thrashed the TLB (1.3x the time). Each
  // item keeps its filter gradients (summed token by token), added up sample by sample below.
  std::vector<FilterGrads<K, T>> parts(batch * blocks);
  at::parallel_for(0, batch * blocks, 1, [&](int64_t begin, int64_t end) {
    Buffer<T> xt(padded * W, T(0)), da(2 * length * W, T(0));
    Buffer<T> g(2 * padded * W, T(0));  // d(pre) of both directions, padded like xt
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / blocks, c0 = (item % blocks) * W;
      const int64_t nc = std::min(W, channels - c0);
      const BlockFilters<K, T> f(weight, bias, channels, c0, nc);
      T aw[2][K][W] = {}, ab[2][W] = {};
      T* g0 = g.data();
      T* g1 = g0 + padded * W;
      load_block_rows<K>(x, b, c0, nc, length, xt.data());
      const T* d0 = da.data();
      const T* d1 = d0 + length * W;
      dact.transpose_block(b, 0, c0, nc, length, da.data());
      dact.transpose_block(b, 1, c0, nc, length, da.data() + length * W);
      for (int64_t t = 0; t < length; ++t) {
        const T* xr = xt.data() + t * W;
#pragma omp simd
        for (int64_t i = 0; i < W; ++i) {
          T p0, p1;
          pre_activations(f, xr, i, &p0, &p1);
          const T e0 = exp_neg(p0), e1 = exp_neg(p1);
          const T q0 = d0[t * W + i] * silu_grad(p0, e0, T(1) / (T(1) + e0));
          const T q1 = d1[t * W + i] * silu_grad(p1, e1, T(1) / (T(1) + e1));
          g0[(t + K - 1) * W + i] = q0;
          g1[(t + K - 1) * W + i] = q1;
          ab[0][i] += q0;
          ab[1][i] += q1;
#pragma GCC unroll 8
          for (int k = 0; k < K; ++k) {
            aw[0][k][i] += q0 * xr[k * W + i];
            aw[1][k][i] += q1 * xr[(2 * (K - 1) - k) * W + i];
          }
        }
      }
      // input token s sits at padded row s + K - 1: direction 0's tap k read it at
      // t = s + K - 1 - k, direction 1's at t = s - K + 1 + k (g is offset by K - 1)
      for (int64_t s = 0; s < length; ++s) {
        T v[W];
#pragma omp simd
        for (int64_t i = 0; i < W; ++i) {
          T acc = 0;
#pragma GCC unroll 8
          for (int k = 0; k < K; ++k)
            acc += f.w[0][k][i] * g0[(s + 2 * (K - 1) - k) * W + i] +
                   f.w[1][k][i] * g1[(s + k) * W + i];
          v[i] = acc;
        }
        if (nc == W)
          copy_lanes(v, dx.at(b, s, c0));
        else
          std::copy(v, v + nc, dx.at(b, s, c0));
      }
      FilterGrads<K, T>& part = parts[item];
      std::copy(&aw[0][0][0], &aw[0][0][0] + 2 * K * W, &part.w[0][0][0]);
      std::copy(&ab[0][0], &ab[0][0] + 2 * W, &part.b[0][0]);
    }
  });
  // the items' sums in sample order, whatever the threads: the same bits on any thread count
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * W, nc = std::min(W, channels - c0);
    for (int64_t i = 0; i < nc; ++i)
      for (int r = 0; r < 2; ++r) {
        const int64_t c = r * channels + c0 + i;
        T sb = 0, sw[K] = {};
        for (int64_t b = 0; b < batch; ++b) {
          const FilterGrads<K, T>& part = parts[b * blocks + blk];
          sb += part.b[r][i];
          for (int k = 0; k < K; ++k) sw[k] += part.w[r][k][i];
        }
        for (int k = 0; k < K; ++k) dw[c * K + k] = sw[k];
        if (db) db[c] = sb;
      }
  }
}

void check(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 3, "native conv: x must be a (b, L, C) tensor, got ", x.sizes());
  check_token_major(x, x.size(0), x.size(1), x.size(2), x.scalar_type(), "native conv: x");
  TORCH_CHECK(weight.dim() == 3 && weight.size(0) == 2 && weight.size(1) == x.size(2) &&
                  weight.is_contiguous() && weight.scalar_type() == x.scalar_type(),
              "native conv: weight must be a contiguous (2, C, K) tensor of x's dtype");
  TORCH_CHECK(!bias || (bias->is_contiguous() && bias->numel() == 2 * x.size(2) &&
                        bias->scalar_type() == x.scalar_type()),
              "native conv: bias must be a contiguous (2, C) tensor of x's dtype");
  TORCH_CHECK(x.size(1) > 0, "native conv: empty sequence");
}

template <typename F>
void with_kernel_size(int64_t k, F&& f) {
  switch (k) {
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    default: TORCH_CHECK(false, "native conv: kernel sizes 2-4 only, got ", k);
  }
}

at::Tensor conv_silu_forward(const at::Tensor& x, const at::Tensor& weight,
                             const std::optional<at::Tensor>& bias) {
  check(x, weight, bias);
  const int64_t batch = x.size(0), length = x.size(1), channels = x.size(2);
  const int64_t kernel = weight.size(2);
  auto act = at::empty({batch, 2, channels, length}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "conv_silu_forward", [&] {
    with_kernel_size(kernel, [&](auto K) {
      forward_kernel<decltype(K)::value, scalar_t>(
          tokens<const scalar_t>(x), weight.data_ptr<scalar_t>(),
          bias ? bias->data_ptr<scalar_t>() : nullptr, act.data_ptr<scalar_t>(), batch, channels,
          length);
    });
  });
  return act;
}

std::vector<at::Tensor> conv_silu_backward(const std::vector<at::Tensor>& dact,
                                           const at::Tensor& x, const at::Tensor& weight,
                                           const std::optional<at::Tensor>& bias,
                                           at::Tensor& dx) {
  check(x, weight, bias);
  const int64_t batch = x.size(0), length = x.size(1), channels = x.size(2);
  const int64_t kernel = weight.size(2);
  TORCH_CHECK(!dact.empty() && dact.size() <= 3,
              "native conv: dact must be one to three (b, 2, C_i, L) parts, got ", dact.size());
  std::vector<at::Tensor> parts;
  int64_t covered = 0;
  for (const auto& part : dact) {
    TORCH_CHECK(part.dim() == 4 && part.size(0) == batch && part.size(1) == 2 &&
                    part.size(3) == length && part.scalar_type() == x.scalar_type(),
                "native conv: each part of dact must be (b, 2, C_i, L) = (", batch, ", 2, C_i, ",
                length, ") of x's dtype, got ", part.sizes());
    covered += part.size(2);
    parts.push_back(part.contiguous());
  }
  TORCH_CHECK(covered == channels, "native conv: the parts of dact cover ", covered,
              " channels, x has ", channels);
  check_token_major(dx, batch, length, channels, x.scalar_type(), "native conv: dx");
  auto dw = at::empty_like(weight);
  auto db = at::empty({2, channels}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "conv_silu_backward", [&] {
    ChannelParts<scalar_t> rows{};
    rows.count = static_cast<int>(parts.size());
    for (int i = 0; i < rows.count; ++i) {
      rows.data[i] = parts[i].data_ptr<scalar_t>();
      rows.end[i] = (i ? rows.end[i - 1] : 0) + parts[i].size(2);
    }
    with_kernel_size(kernel, [&](auto K) {
      backward_kernel<decltype(K)::value, scalar_t>(
          tokens<const scalar_t>(x), weight.data_ptr<scalar_t>(),
          bias ? bias->data_ptr<scalar_t>() : nullptr, rows,
          tokens<scalar_t>(dx), dw.data_ptr<scalar_t>(),
          bias ? db.data_ptr<scalar_t>() : nullptr, batch, channels, length);
    });
  });
  if (!bias) return {dw};
  return {dw, db};
}

// ---------------------------------------------------------------------------------------------
// The gated merge: out = (rmsnorm(y_0 g) w_0 + rmsnorm(y_1 g) w_1) / 2 with g = silu(z), the
// root mean square over groups of d / G channels. y (b, 2, d, L) and dy are channel-major (the
// scan's layout); z, the output, dm and dz are token-major (b, L, d) views into the projections
// (unit channel stride, any token stride). The work runs token-major, token by token with the
// channels as vectors (the root mean squares are sums over a token's channels): per sample and
// tile of merge_tokens(d) tokens, the tile of y (and of dy in the backward pass) is transposed
// between the channel-major layout and token-major scratch that stays in cache; z, dm, dz and
// the output are read and written in place. Every vector is full whatever L is.
//
// Tiles of 64 tokens: their y and dy scratch (2 x 64 x d values each) stays in a core's L2 up to
// d = 1024; 16 tokens above that. At DinoVim-T's d = 512 (batch 8, 197 tokens, 2 threads) the
// backward kernel ran 1.2x faster with 64 than with 16 (3.7 against 4.5 ms), the forward kernel
// as fast; at the demo's d = 128 no slower; at d = 1536 the forward kernel 1.1x slower.
inline int64_t merge_tokens(int64_t d) { return d > 1024 ? 16 : 64; }

// The halved norm weights w / 2 (2, d), as both passes use them.
template <typename T>
Buffer<T> half_weights(const T* w, int64_t d) {
  Buffer<T> h(2 * d);
  for (int64_t c = 0; c < 2 * d; ++c) h[c] = T(0.5) * w[c];
  return h;
}

// The tile [t0, t0 + n) of y's (or dy's) two directions of sample b: channel-major rows of the
// (b, 2, d, L) tensor <-> token-major scratch (2, merge_tokens(d), d).
template <typename T>
void tile_to_tokens(const T* y, int64_t b, int64_t t0, int64_t n, int64_t d, int64_t length,
                    T* scratch) {
  for (int64_t r = 0; r < 2; ++r)
    transpose_tiles(y + (b * 2 + r) * d * length + t0, length,
                    scratch + r * merge_tokens(d) * d, d, n, d);
}

template <typename T>
void tile_to_channels(const T* scratch, int64_t b, int64_t t0, int64_t n, int64_t d,
                      int64_t length, T* y) {
  for (int64_t r = 0; r < 2; ++r)
    transpose_tiles(scratch + r * merge_tokens(d) * d, d, y + (b * 2 + r) * d * length + t0,
                    length, d, n);
}

template <typename T>
void merge_forward_kernel(const T* y, Tokens<const T> z, const T* w, Tokens<T> out,
                          int64_t batch, int64_t d, int64_t length, int64_t groups, T eps) {
  const int64_t cg = d / groups;
  const int64_t mt = merge_tokens(d), tiles = (length + mt - 1) / mt;
  const Buffer<T> wh = half_weights(w, d);
  at::parallel_for(0, batch * tiles, 1, [&](int64_t begin, int64_t end) {
    Buffer<T> ys(2 * mt * d), gate(d);
    const T* w0 = wh.data();
    const T* w1 = w0 + d;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / tiles, t0 = (item % tiles) * mt;
      const int64_t n = std::min(mt, length - t0);
      tile_to_tokens(y, b, t0, n, d, length, ys.data());
      for (int64_t t = 0; t < n; ++t) {
        const T* zr = z.at(b, t0 + t, 0);
        const T* y0 = ys.data() + t * d;
        const T* y1 = y0 + mt * d;
        T* o = out.at(b, t0 + t, 0);
        for (int64_t c0 = 0; c0 < d; c0 += cg) {
          T* g = gate.data();
          T s0 = 0, s1 = 0;
#pragma omp simd reduction(+ : s0, s1)
          for (int64_t c = c0; c < c0 + cg; ++c) {
            const T gc = silu(zr[c]);
            const T h0 = y0[c] * gc, h1 = y1[c] * gc;
            s0 += h0 * h0;
            s1 += h1 * h1;
            g[c] = gc;
          }
          const T r0 = inverse_rms(s0, cg, eps), r1 = inverse_rms(s1, cg, eps);
#pragma omp simd
          for (int64_t c = c0; c < c0 + cg; ++c)
            o[c] = g[c] * (y0[c] * r0 * w0[c] + y1[c] * r1 * w1[c]);
        }
      }
    }
  });
}

// The merge's y as its backward kernel reads it: tile by tile of the channel-major (b, 2, d, L)
// tensor, into the token-major scratch (ScanOutputInput rebuilds it from the scan's state).
template <typename T>
struct MergeInput {
  const T* y;
  int64_t d, length;
  int64_t work_size() const { return 0; }
  void to_tokens(int64_t b, int64_t t0, int64_t n, T* scratch, T* /* work */) const {
    tile_to_tokens(y, b, t0, n, d, length, scratch);
  }
};

// Gradients for dm: dy (b, 2, d, L), dz (token-major) and the weight's gradient of every tile
// dw (b * tiles, 2, d) (summed by the caller: a fixed split, whatever the thread count); with
// Out (out.data set), the forward pass's output again (token-major), from the values the
// gradients use. y: a MergeInput or a ScanOutputInput.
template <bool Out, typename T, typename Y>
void merge_backward_kernel(Tokens<const T> dm, const Y& y, Tokens<const T> z, const T* w,
                           T* dy, Tokens<T> dz, T* dw, Tokens<T> out, int64_t batch, int64_t d,
                           int64_t length, int64_t groups, T eps) {
  const int64_t cg = d / groups;
  const int64_t mt = merge_tokens(d), tiles = (length + mt - 1) / mt;
  const Buffer<T> wh = half_weights(w, d);
  at::parallel_for(0, batch * tiles, 1, [&](int64_t begin, int64_t end) {
    // the tile's y and dy (token-major), one token's exp(-z), and y's own scratch
    Buffer<T> ys(2 * mt * d), dys(2 * mt * d), es(d), work(y.work_size());
    const T* w0 = wh.data();
    const T* w1 = w0 + d;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / tiles, t0 = (item % tiles) * mt;
      const int64_t n = std::min(mt, length - t0);
      T* dw0 = dw + item * 2 * d;
      T* dw1 = dw0 + d;
      std::fill(dw0, dw0 + 2 * d, T(0));
      y.to_tokens(b, t0, n, ys.data(), work.data());
      for (int64_t t = 0; t < n; ++t) {
        const T* zr = z.at(b, t0 + t, 0);
        const T* g = dm.at(b, t0 + t, 0);
        T* dzr = dz.at(b, t0 + t, 0);
        T* o = Out ? out.at(b, t0 + t, 0) : nullptr;
        const T* y0 = ys.data() + t * d;
        const T* y1 = y0 + mt * d;
        T* dy0 = dys.data() + t * d;
        T* dy1 = dy0 + mt * d;
        T* ez = es.data();
        for (int64_t c0 = 0; c0 < d; c0 += cg) {
          // pass 1: sums of squares, and sum_c dn h (dn = dm w / 2); ez holds exp(-z)
          T r0 = 0, r1 = 0, m0 = 0, m1 = 0;
#pragma omp simd reduction(+ : r0, r1, m0, m1)
          for (int64_t c = c0; c < c0 + cg; ++c) {
            const T e = exp_neg(zr[c]);
            const T gate = zr[c] / (T(1) + e);
            const T h0 = y0[c] * gate, h1 = y1[c] * gate;
            r0 += h0 * h0;
            r1 += h1 * h1;
            m0 += w0[c] * g[c] * h0;
            m1 += w1[c] * g[c] * h1;
            ez[c] = e;
          }
          r0 = inverse_rms(r0, cg, eps);
          r1 = inverse_rms(r1, cg, eps);
          // mean_c(dn n) = rstd mean_c(dn h); kept as rstd^2 mean_c(dn h) for dh below
          m0 = m0 / T(cg) * r0 * r0;
          m1 = m1 / T(cg) * r1 * r1;
          // pass 2: dh = (dn - n mean(dn n)) rstd = rstd dn - h rstd^2 mean(dn h)
#pragma omp simd
          for (int64_t c = c0; c < c0 + cg; ++c) {
            const T e = ez[c];
            const T s = T(1) / (T(1) + e);
            const T gate = zr[c] * s;
            const T h0 = y0[c] * gate, h1 = y1[c] * gate;
            const T dh0 = r0 * (w0[c] * g[c] - h0 * m0);
            const T dh1 = r1 * (w1[c] * g[c] - h1 * m1);
            dw0[c] += h0 * r0 * g[c];
            dw1[c] += h1 * r1 * g[c];
            if constexpr (Out)  // merge_forward_kernel's expression: the same bits
              o[c] = (zr[c] / (T(1) + e)) * (y0[c] * r0 * w0[c] + y1[c] * r1 * w1[c]);
            dy0[c] = dh0 * gate;
            dy1[c] = dh1 * gate;
            const T dgate = dh0 * y0[c] + dh1 * y1[c];
            dzr[c] = dgate * silu_grad(zr[c], e, s);
          }
        }
      }
      for (int64_t c = 0; c < 2 * d; ++c) dw0[c] *= T(0.5);
      tile_to_channels(dys.data(), b, t0, n, d, length, dy);
    }
  });
}

void check_tokens_like(const at::Tensor& t, const at::Tensor& y, const char* what) {
  check_token_major(t, y.size(0), y.size(3), y.size(2), y.scalar_type(), what);
}

// The merge's weight (2, d) in the operands' dtype and its groups of channels.
void check_merge_weight(const at::Tensor& weight, int64_t groups, int64_t d,
                        at::ScalarType dtype) {
  TORCH_CHECK(weight.numel() == 2 * d && weight.is_contiguous() && weight.scalar_type() == dtype,
              "native merge: weight must be a contiguous (2, d) tensor of the operands' dtype");
  TORCH_CHECK(groups > 0 && d % groups == 0, "native merge: ", groups,
              " groups do not divide d = ", d);
}

void check_merge(const at::Tensor& y, const at::Tensor& weight, int64_t groups) {
  TORCH_CHECK(y.device().is_cpu() && y.dim() == 4 && y.size(1) == 2 && y.is_contiguous(),
              "native merge: y must be a contiguous (b, 2, d, L) CPU tensor");
  check_merge_weight(weight, groups, y.size(2), y.scalar_type());
}

// The merge backward pass's token-major operands (b, L, d): dm, z, dz and out if given.
void check_merge_tokens(const at::Tensor& dm, const at::Tensor& z, const at::Tensor& dz,
                        const std::optional<at::Tensor>& out, int64_t batch, int64_t length,
                        int64_t d, at::ScalarType dtype) {
  check_token_major(dm, batch, length, d, dtype, "native merge: dm");
  check_token_major(z, batch, length, d, dtype, "native merge: z");
  check_token_major(dz, batch, length, d, dtype, "native merge: dz");
  if (out) check_token_major(*out, batch, length, d, dtype, "native merge: out");
}

void merge_forward(const at::Tensor& y, const at::Tensor& z, const at::Tensor& weight,
                   int64_t groups, double eps, at::Tensor& out) {
  check_merge(y, weight, groups);
  check_tokens_like(z, y, "native merge: z");
  check_tokens_like(out, y, "native merge: out");
  const int64_t batch = y.size(0), d = y.size(2), length = y.size(3);
  AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "merge_forward", [&] {
    merge_forward_kernel<scalar_t>(y.data_ptr<scalar_t>(), tokens<const scalar_t>(z),
                                   weight.data_ptr<scalar_t>(), tokens<scalar_t>(out), batch, d,
                                   length, groups, static_cast<scalar_t>(eps));
  });
}

// merge_backward_kernel for y given by make_input(scalar_t tag) (a MergeInput or a
// ScanOutputInput); returns [dy (b, 2, d, L), dweight (2, d)].
template <typename MakeInput>
std::vector<at::Tensor> merge_backward_of(const at::Tensor& dm, MakeInput&& make_input,
                                          const at::Tensor& z, const at::Tensor& weight,
                                          int64_t groups, double eps, at::Tensor& dz,
                                          const std::optional<at::Tensor>& out, int64_t batch,
                                          int64_t d, int64_t length) {
  auto dy = at::empty({batch, 2, d, length}, z.options().dtype(dm.scalar_type()));
  const int64_t mt = merge_tokens(d), tiles = (length + mt - 1) / mt;
  auto dw = at::empty({batch * tiles, 2, d}, dy.options());
  AT_DISPATCH_FLOATING_TYPES(dm.scalar_type(), "merge_backward", [&] {
    const auto input = make_input(scalar_t(0));
    using Input = std::decay_t<decltype(input)>;
    auto kernel = out ? merge_backward_kernel<true, scalar_t, Input>
                      : merge_backward_kernel<false, scalar_t, Input>;
    kernel(tokens<const scalar_t>(dm), input, tokens<const scalar_t>(z),
           weight.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(), tokens<scalar_t>(dz),
           dw.data_ptr<scalar_t>(), out ? tokens<scalar_t>(*out) : Tokens<scalar_t>{}, batch, d,
           length, groups, static_cast<scalar_t>(eps));
  });
  return {dy, dw.sum(0)};
}

std::vector<at::Tensor> merge_backward(const at::Tensor& dm, const at::Tensor& y,
                                       const at::Tensor& z, const at::Tensor& weight,
                                       int64_t groups, double eps, at::Tensor& dz,
                                       std::optional<at::Tensor> out) {
  check_merge(y, weight, groups);
  const int64_t batch = y.size(0), d = y.size(2), length = y.size(3);
  check_merge_tokens(dm, z, dz, out, batch, length, d, y.scalar_type());
  return merge_backward_of(
      dm,
      [&](auto tag) {
        using T = decltype(tag);
        return MergeInput<T>{y.data_ptr<T>(), d, length};
      },
      z, weight, groups, eps, dz, out, batch, d, length);
}

// ---- the SSD scan's strongly decaying heads (ssd_quadratic_heads.py) ----
// Head n's weights W_ij = exp(clamp(hi_i - hi_j, -60, 0)) cb_ij on the strict lower (direction
// 0) or strict upper (direction 1) triangle, zero elsewhere, with cb = cbs[index[n]] its
// sample's and group's (L, L) matrix: the exponentials are computed on the triangle only and
// nothing (L, L) is kept besides the output.

template <typename T>
inline T decay(T d) {
  return exp_inline(std::min(std::max(d, T(-60)), T(0)));
}

// The columns j of row i inside direction dir's strict triangle: [*j0, *j1).
inline void triangle_row(int64_t dir, int64_t i, int64_t length, int64_t* j0, int64_t* j1) {
  *j0 = dir == 0 ? 0 : i + 1;
  *j1 = dir == 0 ? i : length;
}

// The fused kernels' decay factor (wide_forward, wide_backward): zero instead of exp(-60) at the
// floor, so that the columns of a token block where all of them sit there can be skipped.
template <typename T>
inline T decay_or_zero(T d) {
  return d <= T(-60) ? T(0) : exp_inline(std::min(d, T(0)));
}

// One head's weights (or, with `transpose`, their transpose) into w (L x L), zero off the
// triangle; cb its (L, L) group matrix. With a Band (lo, hi: per row, the columns of the
// triangle to fill; not with `transpose`), the factors of decay_or_zero there and zero elsewhere.
template <bool Band = false, typename T>
void head_weights(const T* h, const T* cb, int64_t length, int64_t dir, bool transpose, T* w,
                  const int64_t* lo = nullptr, const int64_t* hi = nullptr) {
  std::fill(w, w + length * length, T(0));
  for (int64_t i = 0; i < length; ++i) {
    int64_t j0, j1;
    // transposed: row i of the output is column i of W (its triangle is the other one)
    triangle_row(transpose ? 1 - dir : dir, i, length, &j0, &j1);
    if constexpr (Band) {
      j0 = lo[i];
      j1 = hi[i];
    }
    T* wr = w + i * length;
    const T hi_i = h[i];
    if (transpose) {
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) wr[j] = decay(h[j] - hi_i) * cb[j * length + i];
    } else {
      const T* cr = cb + i * length;
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j)
        wr[j] = (Band ? decay_or_zero(hi_i - h[j]) : decay(hi_i - h[j])) * cr[j];
    }
  }
}

template <typename T>
void wide_weights_kernel(const T* hi, const T* cbs, const int64_t* index, T* out, int64_t heads,
                         int64_t length, int64_t dir, bool transpose) {
  const int64_t area = length * length;
  at::parallel_for(0, heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n)
      head_weights(hi + n * length, cbs + index[n] * area, length, dir, transpose,
                   out + n * area);
  });
}

// One head's part of wide_grads_kernel: g its dW (L x L; only the triangle is read), h and tn
// its hi and t, cb and dcb its group matrix and gradient, col a scratch of L; writes ds (L) and
// returns the head's pair sum. With a Band (lo, hi as head_weights takes them), only its
// columns, with the factors of decay_or_zero.
template <bool Band = false, typename T>
double head_grads(const T* g, const T* h, const T* tn, const T* cb, T* dcb, T* ds, T* col,
                  int64_t length, int64_t dir, const int64_t* lo = nullptr,
                  const int64_t* hi = nullptr) {
  std::fill(col, col + length, T(0));
  double pair = 0;
  for (int64_t i = 0; i < length; ++i) {
    int64_t j0, j1;
    triangle_row(dir, i, length, &j0, &j1);
    if constexpr (Band) {
      j0 = lo[i];
      j1 = hi[i];
    }
    const T* gr = g + i * length;
    const T* cr = cb + i * length;
    T* dr = dcb + i * length;
    const T hi_i = h[i], t_i = tn[i];
    T row = 0, p = 0;
#pragma omp simd reduction(+ : row, p)
    for (int64_t j = j0; j < j1; ++j) {
      const T edw = (Band ? decay_or_zero(hi_i - h[j]) : decay(hi_i - h[j])) * gr[j];
      dr[j] += edw;
      const T gij = edw * cr[j];
      row += gij;
      col[j] += gij;
      p += gij * (t_i - tn[j]);
    }
    ds[i] = row;
    pair += static_cast<double>(p);
  }
  for (int64_t j = 0; j < length; ++j) ds[j] -= col[j];
  return pair;
}

// The runs of consecutive equal entries of a sorted index: their starts, then the end.
std::vector<int64_t> index_runs(const int64_t* index, int64_t n) {
  std::vector<int64_t> runs;
  for (int64_t i = 0; i < n; ++i)
    if (i == 0 || index[i] != index[i - 1]) runs.push_back(i);
  runs.push_back(n);
  return runs;
}

// Head n's gradients from dW = dL/dW (n's (L, L) slice): adds E * dW (E the decay factors) to
// dcbs[index[n]] on the triangle, and with G = dW * W writes dS[n, i] = sum_j G_ij - sum_j G_ji
// and pairs[n] = sum_ij G_ij (t_i - t_j). Heads with one index form a run (index is sorted);
// runs go to threads whole, so no two threads add to one matrix.
template <typename T>
void wide_grads_kernel(const T* dW, const T* hi, const T* t, const T* cbs, const int64_t* index,
                       T* dcbs, T* dS, double* pairs, int64_t heads, int64_t length,
                       int64_t dir) {
  const int64_t area = length * length;
  const std::vector<int64_t> runs = index_runs(index, heads);
  at::parallel_for(0, static_cast<int64_t>(runs.size()) - 1, 1, [&](int64_t begin, int64_t end) {
    Buffer<T> col(length);
    for (int64_t run = begin; run < end; ++run)
      for (int64_t n = runs[run]; n < runs[run + 1]; ++n)
        pairs[n] = head_grads(dW + n * area, hi + n * length, t + n * length,
                              cbs + index[n] * area, dcbs + index[n] * area, dS + n * length,
                              col.data(), length, dir);
  });
}

void check_wide(const at::Tensor& hi, const at::Tensor& cbs, const at::Tensor& index,
                int64_t dir) {
  TORCH_CHECK(hi.device().is_cpu() && hi.dim() == 2 && hi.is_contiguous(),
              "native wide heads: hi must be a contiguous (N, L) CPU tensor");
  const int64_t heads = hi.size(0), length = hi.size(1);
  TORCH_CHECK(cbs.dim() == 3 && cbs.size(1) == length && cbs.size(2) == length &&
                  cbs.is_contiguous() && cbs.scalar_type() == hi.scalar_type(),
              "native wide heads: cb must be a contiguous (M, L, L) tensor of hi's dtype");
  TORCH_CHECK(index.scalar_type() == at::kLong && index.dim() == 1 && index.size(0) == heads &&
                  index.is_contiguous(),
              "native wide heads: index must be a contiguous (N,) int64 tensor");
  TORCH_CHECK(dir == 0 || dir == 1, "native wide heads: direction must be 0 or 1, got ", dir);
  const int64_t* idx = index.data_ptr<int64_t>();
  for (int64_t n = 0; n < heads; ++n)
    TORCH_CHECK(idx[n] >= 0 && idx[n] < cbs.size(0) && (n == 0 || idx[n] >= idx[n - 1]),
                "native wide heads: index must be sorted and within [0, ", cbs.size(0), ")");
}

at::Tensor wide_weights(const at::Tensor& hi, const at::Tensor& cbs, const at::Tensor& index,
                        int64_t dir, bool transpose) {
  check_wide(hi, cbs, index, dir);
  const int64_t heads = hi.size(0), length = hi.size(1);
  auto out = at::empty({heads, length, length}, hi.options());
  AT_DISPATCH_FLOATING_TYPES(hi.scalar_type(), "wide_weights", [&] {
    wide_weights_kernel<scalar_t>(hi.data_ptr<scalar_t>(), cbs.data_ptr<scalar_t>(),
                                  index.data_ptr<int64_t>(), out.data_ptr<scalar_t>(), heads,
                                  length, dir, transpose);
  });
  return out;
}

std::vector<at::Tensor> wide_grads(const at::Tensor& dW, const at::Tensor& hi,
                                   const at::Tensor& t, const at::Tensor& cbs,
                                   const at::Tensor& index, int64_t dir, at::Tensor dcbs) {
  check_wide(hi, cbs, index, dir);
  const int64_t heads = hi.size(0), length = hi.size(1);
  TORCH_CHECK(dW.sizes() == at::IntArrayRef({heads, length, length}) && dW.is_contiguous() &&
                  dW.scalar_type() == hi.scalar_type(),
              "native wide heads: dW must be a contiguous (N, L, L) tensor of hi's dtype");
  TORCH_CHECK(t.sizes() == hi.sizes() && t.is_contiguous() && t.scalar_type() == hi.scalar_type(),
              "native wide heads: t must be a contiguous (N, L) tensor of hi's dtype");
  TORCH_CHECK(dcbs.sizes() == cbs.sizes() && dcbs.is_contiguous() &&
                  dcbs.scalar_type() == hi.scalar_type(),
              "native wide heads: dcb must be a contiguous tensor shaped like cb");
  auto dS = at::empty({heads, length}, hi.options());
  auto pairs = at::empty({heads}, hi.options().dtype(at::kDouble));
  AT_DISPATCH_FLOATING_TYPES(hi.scalar_type(), "wide_grads", [&] {
    wide_grads_kernel<scalar_t>(dW.data_ptr<scalar_t>(), hi.data_ptr<scalar_t>(),
                                t.data_ptr<scalar_t>(), cbs.data_ptr<scalar_t>(),
                                index.data_ptr<int64_t>(), dcbs.data_ptr<scalar_t>(),
                                dS.data_ptr<scalar_t>(), pairs.data_ptr<double>(), heads, length,
                                dir);
  });
  return {dS, pairs};
}

// ---------------------------------------------------------------------------------------------
// The quadratic form's per-token factors (bidir_inner's dt with ssd_quadratic._factors): for
// each sample, direction r and head, dt = softplus(raw + bias[r]) from the token-major raw step
// sizes (a view into the projection), S the cumulative sum of a = dt A[r] in float64 (inclusive;
// reverse for direction 1, written as total - cumsum + a as cumulative() does), whether the head
// is wide (|S_first - S_last| > range) and, for the others, row = exp(S - c) and col = exp(c - S)
// with c the middle of the range (zero for wide heads); dt alone where S is null (the
// recurrence's). One thread per (b, r, h) row.
template <typename T>
void scan_factors_kernel(Tokens<const T> raw, const T* bias, const T* A, T* dt, double* S,
                         T* row, T* col, bool* wide, int64_t batch, int64_t heads,
                         int64_t length, double range) {
  at::parallel_for(0, batch * 2 * heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / (2 * heads), r = (item / heads) % 2, h = item % heads;
      const T bh = bias[r * heads + h], ah = A[r * heads + h];
      const T* x = raw.at(b, 0, h);
      T* d = dt + item * length;
      double* s = S + item * length;
      for (int64_t t = 0; t < length; ++t) {
        const T v = x[t * raw.token_stride] + bh;
        d[t] = v > T(20) ? v : std::log1p(std::exp(v));  // F.softplus, threshold 20
      }
      if (S == nullptr) continue;
      double acc = 0;
      for (int64_t t = 0; t < length; ++t) s[t] = acc += static_cast<double>(d[t] * ah);
      if (r == 1) {
        const double total = s[length - 1];
        for (int64_t t = 0; t < length; ++t)
          s[t] = total - s[t] + static_cast<double>(d[t] * ah);
      }
      const double first = s[0], last = s[length - 1], c = (first + last) / 2;
      const bool w = std::abs(first - last) > range;
      wide[item] = w;
      T* ro = row + item * length;
      T* co = col + item * length;
      for (int64_t t = 0; t < length; ++t) {
        const double e = s[t] - c;
        ro[t] = w ? T(0) : static_cast<T>(std::exp(e));
        co[t] = w ? T(0) : static_cast<T>(std::exp(-e));
      }
    }
  });
}

std::vector<at::Tensor> scan_factors(const at::Tensor& raw, const at::Tensor& bias,
                                     const at::Tensor& A, double range, bool factors) {
  TORCH_CHECK(raw.dim() == 3, "native scan factors: raw must be a (b, L, h) tensor, got ",
              raw.sizes());
  const int64_t batch = raw.size(0), length = raw.size(1), heads = raw.size(2);
  TORCH_CHECK(length > 0, "native scan factors: empty sequence");
  check_token_major(raw, batch, length, heads, raw.scalar_type(), "native scan factors: raw");
  for (const auto* t : {&bias, &A})
    TORCH_CHECK(t->sizes() == at::IntArrayRef({2, heads}) && t->is_contiguous() &&
                    t->scalar_type() == raw.scalar_type(),
                "native scan factors: dt_bias and A must be contiguous (2, h) tensors of raw's "
                "dtype");
  const std::vector<int64_t> shape{batch, 2, heads, length};
  auto dt = at::empty(shape, raw.options());
  if (!factors) {
    AT_DISPATCH_FLOATING_TYPES(raw.scalar_type(), "scan_factors", [&] {
      scan_factors_kernel<scalar_t>(tokens<const scalar_t>(raw), bias.data_ptr<scalar_t>(),
                                    A.data_ptr<scalar_t>(), dt.data_ptr<scalar_t>(), nullptr,
                                    nullptr, nullptr, nullptr, batch, heads, length, range);
    });
    return {dt};
  }
  auto row = at::empty(shape, raw.options()), col = at::empty(shape, raw.options());
  auto S = at::empty(shape, raw.options().dtype(at::kDouble));
  auto wide = at::empty({batch, 2, heads}, raw.options().dtype(at::kBool));
  AT_DISPATCH_FLOATING_TYPES(raw.scalar_type(), "scan_factors", [&] {
    scan_factors_kernel<scalar_t>(tokens<const scalar_t>(raw), bias.data_ptr<scalar_t>(),
                                  A.data_ptr<scalar_t>(), dt.data_ptr<scalar_t>(),
                                  S.data_ptr<double>(), row.data_ptr<scalar_t>(),
                                  col.data_ptr<scalar_t>(), wide.data_ptr<bool>(), batch, heads,
                                  length, range);
  });
  return {dt, S, row, col, wide};
}

// ---------------------------------------------------------------------------------------------
// Element-wise work of the SSD scan's quadratic form around its matrix products (ssd_quadratic.py):
// per-token scales of (b, R, h, p, L) tensors, and the backward pass's per-token sums over the p
// channels of a head, in one pass over each operand instead of one per PyTorch operation (whose
// broadcast over p also runs 2-3x slower than a plain product). Operands: (b, R, h, p, L)
// tensors with contiguous (p, L) planes (views into the conv output are fine) and contiguous
// (b, R, h, L) per-token tensors. Each (b, R, h) plane is one thread's: results do not depend on
// the thread count.
struct Planes {
  int64_t batch, dirs, heads, channels, length, s0, s1, s2;

  explicit Planes(const at::Tensor& t)
      : batch(t.size(0)), dirs(t.size(1)), heads(t.size(2)), channels(t.size(3)),
        length(t.size(4)), s0(t.stride(0)), s1(t.stride(1)), s2(t.stride(2)) {}

  int64_t units() const { return batch * dirs * heads; }
  // Offset of plane n (in (b, R, h) order) in a tensor with these strides.
  int64_t offset(int64_t n) const {
    return (n / (dirs * heads)) * s0 + ((n / heads) % dirs) * s1 + (n % heads) * s2;
  }
};

// Whether a 5-d tensor's last two dimensions are one contiguous plane (the strides of
// dimensions of size 1 do not matter).
bool contiguous_planes(const at::Tensor& t) {
  return (t.stride(4) == 1 || t.size(4) == 1) && (t.stride(3) == t.size(4) || t.size(3) == 1);
}

void check_planes(const at::Tensor& t, const at::Tensor& x, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 5 && t.sizes() == x.sizes() &&
                  t.scalar_type() == x.scalar_type() && contiguous_planes(t),
              "native scan: ", name, " must be a (b, R, h, p, L) CPU tensor like x (",
              x.sizes(), ", ", x.scalar_type(), ") with contiguous (p, L) planes, got ",
              t.sizes(), " with strides ", t.strides(), ", ", t.scalar_type());
}

void check_tokens(const at::Tensor& t, const at::Tensor& x, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 4 && t.size(0) == x.size(0) &&
                  t.size(1) == x.size(1) && t.size(2) == x.size(2) && t.size(3) == x.size(4) &&
                  t.is_contiguous() && t.scalar_type() == x.scalar_type(),
              "native scan: ", name, " must be a contiguous (b, R, h, L) CPU tensor of x's "
              "dtype, got ", t.sizes(), " on ", t.device());
}

// out (p x L) = in (p x L, from a plane) times the per-token s.
template <typename T>
void scale_plane(const T* in, const T* s, int64_t channels, int64_t length, T* out) {
  for (int64_t c = 0; c < channels; ++c) {
#pragma omp simd
    for (int64_t l = 0; l < length; ++l) out[c * length + l] = in[c * length + l] * s[l];
  }
}

template <typename T>
void scale_tokens_kernel(const T* x, const Planes& px, const T* s, T* out) {
  const int64_t L = px.length, plane = px.channels * L;
  at::parallel_for(0, px.units(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n)
      scale_plane(x + px.offset(n), s + n * L, px.channels, L, out + n * plane);
  });
}

// y = ys row + x diag over n tokens of a plane's channels: the rows of ys and x ld apart, those
// of the output ldo apart.
template <typename T>
void output_rows(const T* yn, const T* rn, const T* xn, const T* dn, int64_t channels,
                 int64_t n, int64_t ld, T* on, int64_t ldo) {
  for (int64_t c = 0; c < channels; ++c) {
#pragma omp simd
    for (int64_t l = 0; l < n; ++l)
      on[c * ldo + l] = yn[c * ld + l] * rn[l] + xn[c * ld + l] * dn[l];
  }
}

// One plane (p x L) of y = ys row + x diag.
template <typename T>
void output_plane(const T* yn, const T* rn, const T* xn, const T* dn, int64_t channels,
                  int64_t L, T* on) {
  output_rows(yn, rn, xn, dn, channels, L, L, on, L);
}

template <typename T>
void scan_output_kernel(const T* ys, const Planes& pys, const T* row, const T* x,
                        const Planes& px, const T* diag, T* out) {
  const int64_t L = px.length, plane = px.channels * L;
  at::parallel_for(0, px.units(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n)
      output_plane(ys + pys.offset(n), row + n * L, x + px.offset(n), diag + n * L, px.channels,
                   L, out + n * plane);
  });
}

// One plane of dx = dxs s + dy diag written over dxs (gn); per token: a = sum_p dxs x,
// b = sum_p dys ys, q = sum_p dy x.
template <typename T>
void backward_pointwise_plane(T* gn, const T* xn, const T* dyn, const T* dysn, const T* ysn,
                              const T* sn, const T* dn, int64_t channels, int64_t L, T* a, T* b,
                              T* q) {
  std::fill(a, a + L, T(0));
  std::fill(b, b + L, T(0));
  std::fill(q, q + L, T(0));
  for (int64_t c = 0; c < channels; ++c) {
    const int64_t o = c * L;
#pragma omp simd
    for (int64_t l = 0; l < L; ++l) {
      const T g = gn[o + l], xv = xn[o + l], dv = dyn[o + l];
      a[l] += g * xv;
      b[l] += dysn[o + l] * ysn[o + l];
      q[l] += dv * xv;
      gn[o + l] = g * sn[l] + dv * dn[l];
    }
  }
}

template <typename T>
void scan_backward_pointwise_kernel(T* dxs, const T* x, const Planes& px, const T* dy,
                                    const Planes& pdy, const T* dys, const Planes& pdys,
                                    const T* ys, const Planes& pys, const T* s, const T* diag,
                                    T* dxs_x, T* dys_ys, T* dy_x) {
  const int64_t L = px.length, plane = px.channels * L;
  at::parallel_for(0, px.units(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n)
      backward_pointwise_plane(dxs + n * plane, x + px.offset(n), dy + pdy.offset(n),
                               dys + pdys.offset(n), ys + pys.offset(n), s + n * L, diag + n * L,
                               px.channels, L, dxs_x + n * L, dys_ys + n * L, dy_x + n * L);
  });
}

at::Tensor scale_tokens(const at::Tensor& x, const at::Tensor& s) {
  check_planes(x, x, "x");
  check_tokens(s, x, "s");
  auto out = at::empty(x.sizes(), x.options());
  const Planes px(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "scale_tokens", [&] {
    scale_tokens_kernel<scalar_t>(x.data_ptr<scalar_t>(), px, s.data_ptr<scalar_t>(),
                                  out.data_ptr<scalar_t>());
  });
  return out;
}

at::Tensor scan_output(const at::Tensor& ys, const at::Tensor& row, const at::Tensor& x,
                       const at::Tensor& diag) {
  check_planes(x, x, "x");
  check_planes(ys, x, "ys");
  check_tokens(row, x, "row");
  check_tokens(diag, x, "diag");
  auto out = at::empty(x.sizes(), x.options());
  const Planes px(x), pys(ys);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "scan_output", [&] {
    scan_output_kernel<scalar_t>(ys.data_ptr<scalar_t>(), pys, row.data_ptr<scalar_t>(),
                                 x.data_ptr<scalar_t>(), px, diag.data_ptr<scalar_t>(),
                                 out.data_ptr<scalar_t>());
  });
  return out;
}

// The merge's y rebuilt tile by tile from the quadratic scan's state, the values scan_output
// and then the wide heads' parts (ScanState.output in ssd_quadratic.py) give: y = ys row +
// x diag, plus its part for a wide head, channel-major in the thread's (d, merge_tokens(d))
// work buffer, then transposed into the merge's token-major scratch. merge_backward_scan thus
// reads ys and x where merge_backward reads the y that scan_output wrote: y is neither written
// nor read again (DinoVim-T: 6.4 MB a layer each way).
template <typename T>
struct ScanOutputInput {
  const T *ys, *row, *x, *diag, *parts;
  Planes pys, px;
  const int64_t* part;  // per (b, R, h) plane: its row of parts, or -1
  int64_t d, length;
  int64_t work_size() const { return d * merge_tokens(d); }
  void to_tokens(int64_t b, int64_t t0, int64_t n, T* scratch, T* work) const {
    const int64_t mt = merge_tokens(d), L = length, heads = px.heads, p = px.channels;
    for (int64_t r = 0; r < 2; ++r) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t plane = (b * 2 + r) * heads + h;
        const T* rn = row + plane * L + t0;
        const T* dn = diag + plane * L + t0;
        const T* yn = ys + pys.offset(plane) + t0;
        const T* xn = x + px.offset(plane) + t0;
        T* on = work + h * p * mt;
        output_rows(yn, rn, xn, dn, p, n, L, on, mt);
        if (part[plane] >= 0) {  // the wide head's part, added as ScanState.output adds it
          const T* pn = parts + part[plane] * p * L + t0;
          for (int64_t c = 0; c < p; ++c) {
#pragma omp simd
            for (int64_t j = 0; j < n; ++j) on[c * mt + j] += pn[c * L + j];
          }
        }
      }
      transpose_tiles(work, mt, scratch + r * mt * d, d, n, d);
    }
  }
};

std::vector<at::Tensor> merge_backward_scan(const at::Tensor& dm, const at::Tensor& ys,
                                            const at::Tensor& row, const at::Tensor& x,
                                            const at::Tensor& diag, const at::Tensor& wide,
                                            const std::optional<at::Tensor>& parts,
                                            const at::Tensor& z, const at::Tensor& weight,
                                            int64_t groups, double eps, at::Tensor& dz,
                                            std::optional<at::Tensor> out) {
  check_planes(x, x, "x");
  check_planes(ys, x, "ys");
  check_tokens(row, x, "row");
  check_tokens(diag, x, "diag");
  const int64_t batch = x.size(0), dirs = x.size(1), heads = x.size(2), p = x.size(3);
  const int64_t length = x.size(4), d = heads * p;
  TORCH_CHECK(dirs == 2, "native merge: x must hold both directions (b, 2, h, p, L), got ",
              x.sizes());
  TORCH_CHECK(wide.device().is_cpu() && wide.sizes() == x.sizes().slice(0, 3) &&
                  wide.is_contiguous() && wide.scalar_type() == at::kBool,
              "native merge: wide must be a contiguous (b, 2, h) bool CPU tensor, got ",
              wide.sizes(), " ", wide.scalar_type(), " on ", wide.device());
  // the wide heads' rows of parts, in wide_forward's order (direction, sample, head)
  std::vector<int64_t> part(batch * dirs * heads, -1);
  const bool* w = wide.data_ptr<bool>();
  int64_t count = 0;
  for (int64_t r = 0; r < dirs; ++r)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t plane = (b * dirs + r) * heads + h;
        if (w[plane]) part[plane] = count++;
      }
  TORCH_CHECK(count == 0 || (parts && parts->device().is_cpu() && parts->dim() == 3 &&
                             parts->size(0) == count &&
                             parts->size(1) == p && parts->size(2) == length &&
                             parts->is_contiguous() && parts->scalar_type() == x.scalar_type()),
              "native merge: parts must be a contiguous (", count, ", ", p, ", ", length,
              ") CPU tensor of x's dtype for the ", count, " wide heads");
  check_merge_tokens(dm, z, dz, out, batch, length, d, x.scalar_type());
  check_merge_weight(weight, groups, d, x.scalar_type());
  const Planes pys(ys), px(x);
  return merge_backward_of(
      dm,
      [&](auto tag) {
        using T = decltype(tag);
        return ScanOutputInput<T>{ys.data_ptr<T>(), row.data_ptr<T>(), x.data_ptr<T>(),
                                  diag.data_ptr<T>(), count ? parts->data_ptr<T>() : nullptr,
                                  pys, px, part.data(), d, length};
      },
      z, weight, groups, eps, dz, out, batch, d, length);
}

std::vector<at::Tensor> scan_backward_pointwise(at::Tensor& dxs, const at::Tensor& x,
                                                const at::Tensor& dy, const at::Tensor& dys,
                                                const at::Tensor& ys, const at::Tensor& s,
                                                const at::Tensor& diag) {
  check_planes(x, x, "x");
  check_planes(dy, x, "dy");
  check_planes(dys, x, "dys");
  check_planes(ys, x, "ys");
  TORCH_CHECK(dxs.sizes() == x.sizes() && dxs.is_contiguous() &&
                  dxs.scalar_type() == x.scalar_type(),
              "native scan: dxs must be a contiguous tensor like x");
  check_tokens(s, x, "s");
  check_tokens(diag, x, "diag");
  const std::vector<int64_t> tokens{x.size(0), x.size(1), x.size(2), x.size(4)};
  auto dxs_x = at::empty(tokens, x.options()), dys_ys = at::empty(tokens, x.options());
  auto dy_x = at::empty(tokens, x.options());
  const Planes px(x), pdy(dy), pdys(dys), pys(ys);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "scan_backward_pointwise", [&] {
    scan_backward_pointwise_kernel<scalar_t>(
        dxs.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), px, dy.data_ptr<scalar_t>(), pdy,
        dys.data_ptr<scalar_t>(), pdys, ys.data_ptr<scalar_t>(), pys, s.data_ptr<scalar_t>(),
        diag.data_ptr<scalar_t>(), dxs_x.data_ptr<scalar_t>(), dys_ys.data_ptr<scalar_t>(),
        dy_x.data_ptr<scalar_t>());
  });
  return {dxs_x, dys_ys, dy_x};
}

// ---------------------------------------------------------------------------------------------
// The quadratic scan's (L, L) matrix products (ssd_triangles.py) in one call each: every
// (sample, direction, group, token block) product is a task, the tasks run in parallel and each
// is one single-threaded GEMM on strided views that writes straight into the result: no
// transposed copy of a matrix (the GEMM reads it transposed), no per-block temporary copied into
// place, no zero fill and no separate masking pass. (PyTorch's CPU bmm runs the samples one after
// another, each GEMM spread over all threads, which pays off badly for GEMMs this small.) The
// GEMM is the BLAS that PyTorch links (`sgemm_` / `dgemm_`, LP64, looked up in libtorch_cpu at
// run time, as PyTorch's own CPUBlas declares them) or, where that is not found, at::mm_out on
// the same views. Operands: (b, R, g, rows, L) tensors whose (rows, L) planes have unit stride
// along L and row stride >= L (any strides outside the planes).
using sgemm_fn = void (*)(const char*, const char*, const int*, const int*, const int*,
                          const float*, const float*, const int*, const float*, const int*,
                          const float*, float*, const int*);
using dgemm_fn = void (*)(const char*, const char*, const int*, const int*, const int*,
                          const double*, const double*, const int*, const double*, const int*,
                          const double*, double*, const int*);

void* blas_symbol(const char* name) {
  static void* library = dlopen("libtorch_cpu.so", RTLD_NOLOAD | RTLD_LAZY);
  return library ? dlsym(library, name) : nullptr;
}

bool direct_blas = true;  // false: at::mm_out throughout (tests cover that path with it)

// Whether torch's BLAS GEMMs were found.
bool blas_found() {
  return blas_symbol("sgemm_") != nullptr && blas_symbol("dgemm_") != nullptr;
}

// Whether the GEMMs go to the BLAS directly (where found) or to at::mm_out; returns the
// previous setting.
bool set_direct_blas(bool on) {
  const bool previous = direct_blas;
  direct_blas = on;
  return previous;
}

// A GEMM called inside one of the kernels' parallel loops runs on its calling thread alone.
// PyTorch switches MKL's dynamic thread count off (so that its threads are not torn down
// between MKL and other parallel code); MKL then opens a nested team of torch's thread count
// for every such GEMM, on threads that are all busy with the loop's other tasks. The guard sets
// MKL's thread-local count to one around the call (MKL_Set_Num_Threads_Local, looked up like
// the GEMMs; no-op where the BLAS is not MKL) and restores it after. On a 2-core Cascade Lake
// Xeon the quadratic scan's 24 layers (DinoVim-T, batch 8, forward + backward) ran 1.09x
// faster with it.
bool serial_blas = true;  // false: the BLAS's own threading inside the loops too (A/B timing)

// Whether the GEMMs inside parallel loops run single-threaded; returns the previous setting.
bool set_serial_blas(bool on) {
  const bool previous = serial_blas;
  serial_blas = on;
  return previous;
}

class SerialBlasGuard {
 public:
  SerialBlasGuard() {
    using set_fn = int (*)(int);
    static const set_fn set_local =
        reinterpret_cast<set_fn>(blas_symbol("MKL_Set_Num_Threads_Local"));
    if (serial_blas && set_local != nullptr && at::in_parallel_region()) {
      set_ = set_local;
      previous_ = set_local(1);
    }
  }
  ~SerialBlasGuard() {
    if (set_ != nullptr) set_(previous_);
  }
  SerialBlasGuard(const SerialBlasGuard&) = delete;
  SerialBlasGuard& operator=(const SerialBlasGuard&) = delete;

 private:
  int (*set_)(int) = nullptr;
  int previous_ = 0;
};

// Row-major C (m x n, ldc) = op(A) (m x k) @ op(B) (k x n) (+ C with accumulate), op(A) = A
// (stored m x k, lda) or, with ta, A^T (A stored k x m); likewise B. BLAS is column-major:
// C^T = op(B)^T op(A)^T.
template <typename T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
          const T* b, int64_t ldb, T* c, int64_t ldc, bool accumulate = false) {
  static void* fn = blas_symbol(std::is_same_v<T, float> ? "sgemm_" : "dgemm_");
  const SerialBlasGuard serial;
  if (direct_blas && fn != nullptr) {
    const int mi = static_cast<int>(n), ni = static_cast<int>(m), ki = static_cast<int>(k);
    const int la = static_cast<int>(lda), lb = static_cast<int>(ldb), lc = static_cast<int>(ldc);
    const T one = 1, beta = accumulate ? 1 : 0;
    const char* opa = tb ? "T" : "N";
    const char* opb = ta ? "T" : "N";
    if constexpr (std::is_same_v<T, float>)
      reinterpret_cast<sgemm_fn>(fn)(opa, opb, &mi, &ni, &ki, &one, b, &lb, a, &la, &beta, c,
                                     &lc);
    else
      reinterpret_cast<dgemm_fn>(fn)(opa, opb, &mi, &ni, &ki, &one, b, &lb, a, &la, &beta, c,
                                     &lc);
    return;
  }
  const auto options = at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value);
  auto view = [&](const T* p, int64_t rows, int64_t cols, int64_t ld, bool t) {
    return t ? at::from_blob(const_cast<T*>(p), {rows, cols}, {1, ld}, options)
             : at::from_blob(const_cast<T*>(p), {rows, cols}, {ld, 1}, options);
  };
  auto out = at::from_blob(c, {m, n}, {ldc, 1}, options);
  if (accumulate)
    out.addmm_(view(a, m, k, lda, ta), view(b, k, n, ldb, tb));
  else
    at::mm_out(out, view(a, m, k, lda, ta), view(b, k, n, ldb, tb));
}

// A (b, R, g, rows, L) operand: the (rows, L) plane of (b, r, g) and its row stride.
template <typename T>
struct Stack {
  T* data;
  int64_t dirs, groups, rows, length, s0, s1, s2, ld;

  Stack(const at::Tensor& t)
      : data(static_cast<T*>(t.data_ptr())), dirs(t.size(1)), groups(t.size(2)),
        rows(t.size(3)), length(t.size(4)), s0(t.stride(0)), s1(t.stride(1)), s2(t.stride(2)),
        ld(t.stride(3)) {}

  T* plane(int64_t b, int64_t r, int64_t g) const { return data + b * s0 + r * s1 + g * s2; }
};

void check_stack(const at::Tensor& t, const at::Tensor& like, int64_t rows, int64_t length,
                 const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 5 && t.size(0) == like.size(0) &&
                  t.size(1) == like.size(1) && t.size(2) == like.size(2) &&
                  t.size(3) == rows && t.size(4) == length &&
                  t.scalar_type() == like.scalar_type() && (t.stride(4) == 1 || length == 1) &&
                  t.stride(3) >= length,
              "native products: ", what, " must be a (b, R, g, ", rows, ", ", length,
              ") CPU tensor of the first operand's dtype with unit stride along its last "
              "dimension, got ", t.sizes(), " strides ", t.strides());
}

// The first operand (b, R, g, P, L) of a product: float32 or float64, and a stack of planes.
void check_first_operand(const at::Tensor& t) {
  TORCH_CHECK(t.dim() == 5 && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble),
              "native products: the first operand must be a (b, R, g, P, L) float32 or float64 "
              "tensor, got ", t.sizes(), " ", t.scalar_type());
  check_stack(t, t, t.size(3), t.size(4), "the first operand");
}

std::vector<int64_t> checked_bounds(const std::vector<int64_t>& bounds, int64_t length) {
  TORCH_CHECK(bounds.size() >= 2 && bounds.front() == 0 && bounds.back() == length &&
                  std::is_sorted(bounds.begin(), bounds.end()) &&
                  std::adjacent_find(bounds.begin(), bounds.end()) == bounds.end(),
              "native products: block bounds must rise strictly from 0 to the length ", length);
  return bounds;
}

// out = a @ op(m) per (b, r, g): a and out (b, R, g, P, L), m (b, R, g, L, L), op(m) = m or,
// with `transpose`, m^T; op(m) is zero outside its block triangle: column block j reads rows
// [0, j1) of op(m) ("prefix") or rows [j0, L), the prefix form for direction 0 if
// `prefix_first` and for direction 1 otherwise.
void column_products(const at::Tensor& a, const at::Tensor& m, at::Tensor& out,
                     const std::vector<int64_t>& bounds_in, bool transpose, bool prefix_first) {
  check_first_operand(a);
  const int64_t length = a.size(4);
  check_stack(m, a, length, length, "the matrices");
  check_stack(out, a, a.size(3), length, "the output");
  const auto bounds = checked_bounds(bounds_in, length);
  const int64_t blocks = static_cast<int64_t>(bounds.size()) - 1;
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "column_products", [&] {
    const Stack<const scalar_t> x(a), w(m);
    const Stack<scalar_t> y(out);
    const int64_t units = a.size(0) * x.dirs * x.groups;
    at::parallel_for(0, units * blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t j = task % blocks, u = task / blocks;
        const int64_t g = u % x.groups, r = (u / x.groups) % x.dirs, b = u / (x.groups * x.dirs);
        const int64_t j0 = bounds[j], j1 = bounds[j + 1];
        const bool prefix = (r == 0) == prefix_first;
        const int64_t k0 = prefix ? 0 : j0, k1 = prefix ? j1 : length;
        // op(m)[k0:k1, j0:j1]: m[k0:k1, j0:j1], or m[j0:j1, k0:k1] read transposed
        const scalar_t* mb = w.plane(b, r, g) + (transpose ? j0 * w.ld + k0 : k0 * w.ld + j0);
        gemm<scalar_t>(false, transpose, x.rows, j1 - j0, k1 - k0, x.plane(b, r, g) + k0, x.ld,
                       mb, w.ld, y.plane(b, r, g) + j0, y.ld);
      }
    });
  });
}

// Rows [i0, i1) of an (L, L) matrix (rows points at row i0, row stride ld): zero on and above
// the diagonal (lower) or on and below it, leaving the strict triangle.
template <typename T>
void zero_off_triangle(T* rows, int64_t ld, int64_t i0, int64_t i1, int64_t length, bool lower) {
  for (int64_t t = i0; t < i1; ++t) {
    T* row = rows + (t - i0) * ld;
    if (lower)
      std::fill(row + t, row + length, T(0));
    else
      std::fill(row, row + t + 1, T(0));
  }
}

// out = dy^T @ x per (b, r, g) (dy, x (b, R, g, P, L); out (b, R, g, L, L)) on direction 0's
// strict lower and direction 1's strict upper triangle (the other way round unless
// `first_lower`), zero elsewhere: row block i computes only the columns of its blocks that
// reach the triangle, then zeroes the rest of its rows. `diag` (b, R, g, L), if defined,
// receives the diagonal of the full product.
void masked_outer(const at::Tensor& dy, const at::Tensor& x, at::Tensor& out,
                  const std::vector<int64_t>& bounds_in, std::optional<at::Tensor> diag,
                  bool first_lower) {
  check_first_operand(dy);
  const int64_t length = dy.size(4);
  check_stack(x, dy, dy.size(3), length, "the second operand");
  check_stack(out, dy, length, length, "the output");
  TORCH_CHECK(!diag || (diag->is_contiguous() && diag->scalar_type() == dy.scalar_type() &&
                        diag->sizes() == at::IntArrayRef({dy.size(0), dy.size(1), dy.size(2),
                                                          length})),
              "native products: diag must be a contiguous (b, R, g, L) tensor of the operands' "
              "dtype");
  const auto bounds = checked_bounds(bounds_in, length);
  const int64_t blocks = static_cast<int64_t>(bounds.size()) - 1;
  AT_DISPATCH_FLOATING_TYPES(dy.scalar_type(), "masked_outer", [&] {
    const Stack<const scalar_t> d(dy), v(x);
    const Stack<scalar_t> o(out);
    scalar_t* dg = diag ? diag->data_ptr<scalar_t>() : nullptr;
    const int64_t units = dy.size(0) * d.dirs * d.groups;
    at::parallel_for(0, units * blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t i = task % blocks, u = task / blocks;
        const int64_t g = u % d.groups, r = (u / d.groups) % d.dirs, b = u / (d.groups * d.dirs);
        const int64_t i0 = bounds[i], i1 = bounds[i + 1];
        const bool lower = (r == 0) == first_lower;
        const int64_t c0 = lower ? 0 : i0, c1 = lower ? i1 : length;
        scalar_t* rows = o.plane(b, r, g) + i0 * o.ld;
        gemm<scalar_t>(true, false, i1 - i0, c1 - c0, d.rows, d.plane(b, r, g) + i0, d.ld,
                       v.plane(b, r, g) + c0, v.ld, rows + c0, o.ld);
        if (dg != nullptr)
          for (int64_t t = i0; t < i1; ++t) dg[u * length + t] = rows[(t - i0) * o.ld + t];
        zero_off_triangle(rows, o.ld, i0, i1, length, lower);
      }
    });
  });
}

// ---------------------------------------------------------------------------------------------
// The strongly decaying heads of the quadratic form in one call each way
// (ssd_quadratic_heads.add_forward / add_backward): every wide (sample, direction, head) reads
// its planes of the full (b, R, h, ...) tensors and adds its share to them in place, with its
// scaled values, weights and products in buffers of its own task (a few hundred KB, in cache),
// instead of gathering the heads' planes into new tensors, building their (N, L, L) weights and
// scattering the results back, one PyTorch operation and one pass over memory at a time. The
// values are those of the composition in ssd_quadratic_heads.py (S split into hi + lo, the
// weights of head_weights, the products per token block of the triangle, ssd_triangles.py's
// bounds, the gradients of head_grads) but for the factors at the floor, exp(-60) there and zero
// here (decay_or_zero): the parts of a block's products where all of them sit there (wide_band)
// are skipped. Either changes results by less than 1e-26 relative.

struct WideHead {
  int64_t dir, plane, mat;  // direction, (b, r, h) plane index, (b, r, g) matrix index
};

// The wide heads in the order of ssd_quadratic_heads._subsets: by direction, then sample, then
// head.
std::vector<WideHead> wide_list(const at::Tensor& wide, int64_t groups) {
  const int64_t batch = wide.size(0), dirs = wide.size(1), heads = wide.size(2);
  const bool* w = wide.data_ptr<bool>();
  std::vector<WideHead> out;
  for (int64_t r = 0; r < dirs; ++r)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h)
        if (w[(b * dirs + r) * heads + h])
          out.push_back({r, (b * dirs + r) * heads + h,
                         (b * dirs + r) * groups + h / (heads / groups)});
  return out;
}

// hi = S rounded to T, el = exp(S - hi) (1 in float64), scale = dt / el, for one head (L).
template <typename T>
void wide_scales(const double* S, const T* dt, int64_t length, T* hi, T* el, T* scale) {
  for (int64_t l = 0; l < length; ++l) {
    hi[l] = static_cast<T>(S[l]);
    el[l] = std::is_same_v<T, double> ? T(1)
                                      : std::exp(static_cast<T>(S[l] - static_cast<double>(hi[l])));
    scale[l] = dt[l] / el[l];
  }
}

// One wide head's band for the fused kernels, from its hi (L) and the token blocks: per block j
// of rows, the columns [clo[j], chi[j]) outside which each of its rows' factors
// decay_or_zero(hi_i - hi_k) is zero, and per row i the part [lo[i], hi[i]) of its triangle
// inside them; per block j of columns, the rows [rlo[j], rhi[j]) of W outside which each of its
// columns' factors is zero. Strongly decaying heads have many such blocks, whose products are
// skipped.
template <typename T>
void wide_band(const T* h, int64_t length, int64_t dir, const std::vector<int64_t>& bounds,
               int64_t* clo, int64_t* chi, int64_t* rlo, int64_t* rhi, int64_t* lo,
               int64_t* hi) {
  const T floor = T(60);
  for (std::size_t j = 0; j + 1 < bounds.size(); ++j) {
    const int64_t j0 = bounds[j], j1 = bounds[j + 1];
    const T top = *std::max_element(h + j0, h + j1);
    const T bottom = *std::min_element(h + j0, h + j1);
    int64_t k0 = dir == 0 ? 0 : j0, k1 = dir == 0 ? j1 : length;
    while (k0 < k1 && h[k0] - top >= floor) ++k0;
    while (k1 > k0 && h[k1 - 1] - top >= floor) --k1;
    clo[j] = k0;
    chi[j] = k1;
    int64_t r0 = dir == 0 ? j0 : 0, r1 = dir == 0 ? length : j1;
    while (r0 < r1 && bottom - h[r0] >= floor) ++r0;
    while (r1 > r0 && bottom - h[r1 - 1] >= floor) --r1;
    rlo[j] = r0;
    rhi[j] = r1;
    for (int64_t i = j0; i < j1; ++i) {
      int64_t t0, t1;
      triangle_row(dir, i, length, &t0, &t1);
      lo[i] = std::max(t0, k0);
      hi[i] = std::max(lo[i], std::min(t1, k1));
    }
  }
}

template <typename T>
void wide_forward_kernel(const T* x, const Planes& px, const T* dt, const double* S, const T* cb,
                         const std::vector<WideHead>& list, const std::vector<int64_t>& bounds,
                         T* y, const Planes& py, T* parts) {
  const int64_t L = px.length, p = px.channels, area = L * L;
  const int64_t blocks = static_cast<int64_t>(bounds.size()) - 1;
  at::parallel_for(0, static_cast<int64_t>(list.size()), 1, [&](int64_t begin, int64_t end) {
    Buffer<T> w(area), xs(p * L), ys(p * L), hi(L), el(L), scale(L);
    std::vector<int64_t> band(4 * blocks + 2 * L);
    int64_t *clo = band.data(), *chi = clo + blocks, *rlo = chi + blocks, *rhi = rlo + blocks;
    int64_t *lo = rhi + blocks, *up = lo + L;
    for (int64_t n = begin; n < end; ++n) {
      const WideHead& hd = list[n];
      wide_scales(S + hd.plane * L, dt + hd.plane * L, L, hi.data(), el.data(), scale.data());
      wide_band(hi.data(), L, hd.dir, bounds, clo, chi, rlo, rhi, lo, up);
      scale_plane(x + px.offset(hd.plane), scale.data(), p, L, xs.data());
      head_weights<true>(hi.data(), cb + hd.mat * area, L, hd.dir, false, w.data(), lo, up);
      for (int64_t j = 0; j < blocks; ++j) {  // ys[:, block j] = xs[:, k0:k1] @ W[block j, k0:k1]^T
        const int64_t j0 = bounds[j], j1 = bounds[j + 1], k0 = clo[j], k1 = chi[j];
        if (k1 > k0)
          gemm<T>(false, true, p, j1 - j0, k1 - k0, xs.data() + k0, L, w.data() + j0 * L + k0,
                  L, ys.data() + j0, L);
        else
          for (int64_t c = 0; c < p; ++c) std::fill(&ys[c * L + j0], &ys[c * L + j1], T(0));
      }
      T* part = parts + n * p * L;
      T* yn = y + py.offset(hd.plane);
      for (int64_t c = 0; c < p; ++c) {
#pragma omp simd
        for (int64_t l = 0; l < L; ++l) {
          const T v = ys[c * L + l] * el[l];
          part[c * L + l] = v;
          yn[c * L + l] += v;
        }
      }
    }
  });
}

// Cumulative dt of one head in float64 (inclusive; reverse for direction 1, as total - cumsum +
// dt, the way ssd_quadratic_heads.cumulative writes it), split into t_hi + t_lo.
template <typename T>
void wide_times(const T* dt, int64_t length, int64_t dir, double* work, T* t_hi, T* t_lo) {
  double run = 0;
  for (int64_t l = 0; l < length; ++l) work[l] = run += static_cast<double>(dt[l]);
  for (int64_t l = 0; l < length; ++l) {
    const double t = dir == 0 ? work[l] : run - work[l] + static_cast<double>(dt[l]);
    t_hi[l] = static_cast<T>(t);
    t_lo[l] = static_cast<T>(t - static_cast<double>(t_hi[l]));
  }
}

template <typename T>
void wide_backward_kernel(const T* dy, const Planes& pdy, const T* x, const Planes& px,
                          const T* dt, const double* S, const T* cb,
                          const std::vector<WideHead>& list, const std::vector<int64_t>& bounds,
                          T* dx, const Planes& pdx, T* ddt, T* dS, T* dcb, double* pairs) {
  const int64_t L = px.length, p = px.channels, area = L * L;
  const int64_t blocks = static_cast<int64_t>(bounds.size()) - 1;
  std::vector<int64_t> mats(list.size());
  for (std::size_t n = 0; n < list.size(); ++n) mats[n] = list[n].mat;
  const std::vector<int64_t> runs = index_runs(mats.data(), static_cast<int64_t>(mats.size()));
  at::parallel_for(0, static_cast<int64_t>(runs.size()) - 1, 1, [&](int64_t begin, int64_t end) {
    Buffer<T> w(area), dw(area), xs(p * L), dys(p * L), dxs(p * L);
    Buffer<T> hi(L), el(L), scale(L), t_hi(L), t_lo(L), ds(L), col(L);
    std::vector<double> work(L);
    std::vector<int64_t> band(4 * blocks + 2 * L);
    int64_t *clo = band.data(), *chi = clo + blocks, *rlo = chi + blocks, *rhi = rlo + blocks;
    int64_t *lo = rhi + blocks, *up = lo + L;
    for (int64_t run = begin; run < end; ++run) {
      for (int64_t n = runs[run]; n < runs[run + 1]; ++n) {
        const WideHead& hd = list[n];
        const T* xn = x + px.offset(hd.plane);
        const T* dtn = dt + hd.plane * L;
        wide_scales(S + hd.plane * L, dtn, L, hi.data(), el.data(), scale.data());
        wide_band(hi.data(), L, hd.dir, bounds, clo, chi, rlo, rhi, lo, up);
        scale_plane(xn, scale.data(), p, L, xs.data());
        scale_plane(dy + pdy.offset(hd.plane), el.data(), p, L, dys.data());
        head_weights<true>(hi.data(), cb + hd.mat * area, L, hd.dir, false, w.data(), lo, up);
        for (int64_t j = 0; j < blocks; ++j) {
          const int64_t j0 = bounds[j], j1 = bounds[j + 1];
          // dxs[:, block j] = dys[:, k0:k1] @ W[k0:k1, block j] (the rows of its band)
          const int64_t k0 = rlo[j], k1 = rhi[j];
          if (k1 > k0)
            gemm<T>(false, false, p, j1 - j0, k1 - k0, dys.data() + k0, L,
                    w.data() + k0 * L + j0, L, dxs.data() + j0, L);
          else
            for (int64_t c = 0; c < p; ++c) std::fill(&dxs[c * L + j0], &dxs[c * L + j1], T(0));
          // dW[block j, c0:c1] = dys[:, block j]^T @ xs[:, c0:c1] (the columns of its band)
          const int64_t c0 = clo[j], c1 = chi[j];
          if (c1 > c0)
            gemm<T>(true, false, j1 - j0, c1 - c0, p, dys.data() + j0, L, xs.data() + c0, L,
                    dw.data() + j0 * L + c0, L);
        }
        T* dxn = dx + pdx.offset(hd.plane);
        T* ddtn = ddt + hd.plane * L;
        std::fill(ds.begin(), ds.end(), T(0));  // sum_p dxs x per token, here
        for (int64_t c = 0; c < p; ++c) {
#pragma omp simd
          for (int64_t l = 0; l < L; ++l) {
            const T g = dxs[c * L + l];
            dxn[c * L + l] += g * scale[l];
            ds[l] += g * xn[c * L + l];
          }
        }
        for (int64_t l = 0; l < L; ++l) ddtn[l] += ds[l] / el[l];
        wide_times(dtn, L, hd.dir, work.data(), t_hi.data(), t_lo.data());
        double pair = head_grads<true>(dw.data(), hi.data(), t_hi.data(), cb + hd.mat * area,
                                       dcb + hd.mat * area, ds.data(), col.data(), L, hd.dir,
                                       lo, up);
        T* dSn = dS + hd.plane * L;
        for (int64_t l = 0; l < L; ++l) {
          dSn[l] += ds[l];
          pair += static_cast<double>(t_lo[l]) * static_cast<double>(ds[l]);
        }
        pairs[n] = pair;
      }
    }
  });
}

void check_group_matrices(const at::Tensor& cb, const at::Tensor& x, const char* name) {
  TORCH_CHECK(cb.dim() == 5 && cb.size(0) == x.size(0) && cb.size(1) == x.size(1) &&
                  cb.size(2) >= 1 && x.size(2) % cb.size(2) == 0 && cb.size(3) == x.size(4) &&
                  cb.size(4) == x.size(4) && cb.is_contiguous() &&
                  cb.scalar_type() == x.scalar_type(),
              "native scan: ", name, " must be a contiguous (b, R, g, L, L) tensor of x's dtype "
              "with g dividing the heads, got ", cb.sizes());
}

void check_wide_call(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& S,
                     const at::Tensor& cb, const at::Tensor& wide) {
  check_planes(x, x, "x");
  check_tokens(dt, x, "dt");
  TORCH_CHECK(S.sizes() == dt.sizes() && S.is_contiguous() && S.scalar_type() == at::kDouble,
              "native wide heads: S must be a contiguous float64 tensor shaped like dt ",
              dt.sizes(), ", got ", S.sizes(), " ", S.scalar_type());
  check_group_matrices(cb, x, "cb");
  TORCH_CHECK(wide.sizes() == x.sizes().slice(0, 3) && wide.is_contiguous() &&
                  wide.scalar_type() == at::kBool,
              "native wide heads: wide must be a contiguous (b, R, h) bool tensor, got ",
              wide.sizes(), " ", wide.scalar_type());
}

at::Tensor wide_forward(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& S,
                        const at::Tensor& cb, const at::Tensor& wide,
                        const std::vector<int64_t>& bounds_in, at::Tensor& y) {
  check_wide_call(x, dt, S, cb, wide);
  check_planes(y, x, "y");
  const auto bounds = checked_bounds(bounds_in, x.size(4));
  const auto list = wide_list(wide, cb.size(2));
  auto parts = at::empty({static_cast<int64_t>(list.size()), x.size(3), x.size(4)}, x.options());
  const Planes px(x), py(y);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "wide_forward", [&] {
    wide_forward_kernel<scalar_t>(x.data_ptr<scalar_t>(), px, dt.data_ptr<scalar_t>(),
                                  S.data_ptr<double>(), cb.data_ptr<scalar_t>(), list, bounds,
                                  y.data_ptr<scalar_t>(), py, parts.data_ptr<scalar_t>());
  });
  return parts;
}

at::Tensor wide_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& dt,
                         const at::Tensor& S, const at::Tensor& cb, const at::Tensor& wide,
                         const std::vector<int64_t>& bounds_in, at::Tensor& dx, at::Tensor& ddt,
                         at::Tensor& dS, at::Tensor& dcb) {
  check_wide_call(x, dt, S, cb, wide);
  check_planes(dy, x, "dy");
  check_planes(dx, x, "dx");
  check_tokens(ddt, x, "ddt");
  check_tokens(dS, x, "dS");
  TORCH_CHECK(dcb.sizes() == cb.sizes() && dcb.is_contiguous() &&
                  dcb.scalar_type() == cb.scalar_type(),
              "native wide heads: dcb must be a contiguous tensor shaped like cb");
  const auto bounds = checked_bounds(bounds_in, x.size(4));
  const auto list = wide_list(wide, cb.size(2));
  const int64_t dirs = x.size(1), heads = x.size(2);
  std::vector<double> pairs(list.size());
  const Planes px(x), pdy(dy), pdx(dx);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "wide_backward", [&] {
    wide_backward_kernel<scalar_t>(dy.data_ptr<scalar_t>(), pdy, x.data_ptr<scalar_t>(), px,
                                   dt.data_ptr<scalar_t>(), S.data_ptr<double>(),
                                   cb.data_ptr<scalar_t>(), list, bounds, dx.data_ptr<scalar_t>(),
                                   pdx, ddt.data_ptr<scalar_t>(), dS.data_ptr<scalar_t>(),
                                   dcb.data_ptr<scalar_t>(), pairs.data());
  });
  auto dA = at::zeros({dirs, heads}, x.options().dtype(at::kDouble));
  double* da = dA.data_ptr<double>();
  for (std::size_t n = 0; n < list.size(); ++n)  // in list order: independent of the threads
    da[list[n].dir * heads + list[n].plane % heads] += pairs[n];
  return dA;
}

// ---------------------------------------------------------------------------------------------
// The factored form's products with the element-wise work around them (ssd_quadratic.py's
// scan_forward and scan_backward with fused_products), one task per (sample, direction,
// group): the scaled operands xs = x s and dys = dy row of the group's heads are built in a
// buffer of the task (the heads side by side, as ssd_quadratic._grouped views them), the
// products run per token block as column_products and masked_outer run them, and the
// per-token work that reads their results follows while these are still in cache, instead of
// a pass over memory for each operand and result.

// The heads of a group side by side: rows() (heads x channels) of length tokens; unit u
// = (b, r, g) holds the planes [first(u), first(u) + heads_per_group) of its direction().
struct GroupPlanes {
  int64_t heads_per_group, channels, length, groups, dirs;
  int64_t rows() const { return heads_per_group * channels; }
  int64_t direction(int64_t u) const { return (u / groups) % dirs; }
  int64_t first(int64_t u) const {
    return (u / groups) * groups * heads_per_group + (u % groups) * heads_per_group;
  }
};

// out (rh p x L) = the group's planes of t, each head's p rows times its per-token s (L).
template <typename T>
void scale_group(const T* t, const Planes& pt, const T* s, int64_t plane0, const GroupPlanes& gp,
                 T* out) {
  const int64_t L = gp.length, p = gp.channels;
  for (int64_t hh = 0; hh < gp.heads_per_group; ++hh)
    scale_plane(t + pt.offset(plane0 + hh), s + (plane0 + hh) * L, p, L, out + hh * p * L);
}

template <typename T>
void products_forward_kernel(const T* x, const Planes& px, const T* s, const T* cb,
                             const T* row, const T* diag, int64_t groups,
                             const std::vector<int64_t>& bounds, T* ys, T* y) {
  const int64_t L = px.length, p = px.channels, rh = px.heads / groups, area = L * L;
  const GroupPlanes gp{rh, p, L, groups, px.dirs};
  const int64_t blocks = static_cast<int64_t>(bounds.size()) - 1;
  const int64_t units = px.batch * px.dirs * groups;
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    Buffer<T> xs(gp.rows() * L);
    for (int64_t u = begin; u < end; ++u) {
      const int64_t r = gp.direction(u), plane0 = gp.first(u);
      scale_group(x, px, s, plane0, gp, xs.data());
      T* yu = ys + plane0 * p * L;  // ys is contiguous (b, R, h, p, L)
      for (int64_t j = 0; j < blocks; ++j) {
        // ys[:, block j] = xs[:, k0:k1] @ cb[block j, k0:k1]^T
        const int64_t j0 = bounds[j], j1 = bounds[j + 1];
        const int64_t k0 = r == 0 ? 0 : j0, k1 = r == 0 ? j1 : L;
        gemm<T>(false, true, gp.rows(), j1 - j0, k1 - k0, xs.data() + k0, L,
                cb + u * area + j0 * L + k0, L, yu + j0, L);
      }
      for (int64_t hh = 0; hh < rh; ++hh) {  // y = ys row + x diag
        const int64_t n = plane0 + hh;
        output_plane(yu + hh * p * L, row + n * L, x + px.offset(n), diag + n * L, p, L,
                     y + n * p * L);
      }
    }
  });
}

template <typename T>
void products_backward_kernel(const T* dy, const Planes& pdy, const T* x, const Planes& px,
                              const T* ys, const T* s, const T* row, const T* diag, const T* cb,
                              int64_t groups, const std::vector<int64_t>& bounds, T* dx, T* dcb,
                              T* dxs_x, T* dys_ys, T* dy_x) {
  const int64_t L = px.length, p = px.channels, rh = px.heads / groups, area = L * L;
  const GroupPlanes gp{rh, p, L, groups, px.dirs};
  const int64_t blocks = static_cast<int64_t>(bounds.size()) - 1;
  const int64_t units = px.batch * px.dirs * groups;
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    Buffer<T> xs(gp.rows() * L), dys(gp.rows() * L);
    for (int64_t u = begin; u < end; ++u) {
      const int64_t r = gp.direction(u), plane0 = gp.first(u);
      const bool lower = r == 0;
      scale_group(x, px, s, plane0, gp, xs.data());
      scale_group(dy, pdy, row, plane0, gp, dys.data());
      T* dxu = dx + plane0 * p * L;  // dx is contiguous (b, R, h, p, L): dxs here first
      const T* cu = cb + u * area;
      T* du = dcb + u * area;
      for (int64_t j = 0; j < blocks; ++j) {
        const int64_t j0 = bounds[j], j1 = bounds[j + 1];
        // dxs[:, block j] = dys[:, k0:k1] @ cb[k0:k1, block j] (the rows below it when lower)
        const int64_t k0 = lower ? j0 : 0, k1 = lower ? L : j1;
        gemm<T>(false, false, gp.rows(), j1 - j0, k1 - k0, dys.data() + k0, L, cu + k0 * L + j0,
                L, dxu + j0, L);
        // dcb[block j, c0:c1] = dys[:, block j]^T @ xs[:, c0:c1], zero off the strict triangle
        const int64_t c0 = lower ? 0 : j0, c1 = lower ? j1 : L;
        T* rows = du + j0 * L;
        gemm<T>(true, false, j1 - j0, c1 - c0, gp.rows(), dys.data() + j0, L, xs.data() + c0, L,
                rows + c0, L);
        zero_off_triangle(rows, L, j0, j1, L, lower);
      }
      for (int64_t hh = 0; hh < rh; ++hh) {  // as scan_backward_pointwise_kernel
        const int64_t n = plane0 + hh;
        backward_pointwise_plane(dxu + hh * p * L, x + px.offset(n), dy + pdy.offset(n),
                                 dys.data() + hh * p * L, ys + n * p * L, s + n * L,
                                 diag + n * L, p, L, dxs_x + n * L, dys_ys + n * L,
                                 dy_x + n * L);
      }
    }
  });
}

std::vector<at::Tensor> products_forward(const at::Tensor& x, const at::Tensor& s,
                                         const at::Tensor& cb, const at::Tensor& row,
                                         const at::Tensor& diag,
                                         const std::vector<int64_t>& bounds_in) {
  check_planes(x, x, "x");
  check_tokens(s, x, "s");
  check_tokens(row, x, "row");
  check_tokens(diag, x, "diag");
  check_group_matrices(cb, x, "cb");
  const auto bounds = checked_bounds(bounds_in, x.size(4));
  auto ys = at::empty(x.sizes(), x.options()), y = at::empty(x.sizes(), x.options());
  const Planes px(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "products_forward", [&] {
    products_forward_kernel<scalar_t>(x.data_ptr<scalar_t>(), px, s.data_ptr<scalar_t>(),
                                      cb.data_ptr<scalar_t>(), row.data_ptr<scalar_t>(),
                                      diag.data_ptr<scalar_t>(), cb.size(2), bounds,
                                      ys.data_ptr<scalar_t>(), y.data_ptr<scalar_t>());
  });
  return {ys, y};
}

std::vector<at::Tensor> products_backward(const at::Tensor& dy, const at::Tensor& x,
                                          const at::Tensor& ys, const at::Tensor& s,
                                          const at::Tensor& row, const at::Tensor& diag,
                                          const at::Tensor& cb,
                                          const std::vector<int64_t>& bounds_in) {
  check_planes(x, x, "x");
  check_planes(dy, x, "dy");
  TORCH_CHECK(ys.sizes() == x.sizes() && ys.is_contiguous() && ys.scalar_type() == x.scalar_type(),
              "native scan: ys must be a contiguous tensor like x");
  check_tokens(s, x, "s");
  check_tokens(row, x, "row");
  check_tokens(diag, x, "diag");
  check_group_matrices(cb, x, "cb");
  const auto bounds = checked_bounds(bounds_in, x.size(4));
  auto dx = at::empty(x.sizes(), x.options()), dcb = at::empty(cb.sizes(), cb.options());
  const std::vector<int64_t> tokens{x.size(0), x.size(1), x.size(2), x.size(4)};
  auto dxs_x = at::empty(tokens, x.options()), dys_ys = at::empty(tokens, x.options());
  auto dy_x = at::empty(tokens, x.options());
  const Planes px(x), pdy(dy);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "products_backward", [&] {
    products_backward_kernel<scalar_t>(
        dy.data_ptr<scalar_t>(), pdy, x.data_ptr<scalar_t>(), px, ys.data_ptr<scalar_t>(),
        s.data_ptr<scalar_t>(), row.data_ptr<scalar_t>(), diag.data_ptr<scalar_t>(),
        cb.data_ptr<scalar_t>(), cb.size(2), bounds, dx.data_ptr<scalar_t>(),
        dcb.data_ptr<scalar_t>(), dxs_x.data_ptr<scalar_t>(), dys_ys.data_ptr<scalar_t>(),
        dy_x.data_ptr<scalar_t>());
  });
  return {dx, dcb, dxs_x, dys_ys, dy_x};
}

// ---------------------------------------------------------------------------------------------
// The blocks' RMSNorm y = x rstd w, rstd = 1 / sqrt(mean(x^2) + eps) over the last dimension
// (torch.nn.RMSNorm, whose CPU backward is a composition of about ten operations): one pass per
// row forward, one backward, dx = rstd (g w - x rstd^2 mean(g w x)). The weight's gradient is
// summed per chunk of RMS_ROWS rows and then over the chunks in their order, so that it does
// not depend on the thread count.
constexpr int64_t RMS_ROWS = 32;

template <typename T>
void rms_forward_kernel(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t c, T eps) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * c;
      T* yr = y + r * c;
      T ss = 0;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < c; ++i) ss += xr[i] * xr[i];
      const T s = inverse_rms(ss, c, eps);
      rstd[r] = s;
      if (w != nullptr) {
#pragma omp simd
        for (int64_t i = 0; i < c; ++i) yr[i] = xr[i] * s * w[i];
      } else {
#pragma omp simd
        for (int64_t i = 0; i < c; ++i) yr[i] = xr[i] * s;
      }
    }
  });
}

template <typename T>
void rms_backward_kernel(const T* g, const T* x, const T* rstd, const T* w, T* dx, T* dw,
                         int64_t rows, int64_t c) {
  const int64_t chunks = (rows + RMS_ROWS - 1) / RMS_ROWS;
  Buffer<T> partial(w != nullptr ? chunks * c : 0, T(0));
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      T* pw = w != nullptr ? partial.data() + k * c : nullptr;
      for (int64_t r = k * RMS_ROWS; r < std::min(rows, (k + 1) * RMS_ROWS); ++r) {
        const T* gr = g + r * c;
        const T* xr = x + r * c;
        T* dxr = dx + r * c;
        const T s = rstd[r];
        T dot = 0;
        if (w != nullptr) {
#pragma omp simd reduction(+ : dot)
          for (int64_t i = 0; i < c; ++i) dot += gr[i] * w[i] * xr[i];
        } else {
#pragma omp simd reduction(+ : dot)
          for (int64_t i = 0; i < c; ++i) dot += gr[i] * xr[i];
        }
        const T f = s * s * dot / T(c);
        if (w != nullptr) {
#pragma omp simd
          for (int64_t i = 0; i < c; ++i) {
            dxr[i] = s * (gr[i] * w[i] - xr[i] * f);
            pw[i] += gr[i] * xr[i] * s;
          }
        } else {
#pragma omp simd
          for (int64_t i = 0; i < c; ++i) dxr[i] = s * (gr[i] - xr[i] * f);
        }
      }
    }
  });
  if (w == nullptr) return;
  at::parallel_for(0, c, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T acc = 0;
      for (int64_t k = 0; k < chunks; ++k) acc += partial[k * c + i];
      dw[i] = acc;
    }
  });
}

void check_rms(const at::Tensor& x, const std::optional<at::Tensor>& w) {
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous() && x.dim() >= 1 && x.size(-1) > 0 &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble),
              "native RMSNorm: x must be a contiguous float32 or float64 CPU tensor with a "
              "non-empty last dimension, got ", x.sizes(), " ", x.scalar_type());
  TORCH_CHECK(!w || (w->is_contiguous() && w->dim() == 1 && w->size(0) == x.size(-1) &&
                     w->scalar_type() == x.scalar_type()),
              "native RMSNorm: weight must be a contiguous (", x.size(-1), ",) tensor of x's "
              "dtype");
}

std::vector<at::Tensor> rms_norm_forward(const at::Tensor& x, const std::optional<at::Tensor>& w,
                                         double eps) {
  check_rms(x, w);
  const int64_t c = x.size(-1), rows = x.numel() / c;
  auto y = at::empty_like(x);
  auto sizes = x.sizes().vec();
  sizes.back() = 1;
  auto rstd = at::empty(sizes, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rms_norm_forward", [&] {
    rms_forward_kernel<scalar_t>(x.data_ptr<scalar_t>(), w ? w->data_ptr<scalar_t>() : nullptr,
                                 y.data_ptr<scalar_t>(), rstd.data_ptr<scalar_t>(), rows, c,
                                 static_cast<scalar_t>(eps));
  });
  return {y, rstd};
}

std::vector<at::Tensor> rms_norm_backward(const at::Tensor& g, const at::Tensor& x,
                                          const at::Tensor& rstd,
                                          const std::optional<at::Tensor>& w) {
  check_rms(x, w);
  const int64_t c = x.size(-1), rows = x.numel() / c;
  TORCH_CHECK(g.sizes() == x.sizes() && g.is_contiguous() && g.scalar_type() == x.scalar_type(),
              "native RMSNorm: the output gradient must be a contiguous tensor like x");
  TORCH_CHECK(rstd.is_contiguous() && rstd.numel() == rows &&
                  rstd.scalar_type() == x.scalar_type(),
              "native RMSNorm: rstd must hold one value of x's dtype per row");
  auto dx = at::empty_like(x);
  auto dw = at::empty({c}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rms_norm_backward", [&] {
    rms_backward_kernel<scalar_t>(g.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                                  rstd.data_ptr<scalar_t>(),
                                  w ? w->data_ptr<scalar_t>() : nullptr, dx.data_ptr<scalar_t>(),
                                  dw.data_ptr<scalar_t>(), rows, c);
  });
  if (!w) return {dx};
  return {dx, dw};
}

// ---------------------------------------------------------------------------------------------
// The transposed copies themselves (tiles as above, in parallel over row tiles).
template <typename T>
void transpose_kernel(const T* src, T* dst, int64_t batch, int64_t rows, int64_t cols,
                      int64_t src_batch, int64_t src_row, int64_t dst_batch, int64_t dst_row) {
  const int64_t row_tiles = (rows + TRANSPOSE_TILE - 1) / TRANSPOSE_TILE;
  at::parallel_for(0, batch * row_tiles, 4, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / row_tiles, i0 = (item % row_tiles) * TRANSPOSE_TILE;
      transpose_tiles(src + b * src_batch + i0, src_row, dst + b * dst_batch + i0 * dst_row,
                      dst_row, std::min(TRANSPOSE_TILE, rows - i0), cols);
    }
  });
}

// dst (b, m, n) = src (b, n, m) transposed, in place into dst; both with unit stride in their
// last dimension (any batch and row strides: views into wider tensors), not overlapping.
void transpose_into(at::Tensor& dst, const at::Tensor& src) {
  TORCH_CHECK(dst.device().is_cpu() && src.device().is_cpu() && dst.dim() == 3 &&
                  src.dim() == 3 && src.size(0) == dst.size(0) && src.size(1) == dst.size(2) &&
                  src.size(2) == dst.size(1),
              "native transpose: dst (b, m, n) and src (b, n, m) CPU tensors expected, got ",
              dst.sizes(), " and ", src.sizes());
  TORCH_CHECK(src.scalar_type() == dst.scalar_type(), "native transpose: dtypes differ");
  TORCH_CHECK((dst.stride(2) == 1 || dst.size(2) == 1) && (src.stride(2) == 1 || src.size(2) == 1),
              "native transpose: both tensors need unit stride in their last dimension");
  TORCH_CHECK(dst.stride(1) >= dst.size(2) && src.stride(1) >= src.size(2),
              "native transpose: overlapping rows");
  AT_DISPATCH_FLOATING_TYPES(dst.scalar_type(), "transpose_into", [&] {
    transpose_kernel<scalar_t>(src.data_ptr<scalar_t>(), dst.data_ptr<scalar_t>(), dst.size(0),
                               dst.size(1), dst.size(2), src.stride(0), src.stride(1),
                               dst.stride(0), dst.stride(1));
  });
}

// ---------------------------------------------------------------------------------------------
// The chunked SSD scan, forward and backward (ssd_chunked.py and its hand-written backward,
// ssd_chunked_bwd.py, are the specification; the notation is theirs: chunks of Q tokens, s the
// chunk-local cumulative sum of a = dt A, H the state entering a chunk). A work unit is one
// (sample, group, slice of the group's heads) and runs the whole sequence chunk by chunk, every
// temporary a few KB in cache: per chunk one C B^T, per head the (q, q) weights of the diagonal
// block built in place (no factored form, no strongly-decaying-head special case: a chunk's
// weights cost q^2 exponentials whatever the decay), the state products with the unit's heads
// side by side as GEMM columns (x, y, dx and dy are read and written in place, rows of h * p),
// and the element-wise terms in the loops that need them. The units run in parallel, each GEMM
// single-threaded; a sample and group are split into head slices only when there are fewer of
// them than threads (the slices' gradients of B and C are then summed afterwards, so their
// rounding, as that of PyTorch's own reductions, follows the thread count in that case). The
// forward pass keeps the state entering each chunk for the backward pass, in pieces of
// consecutive chunks (b, chunks of the piece, g, n, r * p) of at most state_piece_bytes each
// (unless one chunk is larger): glibc's malloc hands blocks above 32 MiB straight to mmap, so
// one large buffer (50 MiB for 24 heads of 64 at L = 4096) would be fresh pages, faulted in and
// zeroed by the kernel on every call (more than half of the forward pass's time at two threads).
int64_t state_piece_bytes = 16 << 20;

// Sets the largest piece of the kept states (tests use small pieces); returns the previous.
int64_t set_state_piece_bytes(int64_t bytes) {
  TORCH_CHECK(bytes >= 1, "chunk scan: the piece size must be >= 1 byte, got ", bytes);
  const int64_t previous = state_piece_bytes;
  state_piece_bytes = bytes;
  return previous;
}

struct ScanShape {
  int64_t batch, length, heads, headdim, groups, state, chunk, chunks, slices;

  int64_t per_group() const { return heads / groups; }
  int64_t units() const { return batch * groups * slices; }
};

// Sample b, group g and the group's heads [h0, h1) (first global head: head0) of unit u.
struct ScanUnit {
  int64_t b, g, slice, h0, h1, head0;

  ScanUnit(const ScanShape& d, int64_t u) {
    const int64_t r = d.per_group();
    b = u / (d.groups * d.slices);
    g = (u / d.slices) % d.groups;
    slice = u % d.slices;
    h0 = slice * r / d.slices;
    h1 = (slice + 1) * r / d.slices;
    head0 = g * r + h0;
  }

  int64_t heads() const { return h1 - h0; }
};

// The states entering the chunks, kept in pieces of `per` chunks (see above).
template <typename T>
struct StatePieces {
  std::vector<T*> data;
  int64_t per, chunks, batch, groups, size;  // size: n * r * p, one (sample, chunk, group)

  T* at(int64_t b, int64_t k, int64_t g) const {
    const int64_t piece = k / per, len = std::min(per, chunks - piece * per);
    return data[piece] + ((b * len + k % per) * groups + g) * size;
  }
};

// exp of a decay exponent clamped to [-60, 0] (ssd_chunked_blocks.exp_decay).
template <typename T>
inline T scan_decay(double e) {
  return exp_inline<T>(static_cast<T>(std::min(std::max(e, -60.0), 0.0)));
}

// The chunk's cumulative sums s (double, [hh * Q + i]) and its step sizes dtc ([hh * Q + i])
// of the unit's heads, from dt rows of `heads` values.
template <typename T>
void chunk_sums(const T* dtk, const T* A, int64_t heads, int64_t head0, int64_t nh, int64_t q,
                int64_t Q, double* s, T* dtc) {
  for (int64_t hh = 0; hh < nh; ++hh) {
    const double a = static_cast<double>(A[head0 + hh]);
    double acc = 0;
    for (int64_t i = 0; i < q; ++i) {
      const T d = dtk[i * heads + head0 + hh];
      dtc[hh * Q + i] = d;
      acc += static_cast<double>(d) * a;
      s[hh * Q + i] = acc;
    }
  }
}

// The diagonal block's weights W[i, j] = cb[i, j] exp(s_i - s_j) dt_j (j <= i), 0 above
// (q x q, row stride Q), and with E (the backward pass) their decays exp(s_i - s_j) (j <= i).
template <typename T>
void chunk_weights(const T* cb, const double* s, const T* dtc, int64_t q, int64_t Q, T* W,
                   T* E = nullptr) {
  for (int64_t i = 0; i < q; ++i) {
    T* w = W + i * Q;
    const T* c = cb + i * Q;
    if (E == nullptr) {
      for (int64_t j = 0; j <= i; ++j) w[j] = c[j] * scan_decay<T>(s[i] - s[j]) * dtc[j];
    } else {
      T* e = E + i * Q;
      for (int64_t j = 0; j <= i; ++j) {
        e[j] = scan_decay<T>(s[i] - s[j]);
        w[j] = c[j] * e[j] * dtc[j];
      }
    }
    std::fill(w + i + 1, w + q, T(0));
  }
}

template <typename T>
struct ScanTensors {
  const T *x, *dt, *A, *B, *C, *D;  // D: nullptr without skip weights
};

template <typename T>
void chunk_scan_forward_kernel(const ScanTensors<T>& in, const ScanShape& d, T* y,
                               const StatePieces<T>* states) {
  const int64_t Q = d.chunk, n = d.state, p = d.headdim, h = d.heads, rp = d.per_group() * p;
  const int64_t ldx = h * p, ldbc = d.groups * n;
  at::parallel_for(0, d.units(), 1, [&](int64_t begin, int64_t end) {
    const int64_t cols_max = (d.per_group() + d.slices - 1) / d.slices * p;
    Buffer<double> s(cols_max / p * Q);
    Buffer<T> dtc(s.size()), cb(Q * Q), W(Q * Q), H(n * cols_max), xs(Q * cols_max);
    for (int64_t u = begin; u < end; ++u) {
      const ScanUnit w(d, u);
      const int64_t nh = w.heads(), cols = nh * p;
      std::fill(H.begin(), H.end(), T(0));
      for (int64_t k = 0; k < d.chunks; ++k) {
        const int64_t t0 = k * Q, q = std::min(Q, d.length - t0);
        const int64_t row = w.b * d.length + t0;
        const T* xk = in.x + row * ldx + w.head0 * p;
        const T* Bk = in.B + row * ldbc + w.g * n;
        const T* Ck = in.C + row * ldbc + w.g * n;
        T* yk = y + row * ldx + w.head0 * p;
        chunk_sums(in.dt + row * h, in.A, h, w.head0, nh, q, Q, s.data(), dtc.data());
        if (states != nullptr) {
          T* st = states->at(w.b, k, w.g) + w.h0 * p;
          for (int64_t i = 0; i < n; ++i) std::copy_n(H.data() + i * cols, cols, st + i * rp);
        }
        gemm<T>(false, true, q, q, n, Ck, ldbc, Bk, ldbc, cb.data(), Q);
        if (k > 0) {  // y_i = exp(s_i) C_i H (the state is zero before the first chunk)
          gemm<T>(false, false, q, cols, n, Ck, ldbc, H.data(), cols, yk, ldx);
          for (int64_t i = 0; i < q; ++i)
            for (int64_t hh = 0; hh < nh; ++hh) {
              const T e = scan_decay<T>(s[hh * Q + i]);
              T* yi = yk + i * ldx + hh * p;
              for (int64_t c = 0; c < p; ++c) yi[c] *= e;
            }
        }
        for (int64_t hh = 0; hh < nh; ++hh) {  // + the diagonal block
          chunk_weights(cb.data(), s.data() + hh * Q, dtc.data() + hh * Q, q, Q, W.data());
          gemm<T>(false, false, q, p, q, W.data(), Q, xk + hh * p, ldx, yk + hh * p, ldx, k > 0);
          if (in.D != nullptr) {
            const T dd = in.D[w.head0 + hh];
            for (int64_t i = 0; i < q; ++i) {
              T* yi = yk + i * ldx + hh * p;
              const T* xi = xk + i * ldx + hh * p;
              for (int64_t c = 0; c < p; ++c) yi[c] += dd * xi[c];
            }
          }
        }
        if (k + 1 == d.chunks) break;
        // H <- exp(s_Q) H + B^T (exp(s_Q - s_j) dt_j x_j)
        for (int64_t hh = 0; hh < nh; ++hh) {
          const double* sh = s.data() + hh * Q;
          const T e = scan_decay<T>(sh[q - 1]);
          for (int64_t i = 0; i < n; ++i) {
            T* hi = H.data() + i * cols + hh * p;
            for (int64_t c = 0; c < p; ++c) hi[c] *= e;
          }
          for (int64_t j = 0; j < q; ++j) {
            const T coef = scan_decay<T>(sh[q - 1] - sh[j]) * dtc[hh * Q + j];
            const T* xj = xk + j * ldx + hh * p;
            T* o = xs.data() + j * cols + hh * p;
            for (int64_t c = 0; c < p; ++c) o[c] = coef * xj[c];
          }
        }
        gemm<T>(true, false, n, cols, q, Bk, ldbc, xs.data(), cols, H.data(), cols, true);
      }
    }
  });
}

template <typename T>
struct ScanGrads {
  T *dx, *ddt, *dB, *dC;  // dB, dC: (slices, b, L, g, n)
  double *dA, *dD;        // (b, h)
};

template <typename T>
void chunk_scan_backward_kernel(const ScanTensors<T>& in, const ScanShape& d, const T* dy,
                                const StatePieces<T>& states, const ScanGrads<T>& out) {
  const int64_t Q = d.chunk, n = d.state, p = d.headdim, h = d.heads, rp = d.per_group() * p;
  const int64_t ldx = h * p, ldbc = d.groups * n;
  at::parallel_for(0, d.units(), 1, [&](int64_t begin, int64_t end) {
    const int64_t nh_max = (d.per_group() + d.slices - 1) / d.slices, cols_max = nh_max * p;
    Buffer<double> s(nh_max * Q), da(nh_max * Q), dsi(nh_max * Q), cs(nh_max * Q),
        ddt(nh_max * Q), strad(Q), ds_last(nh_max);
    Buffer<T> dtc(nh_max * Q), cb(Q * Q), W(Q * Q), E(Q * Q), dW(Q * Q), dcb(Q * Q), M(Q * n),
        dCl(Q * n), dBl(Q * n), dHn(n * cols_max), dHl(n * cols_max), dys(Q * cols_max),
        Mb(Q * cols_max), xs(Q * cols_max);
    for (int64_t u = begin; u < end; ++u) {
      const ScanUnit w(d, u);
      const int64_t nh = w.heads(), cols = nh * p;
      double* dA = out.dA + w.b * h + w.head0;
      double* dD = out.dD + w.b * h + w.head0;
      for (int64_t k = d.chunks - 1; k >= 0; --k) {
        const int64_t t0 = k * Q, q = std::min(Q, d.length - t0);
        const int64_t row = w.b * d.length + t0;
        const bool has_state = k > 0, later = k + 1 < d.chunks;  // later: dHn is not zero
        const T* xk = in.x + row * ldx + w.head0 * p;
        const T* dyk = dy + row * ldx + w.head0 * p;
        T* dxk = out.dx + row * ldx + w.head0 * p;
        const T* Bk = in.B + row * ldbc + w.g * n;
        const T* Ck = in.C + row * ldbc + w.g * n;
        const int64_t part = ((w.slice * d.batch + w.b) * d.length + t0) * ldbc + w.g * n;
        const T* H = states.at(w.b, k, w.g) + w.h0 * p;
        chunk_sums(in.dt + row * h, in.A, h, w.head0, nh, q, Q, s.data(), dtc.data());
        gemm<T>(false, true, q, q, n, Ck, ldbc, Bk, ldbc, cb.data(), Q);
        std::fill(da.begin(), da.end(), 0.0);
        std::fill(ddt.begin(), ddt.end(), 0.0);
        std::fill(dcb.begin(), dcb.end(), T(0));
        // the state's output terms y_i += exp(s_i) C_i H: dC, ds_i and dH
        if (has_state) {
          for (int64_t i = 0; i < q; ++i)
            for (int64_t hh = 0; hh < nh; ++hh) {
              const T e = scan_decay<T>(s[hh * Q + i]);
              const T* g = dyk + i * ldx + hh * p;
              T* o = dys.data() + i * cols + hh * p;
              for (int64_t c = 0; c < p; ++c) o[c] = e * g[c];
            }
          for (int64_t hh = 0; hh < nh; ++hh) {  // per head: M = dy_s H^T gives ds_i too
            gemm<T>(false, true, q, n, p, dys.data() + hh * p, cols, H + hh * p, rp, M.data(), n);
            for (int64_t i = 0; i < q; ++i) {
              const T* ci = Ck + i * ldbc;
              const T* mi = M.data() + i * n;
              T* dci = dCl.data() + i * n;
              T dot = 0;
              for (int64_t j = 0; j < n; ++j) {
                dot += ci[j] * mi[j];
                dci[j] = hh ? dci[j] + mi[j] : mi[j];
              }
              dsi[hh * Q + i] = dot;
            }
          }
          gemm<T>(true, false, n, cols, q, Ck, ldbc, dys.data(), cols, dHl.data(), cols);
        }
        // the state passed on, H_out = exp(s_Q) H + sum_j exp(s_Q - s_j) dt_j B_j x_j^T, with
        // dH_out = dHn: dx, dB, ddt and the decays' gradients
        if (later) {
          gemm<T>(false, false, q, cols, n, Bk, ldbc, dHn.data(), cols, Mb.data(), cols);
          for (int64_t hh = 0; hh < nh; ++hh) {
            const double* sh = s.data() + hh * Q;
            for (int64_t j = 0; j < q; ++j) {
              const T e = scan_decay<T>(sh[q - 1] - sh[j]), coef = e * dtc[hh * Q + j];
              const T* xj = xk + j * ldx + hh * p;
              T* mj = Mb.data() + j * cols + hh * p;
              T* o = xs.data() + j * cols + hh * p;
              T dot = 0;
              for (int64_t c = 0; c < p; ++c) {
                dot += mj[c] * xj[c];
                o[c] = coef * xj[c];
                mj[c] *= coef;
              }
              ddt[hh * Q + j] += static_cast<double>(e) * dot;
              cs[hh * Q + j] = static_cast<double>(coef) * dot;
            }
            double sum = 0;
            if (has_state)
              for (int64_t i = 0; i < n; ++i) {
                const T* hi = H + i * rp + hh * p;
                const T* gi = dHn.data() + i * cols + hh * p;
                T dot = 0;
                for (int64_t c = 0; c < p; ++c) dot += hi[c] * gi[c];
                sum += dot;
              }
            ds_last[hh] = sum * static_cast<double>(scan_decay<T>(sh[q - 1]));
          }
          gemm<T>(false, true, q, n, cols, xs.data(), cols, dHn.data(), cols, dBl.data(), n);
        }
        if (has_state) {  // the gradient w.r.t. the state leaving chunk k - 1
          if (!later) std::copy_n(dHl.data(), n * cols, dHn.data());
          for (int64_t hh = 0; later && hh < nh; ++hh) {
            const T e = scan_decay<T>(s[hh * Q + q - 1]);
            for (int64_t i = 0; i < n; ++i) {
              T* g = dHn.data() + i * cols + hh * p;
              const T* l = dHl.data() + i * cols + hh * p;
              for (int64_t c = 0; c < p; ++c) g[c] = e * g[c] + l[c];
            }
          }
        }
        // the diagonal block, per head: dx = W^T dy, dW = dy x^T
        for (int64_t hh = 0; hh < nh; ++hh) {
          const double* sh = s.data() + hh * Q;
          const T* dth = dtc.data() + hh * Q;
          chunk_weights(cb.data(), sh, dth, q, Q, W.data(), E.data());
          gemm<T>(true, false, q, p, q, W.data(), Q, dyk + hh * p, ldx, dxk + hh * p, ldx);
          gemm<T>(false, true, q, q, p, dyk + hh * p, ldx, xk + hh * p, ldx, dW.data(), Q);
          double trace = 0;
          std::fill(strad.begin(), strad.end(), 0.0);
          double* ddth = ddt.data() + hh * Q;
          for (int64_t i = 0; i < q; ++i) {
            const T* dwi = dW.data() + i * Q;
            const T* cbi = cb.data() + i * Q;
            const T* ei = E.data() + i * Q;
            T* dcbi = dcb.data() + i * Q;
            trace += dwi[i];
            double prefix = 0;  // sum_{j <= m} G_ij: the pairs (i, j) whose decay holds a_{m+1}
            for (int64_t j = 0; j <= i; ++j) {
              const T v = dwi[j] * ei[j];
              dcbi[j] += v * dth[j];
              const T vc = v * cbi[j];
              ddth[j] += vc;
              if (j < i) {
                prefix += static_cast<double>(vc * dth[j]);
                strad[j] += prefix;
              }
            }
          }
          dD[hh] += trace;
          double* dah = da.data() + hh * Q;
          for (int64_t m = 0; m + 1 < q; ++m) dah[m + 1] += strad[m];
        }
        // the decays' gradients da_k, then ddt_k += da_k A and dA += da_k dt_k
        for (int64_t hh = 0; hh < nh; ++hh) {
          double* dah = da.data() + hh * Q;
          if (has_state) {  // s_i = sum_{k <= i} a_k
            double acc = 0;
            for (int64_t i = q - 1; i >= 0; --i) dah[i] += (acc += dsi[hh * Q + i]);
          }
          if (later) {  // s_Q - s_j = sum_{k > j} a_k; s_Q = sum_k a_k
            double acc = 0;
            for (int64_t i = 0; i < q; ++i) {
              dah[i] += acc + ds_last[hh];
              acc += cs[hh * Q + i];
            }
          }
          const double a = static_cast<double>(in.A[w.head0 + hh]);
          double sum = 0;
          for (int64_t i = 0; i < q; ++i) {
            const double dti = static_cast<double>(dtc[hh * Q + i]);
            sum += dah[i] * dti;
            out.ddt[(row + i) * h + w.head0 + hh] = static_cast<T>(ddt[hh * Q + i] + dah[i] * a);
          }
          dA[hh] += sum;
          const T dd = in.D != nullptr ? in.D[w.head0 + hh] : T(0);
          for (int64_t i = 0; i < q; ++i) {
            T* dxi = dxk + i * ldx + hh * p;
            const T* gi = dyk + i * ldx + hh * p;
            const T* mi = Mb.data() + i * cols + hh * p;
            if (later)
              for (int64_t c = 0; c < p; ++c) dxi[c] += mi[c] + dd * gi[c];
            else
              for (int64_t c = 0; c < p; ++c) dxi[c] += dd * gi[c];
          }
        }
        // dC = dcb B (+ the state's), dB = dcb^T C (+ the passed state's)
        T* dCk = out.dC + part;
        T* dBk = out.dB + part;
        gemm<T>(false, false, q, n, q, dcb.data(), Q, Bk, ldbc, dCk, ldbc);
        gemm<T>(true, false, q, n, q, dcb.data(), Q, Ck, ldbc, dBk, ldbc);
        for (int64_t i = 0; i < q; ++i) {
          if (has_state)
            for (int64_t j = 0; j < n; ++j) dCk[i * ldbc + j] += dCl[i * n + j];
          if (later)
            for (int64_t j = 0; j < n; ++j) dBk[i * ldbc + j] += dBl[i * n + j];
        }
      }
    }
  });
}

void check_scan(const at::Tensor& t, const at::Tensor& x, std::vector<int64_t> shape,
                const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == x.scalar_type() && t.is_contiguous() &&
                  t.sizes() == at::IntArrayRef(shape),
              "chunk scan: ", name, " must be a contiguous CPU tensor of x's dtype with shape ",
              at::IntArrayRef(shape), ", got ", t.sizes(), " ", t.scalar_type(),
              t.is_contiguous() ? "" : " (not contiguous)");
}

ScanShape scan_shape(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                     const at::Tensor& B, const at::Tensor& C,
                     const std::optional<at::Tensor>& D, int64_t chunk) {
  TORCH_CHECK(x.dim() == 4 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble),
              "chunk scan: x must be (b, L, h, p) float32 or float64, got ", x.sizes(), " ",
              x.scalar_type());
  TORCH_CHECK(B.dim() == 4 && B.size(2) > 0 && x.size(2) % B.size(2) == 0,
              "chunk scan: B must be (b, L, g, n) with g dividing the heads, got ", B.sizes());
  TORCH_CHECK(chunk >= 1, "chunk scan: chunk must be >= 1, got ", chunk);
  ScanShape d{};
  d.batch = x.size(0), d.length = x.size(1), d.heads = x.size(2), d.headdim = x.size(3);
  d.groups = B.size(2), d.state = B.size(3);
  d.chunk = std::min(chunk, std::max<int64_t>(1, d.length));  // scratch is chunk x chunk
  d.chunks = (d.length + d.chunk - 1) / d.chunk;
  check_scan(x, x, {d.batch, d.length, d.heads, d.headdim}, "x");
  check_scan(dt, x, {d.batch, d.length, d.heads}, "dt");
  check_scan(A, x, {d.heads}, "A");
  check_scan(B, x, {d.batch, d.length, d.groups, d.state}, "B");
  check_scan(C, x, {d.batch, d.length, d.groups, d.state}, "C");
  if (D) check_scan(*D, x, {d.heads}, "D");
  // head slices only when the (sample, group) pairs do not keep every thread busy
  const int64_t pairs = d.batch * d.groups, threads = at::get_num_threads();
  d.slices = pairs >= threads ? 1 : std::min(d.per_group(), (threads + pairs - 1) / pairs);
  return d;
}

template <typename T>
ScanTensors<T> scan_tensors(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                            const at::Tensor& B, const at::Tensor& C,
                            const std::optional<at::Tensor>& D) {
  return {x.data_ptr<T>(), dt.data_ptr<T>(), A.data_ptr<T>(), B.data_ptr<T>(), C.data_ptr<T>(),
          D ? D->data_ptr<T>() : nullptr};
}

// The chunks per piece of the kept states (see state_piece_bytes).
int64_t state_piece_chunks(const ScanShape& d, int64_t element) {
  const int64_t chunk_bytes = d.batch * d.groups * d.state * d.per_group() * d.headdim * element;
  return std::clamp<int64_t>(state_piece_bytes / std::max<int64_t>(1, chunk_bytes), 1,
                             std::max<int64_t>(1, d.chunks));
}

template <typename T>
StatePieces<T> state_pieces(const ScanShape& d, const std::vector<at::Tensor>& pieces,
                            int64_t per) {
  StatePieces<T> st{{}, per, d.chunks, d.batch, d.groups, d.state * d.per_group() * d.headdim};
  for (const auto& t : pieces) st.data.push_back(t.data_ptr<T>());
  return st;
}

std::tuple<at::Tensor, std::vector<at::Tensor>> chunk_scan_forward(
    const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A, const at::Tensor& B,
    const at::Tensor& C, const std::optional<at::Tensor>& D, int64_t chunk, bool keep_states) {
  const ScanShape d = scan_shape(x, dt, A, B, C, D, chunk);
  auto y = at::empty(x.sizes(), x.options());
  std::vector<at::Tensor> pieces;
  const int64_t per = state_piece_chunks(d, x.element_size());
  if (keep_states) {
    for (int64_t k = 0; k < d.chunks; k += per)
      pieces.push_back(at::empty({d.batch, std::min(per, d.chunks - k), d.groups, d.state,
                                  d.per_group() * d.headdim}, x.options()));
  }
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "chunk_scan_forward", [&] {
    const auto st = state_pieces<scalar_t>(d, pieces, per);
    chunk_scan_forward_kernel<scalar_t>(scan_tensors<scalar_t>(x, dt, A, B, C, D), d,
                                        y.data_ptr<scalar_t>(), keep_states ? &st : nullptr);
  });
  return {y, pieces};
}

std::vector<at::Tensor> chunk_scan_backward(const at::Tensor& dy, const at::Tensor& x,
                                            const at::Tensor& dt, const at::Tensor& A,
                                            const at::Tensor& B, const at::Tensor& C,
                                            const std::optional<at::Tensor>& D,
                                            const std::vector<at::Tensor>& states, int64_t chunk) {
  const ScanShape d = scan_shape(x, dt, A, B, C, D, chunk);
  check_scan(dy, x, {d.batch, d.length, d.heads, d.headdim}, "dy");
  // the pieces' length as the forward pass chose it
  const int64_t per = states.empty() || states[0].dim() != 5 ? 0 : states[0].size(1);
  TORCH_CHECK(d.chunks == 0 ? states.empty()
                            : per >= 1 && static_cast<int64_t>(states.size()) ==
                                              (d.chunks + per - 1) / per,
              "chunk scan: the states must be the pieces chunk_scan_forward kept (keep_states) "
              "for these inputs, got ", states.size(), " pieces");
  for (size_t i = 0; i < states.size(); ++i)
    check_scan(states[i], x, {d.batch, std::min(per, d.chunks - static_cast<int64_t>(i) * per),
                              d.groups, d.state, d.per_group() * d.headdim}, "a state piece");
  auto dx = at::empty(x.sizes(), x.options());
  auto ddt = at::empty(dt.sizes(), dt.options());
  auto dB = at::empty({d.slices, d.batch, d.length, d.groups, d.state}, x.options());
  auto dC = at::empty_like(dB);
  auto wide = x.options().dtype(at::kDouble);
  auto dA = at::zeros({d.batch, d.heads}, wide), dD = at::zeros({d.batch, d.heads}, wide);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "chunk_scan_backward", [&] {
    ScanGrads<scalar_t> g{dx.data_ptr<scalar_t>(), ddt.data_ptr<scalar_t>(),
                          dB.data_ptr<scalar_t>(), dC.data_ptr<scalar_t>(),
                          dA.data_ptr<double>(), dD.data_ptr<double>()};
    chunk_scan_backward_kernel<scalar_t>(scan_tensors<scalar_t>(x, dt, A, B, C, D), d,
                                         dy.data_ptr<scalar_t>(),
                                         state_pieces<scalar_t>(d, states, per), g);
  });
  auto sum_slices = [&](const at::Tensor& t) { return d.slices == 1 ? t[0] : t.sum(0); };
  return {dx, ddt, dA.sum(0).to(x.scalar_type()), sum_slices(dB), sum_slices(dC),
          dD.sum(0).to(x.scalar_type())};
}

// ---------------------------------------------------------------------------------------------
// The SSD scan by its recurrence, for heads of 16 channels with 16 states (ssd_recurrent.py):
//   h_t = a_t h_{t-1} + B_t (dt_t x_t)^T,   y_t = C_t^T h_t + D x_t,   a_t = exp(dt_t A).
// A head's state (N x P values) lives in N vectors of P lanes (its channels): 16 registers of
// 16 floats with AVX-512, so a token costs 2 N vector FMAs and no (L, L) matrix is built. For
// short sequences of small heads (the demo's 65 tokens) this is several times faster than the
// quadratic form, whose many small GEMMs cost more than their work (docs/results.md).
// Layout of ssd_quadratic.py: x (b, R, h, p, L) with contiguous (p, L) planes, dt (b, R, h, L)
// contiguous, A and D (R, h), B and C (b, R, g, n, L) with contiguous (n, L) planes; direction 0
// (causal) runs t = 0 .. L-1, direction 1 (anti-causal) t = L-1 .. 0. One task per (sample,
// direction, group): the group's B and C and each head's x are transposed token-major into
// cache. The backward pass runs the reverse recurrence of the states' gradient
//   G_t = C_t dy_t^T + a_{t+1} G_{t+1},
// dx_t = dt_t sum_n B_tn G_tn + D dy_t, dB_tn = <G_tn, dt_t x_t>, dC_tn = <h_tn, dy_t>,
// dL/da_t = sum_n <G_tn, h_{t-1,n}>, in blocks of REC_BLOCK tokens taken in reverse: a first
// pass in order keeps each head's state where a block starts, and each block recomputes its
// heads' states from there into cache; the group's heads add their dB and dC terms lane by lane
// in a block-sized buffer, one horizontal sum per (token, state) follows. So the pass touches
// L1-sized buffers only (keeping every token's state and terms, 3 L N P values a head, ran
// 1.3-1.6x slower on an Intel Xeon, whose L2 bandwidth bound it). Each task writes its own
// outputs, so results do not depend on the thread count.

// P lanes of T as one GCC / Clang vector (several registers where P T is wider than one).
template <typename T, int P>
struct Lanes {
  typedef T V __attribute__((vector_size(P * sizeof(T))));
};

template <typename V, typename T>
inline V load_lanes(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}

template <typename V, typename T>
inline void store_lanes(T* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}

// The sum of a vector's lanes (a reduction instruction sequence where there is one: GCC turns
// the plain loop into one scalar addition per lane).
template <typename T, int P, typename V>
inline T lane_sum(const V& v) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float> && P == 16) {
    __m512 r;
    std::memcpy(&r, &v, sizeof r);
    return _mm512_reduce_add_ps(r);
  }
#endif
  T s = v[0];
  for (int i = 1; i < P; ++i) s += v[i];
  return s;
}

// red[n] = sum_p acc[n P + p]: the lane sums of one tile of N x P values, transposed in cache
// and its rows added as vectors.
template <typename T, int N, int P>
inline void tile_lane_sums(const T* acc, T* red) {
  using V = typename Lanes<T, N>::V;
  alignas(CACHE_LINE) T tile[P * N];
  transpose_tiles(acc, int64_t(P), tile, int64_t(N), int64_t(P), int64_t(N));
  V sum = load_lanes<V>(tile);
  for (int p = 1; p < P; ++p) sum += load_lanes<V>(tile + p * N);
  store_lanes(red, sum);
}

constexpr int REC_STATE = 16, REC_CHANNELS = 16;

struct RecurrentShape {
  int64_t batch, dirs, heads, groups, length;
  int64_t per_group() const { return heads / groups; }
  int64_t tasks() const { return batch * dirs * groups; }
};

template <typename T>
struct RecurrentInputs {
  const T *x, *dt, *A, *B, *C, *D;  // D may be null
  Planes px, pb, pc;
};

// The forward pass's per-thread buffers of one task: the group's B and C token-major (L x N), a
// head's x and output token-major (L x P), its decays (L).
template <typename T, int N, int P>
struct RecurrentBuffers {
  Buffer<T> bt, ct, xt, ot, decay;
  explicit RecurrentBuffers(int64_t L)
      : bt(L * N), ct(L * N), xt(L * P), ot(L * P), decay(L) {}
};

// Loads the task's group operands token-major into bt and ct (L x N each) and returns the first
// head's index; `task` in (b, R, g) order.
template <typename T, int N>
int64_t load_group(const RecurrentInputs<T>& in, const RecurrentShape& d, int64_t task, T* bt,
                   T* ct) {
  const int64_t L = d.length, plane = task / d.groups, g = task % d.groups;
  const int64_t unit = plane * d.groups + g;  // (b, R, g) plane of B and C
  transpose_tiles(in.B + in.pb.offset(unit), L, bt, int64_t(N), L, int64_t(N));
  transpose_tiles(in.C + in.pc.offset(unit), L, ct, int64_t(N), L, int64_t(N));
  return plane * d.heads + g * d.per_group();
}

// The (b, R, h) head `unit`'s x token-major into xt (L x P) and its decays into decay (L).
template <typename T, int P>
void load_head(const RecurrentInputs<T>& in, const RecurrentShape& d, int64_t unit, T Ah, T* xt,
               T* decay) {
  const int64_t L = d.length;
  transpose_tiles(in.x + in.px.offset(unit), L, xt, int64_t(P), L, int64_t(P));
  const T* dt = in.dt + unit * L;
  for (int64_t t = 0; t < L; ++t) decay[t] = exp_inline<T>(dt[t] * Ah);
}

template <typename T, int N, int P>
void recurrent_forward_kernel(const RecurrentInputs<T>& in, const RecurrentShape& d, T* y) {
  using V = typename Lanes<T, P>::V;
  const int64_t L = d.length;
  at::parallel_for(0, d.tasks(), 1, [&](int64_t begin, int64_t end) {
    RecurrentBuffers<T, N, P> buf(L);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t first = load_group<T, N>(in, d, task, buf.bt.data(), buf.ct.data());
      const int64_t r = (task / d.groups) % d.dirs;
      for (int64_t unit = first; unit < first + d.per_group(); ++unit) {
        const int64_t h = unit % d.heads;
        const T Ah = in.A[r * d.heads + h], Dh = in.D ? in.D[r * d.heads + h] : T(0);
        load_head<T, P>(in, d, unit, Ah, buf.xt.data(), buf.decay.data());
        const T* dt = in.dt + unit * L;
        V state[N];
        for (int n = 0; n < N; ++n) state[n] = V{};
        for (int64_t s = 0; s < L; ++s) {
          const int64_t t = r == 0 ? s : L - 1 - s;
          const T a = buf.decay[t];
          const V xv = load_lanes<V>(&buf.xt[t * P]);
          const V xd = xv * dt[t];
          const T* bn = &buf.bt[t * N];
          const T* cn = &buf.ct[t * N];
          V yv = xv * Dh;
#pragma GCC unroll 16
          for (int n = 0; n < N; ++n) {
            state[n] = state[n] * a + xd * bn[n];
            yv += state[n] * cn[n];
          }
          store_lanes(&buf.ot[t * P], yv);
        }
        transpose_tiles(buf.ot.data(), int64_t(P), y + unit * P * L, L, int64_t(P), L);
      }
    }
  });
}

template <typename T>
struct RecurrentGrads {
  T *dx, *ddt, *dB, *dC;
  double *dA, *dD;  // (b, R, h) parts, summed over the batch by the caller
};

// Tokens per block of the backward pass: the block's dB / dC sums and states stay in L1.
constexpr int64_t REC_BLOCK = 4;

template <typename T, int N, int P>
void recurrent_backward_kernel(const RecurrentInputs<T>& in, const RecurrentShape& d,
                               const T* dy, const Planes& pdy, const RecurrentGrads<T>& g) {
  using V = typename Lanes<T, P>::V;
  constexpr int64_t TILE = N * P, Q = REC_BLOCK;
  const int64_t L = d.length, H = d.per_group(), blocks = (L + Q - 1) / Q;
  at::parallel_for(0, d.tasks(), 1, [&](int64_t begin, int64_t end) {
    // the group's B and C, every head's x, dy, dx (token-major) and decays; each head's state
    // at the start of every block (in processing order) and its state gradient between blocks;
    // one block's states of a head and the group's dB / dC terms of its tokens, lane by lane;
    // their lane sums
    Buffer<T> bt(L * N), ct(L * N), xs(H * L * P), dys(H * L * P), dxs(H * L * P), decays(H * L);
    Buffer<T> starts(H * blocks * TILE), grads(H * TILE), block(Q * TILE);
    Buffer<T> accB(Q * TILE), accC(Q * TILE), redB(L * N), redC(L * N);
    std::vector<T> a_next(H);
    std::vector<double> dA(H), dD(H);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t first = load_group<T, N>(in, d, task, bt.data(), ct.data());
      const int64_t r = (task / d.groups) % d.dirs;
      const auto token = [&](int64_t s) { return r == 0 ? s : L - 1 - s; };
      // pass 1, in order: each head's states at the blocks' starts, and dD
      for (int64_t j = 0; j < H; ++j) {
        const int64_t unit = first + j, h = unit % d.heads;
        T* xt = &xs[j * L * P];
        T* dyt = &dys[j * L * P];
        load_head<T, P>(in, d, unit, in.A[r * d.heads + h], xt, &decays[j * L]);
        transpose_tiles(dy + pdy.offset(unit), L, dyt, int64_t(P), L, int64_t(P));
        const T* dt = in.dt + unit * L;
        V state[N];
        for (int n = 0; n < N; ++n) state[n] = V{};
        double dDh = 0;
        for (int64_t s = 0; s < L; ++s) {
          if (s % Q == 0) {
            T* start = &starts[(j * blocks + s / Q) * TILE];
            for (int n = 0; n < N; ++n) store_lanes(start + n * P, state[n]);
          }
          const int64_t t = token(s);
          const T a = decays[j * L + t];
          const V xv = load_lanes<V>(xt + t * P);
          const V xd = xv * dt[t];
          const T* bn = &bt[t * N];
#pragma GCC unroll 16
          for (int n = 0; n < N; ++n) state[n] = state[n] * a + xd * bn[n];
          dDh += double(lane_sum<T, P>(xv * load_lanes<V>(dyt + t * P)));
        }
        dD[j] = dDh;
        dA[j] = 0;
        a_next[j] = 0;
        std::fill(&grads[j * TILE], &grads[(j + 1) * TILE], T(0));
      }
      // pass 2, the blocks in reverse: per head its block's states again (dC), then the reverse
      // recurrence of their gradient G_t (dB, dx, ddt, dL/da_t = sum_n <G_tn, h_{t-1,n}>)
      for (int64_t k = blocks - 1; k >= 0; --k) {
        const int64_t s0 = k * Q, s1 = std::min(L, s0 + Q);
        std::fill(accB.begin(), accB.end(), T(0));
        std::fill(accC.begin(), accC.end(), T(0));
        for (int64_t j = 0; j < H; ++j) {
          const int64_t unit = first + j, h = unit % d.heads;
          const T Ah = in.A[r * d.heads + h], Dh = in.D ? in.D[r * d.heads + h] : T(0);
          const T* dt = in.dt + unit * L;
          const T* xt = &xs[j * L * P];
          const T* dyt = &dys[j * L * P];
          const T* start = &starts[(j * blocks + k) * TILE];
          {
            V state[N];
            for (int n = 0; n < N; ++n) state[n] = load_lanes<V>(start + n * P);
            for (int64_t s = s0; s < s1; ++s) {
              const int64_t t = token(s);
              const T a = decays[j * L + t];
              const V xd = load_lanes<V>(xt + t * P) * dt[t];
              const V dyv = load_lanes<V>(dyt + t * P);
              const T* bn = &bt[t * N];
              T* kept = &block[(s - s0) * TILE];
              T* ac = &accC[(s - s0) * TILE];
#pragma GCC unroll 16
              for (int n = 0; n < N; ++n) {
                state[n] = state[n] * a + xd * bn[n];
                store_lanes(kept + n * P, state[n]);
                store_lanes(ac + n * P, load_lanes<V>(ac + n * P) + state[n] * dyv);
              }
            }
          }
          V grad[N];
          T* gj = &grads[j * TILE];
          for (int n = 0; n < N; ++n) grad[n] = load_lanes<V>(gj + n * P);
          T an = a_next[j];
          double dAh = dA[j];
          T* ddt = g.ddt + unit * L;
          T* dxt = &dxs[j * L * P];
          for (int64_t s = s1 - 1; s >= s0; --s) {
            const int64_t t = token(s);
            const V dyv = load_lanes<V>(dyt + t * P);
            const V xv = load_lanes<V>(xt + t * P);
            const V xd = xv * dt[t];
            const T* bn = &bt[t * N];
            const T* cn = &ct[t * N];
            const T* before = s > s0 ? &block[(s - 1 - s0) * TILE] : start;
            T* ab = &accB[(s - s0) * TILE];
            V v = V{}, q = V{};
#pragma GCC unroll 16
            for (int n = 0; n < N; ++n) {
              grad[n] = grad[n] * an + dyv * cn[n];
              v += grad[n] * bn[n];
              q += grad[n] * load_lanes<V>(before + n * P);
              store_lanes(ab + n * P, load_lanes<V>(ab + n * P) + grad[n] * xd);
            }
            store_lanes(dxt + t * P, v * dt[t] + dyv * Dh);
            const T a = decays[j * L + t], da = lane_sum<T, P>(q);
            ddt[t] = lane_sum<T, P>(v * xv) + Ah * a * da;
            dAh += double(dt[t]) * double(a) * double(da);
            an = a;
          }
          for (int n = 0; n < N; ++n) store_lanes(gj + n * P, grad[n]);
          a_next[j] = an;
          dA[j] = dAh;
        }
        for (int64_t s = s0; s < s1; ++s) {
          tile_lane_sums<T, N, P>(&accB[(s - s0) * TILE], &redB[token(s) * N]);
          tile_lane_sums<T, N, P>(&accC[(s - s0) * TILE], &redC[token(s) * N]);
        }
      }
      for (int64_t j = 0; j < H; ++j) {
        const int64_t unit = first + j;
        transpose_tiles(&dxs[j * L * P], int64_t(P), g.dx + unit * P * L, L, int64_t(P), L);
        g.dA[unit] = dA[j];
        g.dD[unit] = dD[j];
      }
      // the group's dB and dC: token-major, one transpose into (n, L)
      transpose_tiles(redB.data(), int64_t(N), g.dB + task * N * L, L, int64_t(N), L);
      transpose_tiles(redC.data(), int64_t(N), g.dC + task * N * L, L, int64_t(N), L);
    }
  });
}

RecurrentShape recurrent_shape(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                               const at::Tensor& B, const at::Tensor& C,
                               const std::optional<at::Tensor>& D) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 5 &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble),
              "recurrent scan: x must be a float32 or float64 (b, R, h, p, L) CPU tensor, got ",
              x.sizes(), " ", x.scalar_type());
  TORCH_CHECK(x.size(3) == REC_CHANNELS && B.dim() == 5 && B.size(3) == REC_STATE,
              "recurrent scan: heads of ", REC_CHANNELS, " channels with ", REC_STATE,
              " states only, got x ", x.sizes(), " and B ", B.sizes());
  check_planes(x, x, "x");
  const RecurrentShape d{x.size(0), x.size(1), x.size(2), B.size(2), x.size(4)};
  TORCH_CHECK(d.dirs == 1 || d.dirs == 2, "recurrent scan: 1 or 2 directions, got ", d.dirs);
  TORCH_CHECK(d.groups >= 1 && d.heads % d.groups == 0,
              "recurrent scan: the heads (", d.heads, ") must split into the groups (", d.groups,
              ")");
  for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{B, "B"}, {C, "C"}})
    TORCH_CHECK(t.sizes() == at::IntArrayRef({d.batch, d.dirs, d.groups, REC_STATE, d.length}) &&
                    t.scalar_type() == x.scalar_type() && contiguous_planes(t),
                "recurrent scan: ", name, " must be (", d.batch, ", ", d.dirs, ", ", d.groups,
                ", ", REC_STATE, ", ", d.length, ") of x's dtype with contiguous (n, L) planes, "
                "got ", t.sizes(), " with strides ", t.strides(), ", ", t.scalar_type());
  check_tokens(dt, x, "dt");
  for (const at::Tensor* t : {&A, D ? &*D : nullptr}) {
    if (t == nullptr) continue;
    TORCH_CHECK(t->sizes() == at::IntArrayRef({d.dirs, d.heads}) && t->is_contiguous() &&
                    t->scalar_type() == x.scalar_type(),
                "recurrent scan: A and D must be contiguous (", d.dirs, ", ", d.heads,
                ") tensors of x's dtype, got ", t->sizes(), " ", t->scalar_type());
  }
  return d;
}

template <typename T>
RecurrentInputs<T> recurrent_inputs(const at::Tensor& x, const at::Tensor& dt,
                                    const at::Tensor& A, const at::Tensor& B,
                                    const at::Tensor& C, const std::optional<at::Tensor>& D) {
  return {x.data_ptr<T>(), dt.data_ptr<T>(), A.data_ptr<T>(), B.data_ptr<T>(), C.data_ptr<T>(),
          D ? D->data_ptr<T>() : nullptr, Planes(x), Planes(B), Planes(C)};
}

at::Tensor recurrent_scan_forward(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                                  const at::Tensor& B, const at::Tensor& C,
                                  const std::optional<at::Tensor>& D) {
  const RecurrentShape d = recurrent_shape(x, dt, A, B, C, D);
  auto y = at::empty(x.sizes(), x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "recurrent_scan_forward", [&] {
    recurrent_forward_kernel<scalar_t, REC_STATE, REC_CHANNELS>(
        recurrent_inputs<scalar_t>(x, dt, A, B, C, D), d, y.data_ptr<scalar_t>());
  });
  return y;
}

std::vector<at::Tensor> recurrent_scan_backward(const at::Tensor& dy, const at::Tensor& x,
                                                const at::Tensor& dt, const at::Tensor& A,
                                                const at::Tensor& B, const at::Tensor& C,
                                                const std::optional<at::Tensor>& D) {
  const RecurrentShape d = recurrent_shape(x, dt, A, B, C, D);
  check_planes(dy, x, "dy");
  auto dx = at::empty(x.sizes(), x.options()), ddt = at::empty(dt.sizes(), dt.options());
  auto dB = at::empty(B.sizes(), B.options()), dC = at::empty(C.sizes(), C.options());
  auto wide = x.options().dtype(at::kDouble);
  auto dA = at::empty({d.batch, d.dirs, d.heads}, wide), dD = at::empty_like(dA);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "recurrent_scan_backward", [&] {
    RecurrentGrads<scalar_t> g{dx.data_ptr<scalar_t>(), ddt.data_ptr<scalar_t>(),
                               dB.data_ptr<scalar_t>(), dC.data_ptr<scalar_t>(),
                               dA.data_ptr<double>(), dD.data_ptr<double>()};
    recurrent_backward_kernel<scalar_t, REC_STATE, REC_CHANNELS>(
        recurrent_inputs<scalar_t>(x, dt, A, B, C, D), d, dy.data_ptr<scalar_t>(), Planes(dy),
        g);
  });
  return {dx, ddt, dA.sum(0).to(x.scalar_type()), dB, dC, dD.sum(0).to(x.scalar_type())};
}

// How many threads at::parallel_for spreads `items` work items over. at::parallel_for is a header
// template: in a file compiled without OpenMP it runs every loop on the calling thread, so this
// tells whether the kernels above really run in parallel.
int64_t parallel_threads(int64_t items) {
  std::vector<int> used(std::max(1, at::get_num_threads()), 0);
  at::parallel_for(0, items, 1, [&](int64_t, int64_t) { used[at::get_thread_num()] = 1; });
  return std::count(used.begin(), used.end(), 1);
}

// MKL's thread count as a GEMM inside a parallel loop sees it (the most over the loop's threads),
// or -1 where the BLAS is not MKL: whether SerialBlasGuard does its job, for the tests.
int64_t loop_blas_threads() {
  using get_fn = int (*)();
  static const get_fn get = reinterpret_cast<get_fn>(blas_symbol("MKL_Get_Max_Threads"));
  if (get == nullptr || blas_symbol("MKL_Set_Num_Threads_Local") == nullptr) return -1;
  std::vector<int> seen(std::max(1, at::get_num_threads()), 0);
  at::parallel_for(0, static_cast<int64_t>(seen.size()), 1, [&](int64_t, int64_t) {
    const SerialBlasGuard serial;
    seen[at::get_thread_num()] = get();
  });
  return *std::max_element(seen.begin(), seen.end());
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("conv_silu_forward", &conv_silu_forward,
        "both directions' depthwise conv + SiLU: the token-major x (b, L, C) -> (b, 2, C, L)");
  m.def("conv_silu_backward", &conv_silu_backward,
        "gradients of conv_silu_forward for dact given as channel parts (b, 2, C_i, L): writes "
        "the token-major dx (b, L, C), returns [dweight (2, C, K), dbias (2, C)]");
  m.def("merge_forward", &merge_forward,
        "(rmsnorm(y_0 silu(z)) w_0 + rmsnorm(y_1 silu(z)) w_1) / 2 of y (b, 2, d, L) and the "
        "token-major z (b, L, d), written into the token-major out (b, L, d)");
  m.def("merge_backward", &merge_backward,
        "gradients of merge_forward for the token-major dm (b, L, d): writes dz (b, L, d) "
        "(and, if given, merge_forward's output again into out), returns [dy (b, 2, d, L), "
        "dweight (2, d)]");
  m.def("merge_backward_scan", &merge_backward_scan,
        "merge_backward with y = ys row + x diag (+ the wide heads' parts) of the quadratic "
        "scan's state rebuilt tile by tile instead of read: [dy (b, 2, d, L), dweight (2, d)]");
  m.def("wide_weights", &wide_weights,
        "the scan's per-head weights (N, L, L) (or their transposes) of its wide heads");
  m.def("wide_grads", &wide_grads,
        "the wide heads' gradients: adds to dcb in place, returns [dS (N, L), pairs (N,)]");
  m.def("wide_forward", &wide_forward,
        "the wide heads' share of the quadratic scan added to y in place; returns it (N, p, L)");
  m.def("wide_backward", &wide_backward,
        "the wide heads' gradients added to dx, ddt, dS and dcb in place; returns their dA "
        "(R, h) in float64");
  m.def("products_forward", &products_forward,
        "the factored form's [ys, y = ys row + x diag] (b, R, h, p, L) of x scaled by s, per "
        "(sample, direction, group) in one pass");
  m.def("products_backward", &products_backward,
        "gradients of products_forward's products for dy: [dx = dxs s + dy diag, dcb, and the "
        "per-token sums over p of dxs x, dys ys, dy x]");
  m.def("scan_factors", &scan_factors,
        "the quadratic scan's [dt, S (float64), row, col (b, 2, h, L), wide (b, 2, h)] from the "
        "token-major raw step sizes (b, L, h), dt_bias and A (2, h), and the factored range "
        "([dt] alone unless factors)");
  m.def("scale_tokens", &scale_tokens,
        "x (b, R, h, p, L) times the per-token s (b, R, h, L), broadcast over p");
  m.def("scan_output", &scan_output, "ys * row + x * diag (per-token row and diag)");
  m.def("scan_backward_pointwise", &scan_backward_pointwise,
        "dxs <- dxs s + dy diag in place; returns the per-token sums over p of dxs x, dys ys, "
        "dy x");
  m.def("column_products", &column_products,
        "out = a @ m (or a @ m^T) per (sample, direction, group), m zero outside its block "
        "triangle, every block product a task");
  m.def("masked_outer", &masked_outer,
        "out = dy^T @ x per (sample, direction, group) on each direction's strict triangle, "
        "optionally the full product's diagonal");
  m.def("rms_norm_forward", &rms_norm_forward,
        "RMSNorm over the last dimension: [y, rstd (..., 1)] of a contiguous x");
  m.def("rms_norm_backward", &rms_norm_backward,
        "gradients of rms_norm_forward: [dx, dweight] (dx alone without a weight)");
  m.def("chunk_scan_forward", &chunk_scan_forward,
        "the chunked SSD scan: (y (b, L, h, p), the states entering the chunks in pieces of "
        "consecutive chunks (b, chunks of the piece, g, n, r * p), none unless keep_states) of "
        "x, dt, A, B, C, D and the chunk length");
  m.def("chunk_scan_backward", &chunk_scan_backward,
        "gradients of chunk_scan_forward for dy from its states: [dx, ddt, dA, dB, dC, dD]");
  m.def("recurrent_scan_forward", &recurrent_scan_forward,
        "the SSD scan by its recurrence, heads of 16 channels with 16 states: y (b, R, h, p, L) "
        "of x, dt, A, B, C, D in the layout of ssd_quadratic.py");
  m.def("recurrent_scan_backward", &recurrent_scan_backward,
        "gradients of recurrent_scan_forward for dy: [dx, ddt, dA, dB, dC, dD]");
  m.def("set_state_piece_bytes", &set_state_piece_bytes,
        "the largest piece of the chunk scan's kept states in bytes; returns the previous");
  m.def("blas_found", &blas_found, "whether the BLAS GEMMs were found in libtorch_cpu");
  m.def("set_direct_blas", &set_direct_blas,
        "true: the BLAS GEMMs directly (if found), false: at::mm_out; returns the previous");
  m.def("set_serial_blas", &set_serial_blas,
        "true: the GEMMs inside the kernels' parallel loops run on one BLAS thread each; "
        "returns the previous");
  m.def("loop_blas_threads", &loop_blas_threads,
        "MKL's thread count as seen by a GEMM inside a parallel loop (-1: not MKL)");
  m.def("transpose_into", &transpose_into,
        "dst (b, m, n) = src (b, n, m) transposed (unit stride in the last dimension of both)");
  m.def("parallel_threads", &parallel_threads,
        "how many threads at::parallel_for spreads `items` work items over");
}
