// mmdinomamba native CPU kernels: the quadratic form's per-token factors and element-wise work.
// Part of one translation unit (bindings.cpp includes every part in order).
#pragma once

namespace {

// ---------------------------------------------------------------------------------------------
// The quadratic form's per-token factors (bidir_inner's dt with ssd_quadratic._factors): for
// each sample, direction r and head, dt = softplus(raw + bias[r]) from the token-major raw step
// sizes (a view into the projection), S the cumulative sum of a = dt A[r] in float64 (inclusive;
// reverse for direction 1, written as total - cumsum + a as cumulative() does), whether the head
// is wide (|S_first - S_last| > range) and, for the others, row = exp(S - c) and col = exp(c - S)
// with c the middle of the range (zero for wide heads). One thread per (b, r, h) row.
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
                                     const at::Tensor& A, double range) {
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

// The merge's y rebuilt tile by tile from the quadratic scan's state: y = ys row + x diag, plus
// its part for a wide head (wide_forward's parts), channel-major in the thread's
// (d, merge_tokens(d)) work buffer, then transposed into the merge's token-major scratch.
// merge_backward_scan thus reads ys and x instead of y: y is neither written nor read again (DinoVim-T: 6.4 MB a layer each way).
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
        if (part[plane] >= 0) {  // the wide head's part, as wide_forward added it to y
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
  auto dy = at::empty({batch, 2, d, length}, x.options());
  const int64_t mt = merge_tokens(d), tiles = (length + mt - 1) / mt;
  auto dw = at::empty({batch * tiles, 2, d}, dy.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "merge_backward_scan", [&] {
    using T = scalar_t;
    const ScanOutputInput<T> input{ys.data_ptr<T>(), row.data_ptr<T>(), x.data_ptr<T>(),
                                   diag.data_ptr<T>(), count ? parts->data_ptr<T>() : nullptr,
                                   Planes(ys), Planes(x), part.data(), d, length};
    auto kernel = out ? merge_backward_kernel<true, T, ScanOutputInput<T>>
                      : merge_backward_kernel<false, T, ScanOutputInput<T>>;
    kernel(tokens<const T>(dm), input, tokens<const T>(z), weight.data_ptr<T>(),
           dy.data_ptr<T>(), tokens<T>(dz), dw.data_ptr<T>(), out ? tokens<T>(*out) : Tokens<T>{},
           batch, d, length, groups, static_cast<T>(eps));
  });
  return {dy, dw.sum(0)};
}

}  // namespace
