// mmdinomamba native CPU kernels: token-major <-> channel-major copies.
// Part of one translation unit (bindings.cpp includes every part in order).
#pragma once

namespace {

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

}  // namespace
