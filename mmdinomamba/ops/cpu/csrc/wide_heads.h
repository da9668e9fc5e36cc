// mmdinomamba native CPU kernels: the quadratic form's strongly decaying heads, one head at a time.
// Part of one translation unit (bindings.cpp includes every part in order).
#pragma once

namespace {

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

}  // namespace
