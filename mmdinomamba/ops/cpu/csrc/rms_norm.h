// mmdinomamba native CPU kernels: the blocks' RMSNorm, forward and backward.
// Part of one translation unit (bindings.cpp includes every part in order).
#pragma once

namespace {

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

}  // namespace
