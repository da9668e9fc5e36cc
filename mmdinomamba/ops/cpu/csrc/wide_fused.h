// mmdinomamba native CPU kernels: the quadratic form's strongly decaying heads in one call each way.
// Part of one translation unit (bindings.cpp includes every part in order).
#pragma once

namespace {

// ---------------------------------------------------------------------------------------------
// The (sample, direction, head) triples with |S_first - S_last| > FACTORED_RANGE (strong decay,
// "wide" heads; ssd_quadratic.py) cannot factor their decay into per-token scales; their
// matrices W_ij = exp(clamp(hi_i - hi_j, -60, 0)) (C_i . B_j) on the strict triangle are built
// per head. S is summed in float64 and split into hi + lo (hi its rounding to T): hi_i - hi_j is
// exact near the diagonal, where it matters, and the small remainders enter as scales exp(lo_i)
// of y and exp(-lo_j) of x, so long strongly decaying sequences keep float32 accuracy. Clamping
// the exponents at -60 keeps every factor a normal float (subnormal exponentials are 20-200x
// slower on x86). dA is summed pair by pair (sum_ij G_ij (T_i - T_j), T the cumulative dt),
// because sum_i T_i dS_i would cancel terms far larger than the result.
// Every wide head reads its planes of the full (b, R, h, ...) tensors and adds its share to them
// in place, with its scaled values, weights and products in buffers of its own task (a few
// hundred KB, in cache). The factors at the floor are taken as zero (decay_or_zero) and the parts
// of a token block's products where all of them sit there (wide_band) are skipped: less than
// 1e-26 relative, as is the clamp itself.

// The decay factor, zero instead of exp(-60) at the floor.
template <typename T>
inline T decay_or_zero(T d) {
  return d <= T(-60) ? T(0) : exp_inline(std::min(d, T(0)));
}

// The columns j of row i inside direction dir's strict triangle: [*j0, *j1).
inline void triangle_row(int64_t dir, int64_t i, int64_t length, int64_t* j0, int64_t* j1) {
  *j0 = dir == 0 ? 0 : i + 1;
  *j1 = dir == 0 ? i : length;
}

// One head's weights into w (L x L): per row i, the factors of decay_or_zero times its (L, L)
// group matrix cb on the columns [lo[i], hi[i]) (wide_band), zero elsewhere.
template <typename T>
void head_weights(const T* h, const T* cb, int64_t length, T* w, const int64_t* lo,
                  const int64_t* hi) {
  std::fill(w, w + length * length, T(0));
  for (int64_t i = 0; i < length; ++i) {
    T* wr = w + i * length;
    const T* cr = cb + i * length;
    const T hi_i = h[i];
#pragma omp simd
    for (int64_t j = lo[i]; j < hi[i]; ++j) wr[j] = decay_or_zero(hi_i - h[j]) * cr[j];
  }
}

// One head's gradients from g = dL/dW (L x L; the columns [lo[i], hi[i]) of row i read): adds
// E * g (E the decay factors) to its group matrix's gradient dcb, and with G = g * W writes
// ds[i] = sum_j G_ij - sum_j G_ji and returns sum_ij G_ij (t_i - t_j); col a scratch of L.
template <typename T>
double head_grads(const T* g, const T* h, const T* tn, const T* cb, T* dcb, T* ds, T* col,
                  int64_t length, const int64_t* lo, const int64_t* hi) {
  std::fill(col, col + length, T(0));
  double pair = 0;
  for (int64_t i = 0; i < length; ++i) {
    const T* gr = g + i * length;
    const T* cr = cb + i * length;
    T* dr = dcb + i * length;
    const T hi_i = h[i], t_i = tn[i];
    T row = 0, p = 0;
#pragma omp simd reduction(+ : row, p)
    for (int64_t j = lo[i]; j < hi[i]; ++j) {
      const T edw = decay_or_zero(hi_i - h[j]) * gr[j];
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

struct WideHead {
  int64_t dir, plane, mat;  // direction, (b, r, h) plane index, (b, r, g) matrix index
};

// The wide heads by direction, then sample, then head (the order of their parts).
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
      head_weights(hi.data(), cb + hd.mat * area, L, w.data(), lo, up);
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
// dt, as ssd_quadratic.cumulative writes it), split into t_hi + t_lo.
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
        head_weights(hi.data(), cb + hd.mat * area, L, w.data(), lo, up);
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
        double pair = head_grads(dw.data(), hi.data(), t_hi.data(), cb + hd.mat * area,
                                 dcb + hd.mat * area, ds.data(), col.data(), L, lo, up);
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

}  // namespace
