// mmdinomamba native CPU kernels: the Python bindings. The kernels are split by concept into
// the headers below and compiled as this one translation unit (their shared inline helpers
// and templates stay internal; one build, as fast as before the split).
#include "common.h"
#include "conv.h"
#include "merge.h"
#include "scan_pointwise.h"
#include "gemm.h"
#include "wide_fused.h"
#include "products.h"
#include "rms_norm.h"
#include "chunk_scan.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("conv_silu_forward", &conv_silu_forward,
        "both directions' depthwise conv + SiLU: the token-major x (b, L, C) -> (b, 2, C, L)");
  m.def("conv_silu_backward", &conv_silu_backward,
        "gradients of conv_silu_forward for dact given as channel parts (b, 2, C_i, L): writes "
        "the token-major dx (b, L, C), returns [dweight (2, C, K), dbias (2, C)]");
  m.def("merge_forward", &merge_forward,
        "(rmsnorm(y_0 silu(z)) w_0 + rmsnorm(y_1 silu(z)) w_1) / 2 of y (b, 2, d, L) and the "
        "token-major z (b, L, d), written into the token-major out (b, L, d)");
  m.def("merge_backward_scan", &merge_backward_scan,
        "gradients of merge_forward for the token-major dm, with y = ys row + x diag (+ the wide "
        "heads' parts) of the quadratic scan's state rebuilt tile by tile instead of read: writes "
        "dz (b, L, d) (and, if given, merge_forward's output again into out), returns "
        "[dy (b, 2, d, L), dweight (2, d)]");
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
        "token-major raw step sizes (b, L, h), dt_bias and A (2, h), and the factored range");
  m.def("column_products", &column_products,
        "out = a @ m (or a @ m^T) per (sample, direction, group), m zero outside its block "
        "triangle, every block product a task");
  m.def("masked_outer", &masked_outer,
        "out = dy^T @ x per (sample, direction, group) on each direction's strict triangle, "
        "and the full product's diagonal into diag");
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
}
