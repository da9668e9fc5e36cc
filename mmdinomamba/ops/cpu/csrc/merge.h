// mmdinomamba native CPU kernels: the gated merge of both directions, forward and backward.
// Part of one translation unit (bindings.cpp includes every part in order).
#pragma once

namespace {

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

// Gradients for dm: dy (b, 2, d, L), dz (token-major) and the weight's gradient of every tile
// dw (b * tiles, 2, d) (summed by the caller: a fixed split, whatever the thread count); with
// Out (out.data set), the forward pass's output again (token-major), from the values the
// gradients use. y: a ScanOutputInput (scan_pointwise.h), the scan's output rebuilt tile by tile
// into the token-major scratch.
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

}  // namespace
