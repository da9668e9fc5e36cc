// mmdinomamba native CPU kernels: single-threaded GEMMs and the quadratic form's triangular products.
// Part of one translation unit (bindings.cpp includes every part in order).
#pragma once

namespace {

// ---------------------------------------------------------------------------------------------
// The quadratic scan's (L, L) matrix products (ssd_quadratic.py) in one call each: every
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

// A GEMM called inside one of the kernels' parallel loops runs on its calling thread alone.
// PyTorch switches MKL's dynamic thread count off (so that its threads are not torn down
// between MKL and other parallel code); MKL then opens a nested team of torch's thread count
// for every such GEMM, on threads that are all busy with the loop's other tasks. The guard sets
// MKL's thread-local count to one around the call (MKL_Set_Num_Threads_Local, looked up like
// the GEMMs; no-op where the BLAS is not MKL) and restores it after. On a 2-core Cascade Lake
// Xeon the quadratic scan's 24 layers (DinoVim-T, batch 8, forward + backward) ran 1.09x
// faster with it.
class SerialBlasGuard {
 public:
  SerialBlasGuard() {
    using set_fn = int (*)(int);
    static const set_fn set_local =
        reinterpret_cast<set_fn>(blas_symbol("MKL_Set_Num_Threads_Local"));
    if (set_local != nullptr && at::in_parallel_region()) {
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
  if (fn != nullptr) {
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
// strict lower and direction 1's strict upper triangle, zero elsewhere: row block i computes
// only the columns of its blocks that reach the triangle, then zeroes the rest of its rows.
// diag (b, R, g, L) receives the diagonal of the full product.
void masked_outer(const at::Tensor& dy, const at::Tensor& x, at::Tensor& out,
                  const std::vector<int64_t>& bounds_in, at::Tensor& diag) {
  check_first_operand(dy);
  const int64_t length = dy.size(4);
  check_stack(x, dy, dy.size(3), length, "the second operand");
  check_stack(out, dy, length, length, "the output");
  TORCH_CHECK(diag.is_contiguous() && diag.scalar_type() == dy.scalar_type() &&
                  diag.sizes() == at::IntArrayRef({dy.size(0), dy.size(1), dy.size(2), length}),
              "native products: diag must be a contiguous (b, R, g, L) tensor of the operands' "
              "dtype");
  const auto bounds = checked_bounds(bounds_in, length);
  const int64_t blocks = static_cast<int64_t>(bounds.size()) - 1;
  AT_DISPATCH_FLOATING_TYPES(dy.scalar_type(), "masked_outer", [&] {
    const Stack<const scalar_t> d(dy), v(x);
    const Stack<scalar_t> o(out);
    scalar_t* dg = diag.data_ptr<scalar_t>();
    const int64_t units = dy.size(0) * d.dirs * d.groups;
    at::parallel_for(0, units * blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t i = task % blocks, u = task / blocks;
        const int64_t g = u % d.groups, r = (u / d.groups) % d.dirs, b = u / (d.groups * d.dirs);
        const int64_t i0 = bounds[i], i1 = bounds[i + 1];
        const bool lower = r == 0;
        const int64_t c0 = lower ? 0 : i0, c1 = lower ? i1 : length;
        scalar_t* rows = o.plane(b, r, g) + i0 * o.ld;
        gemm<scalar_t>(true, false, i1 - i0, c1 - c0, d.rows, d.plane(b, r, g) + i0, d.ld,
                       v.plane(b, r, g) + c0, v.ld, rows + c0, o.ld);
        for (int64_t t = i0; t < i1; ++t) dg[u * length + t] = rows[(t - i0) * o.ld + t];
        zero_off_triangle(rows, o.ld, i0, i1, length, lower);
      }
    });
  });
}

}  // namespace
