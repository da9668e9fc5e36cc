// mmdinomamba native CPU kernels: the quadratic form's factored products with their element-wise work.
// Part of one translation unit (bindings.cpp includes every part in order).
#pragma once

namespace {

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

}  // namespace
