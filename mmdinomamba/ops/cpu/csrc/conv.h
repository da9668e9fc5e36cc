// mmdinomamba native CPU kernels: both directions' depthwise conv + SiLU, forward and backward.
// Part of one translation unit (bindings.cpp includes every part in order).
#pragma once

namespace {

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

}  // namespace
