// mmdinomamba native CPU kernels: the chunked SSD scan, forward and backward.
// Part of one translation unit (bindings.cpp includes every part in order).
#pragma once

namespace {

// ---------------------------------------------------------------------------------------------
// The chunked SSD scan: the block decomposition of the reference ssd_chunked.py (chunks of Q
// tokens, s the chunk-local cumulative sum of a = dt A, H the state entering a chunk), and its
// backward pass by hand: with W_ij = (C_i . B_j) exp(s_i - s_j) dt_j and G = dy x^T o W,
// da_k = sum_{j < k <= i} G_ij summed directly (row minus column sums cancel for strong decays);
// y_i += exp(s_i) C_i H and H_out = exp(s_Q) H + sum_j exp(s_Q - s_j) dt_j B_j x_j^T are
// reversed chunk by chunk; finally ddt += da A and dA = sum da dt. A work unit is one
// (sample, group, slice of the group's heads) and runs the whole sequence chunk by chunk, every
// temporary a few KB in cache: per chunk one C B^T, per head the (q, q) weights of the diagonal
// block built in place (no factored form, no strongly-decaying-head special case: a chunk's
// weights cost q^2 exponentials whatever the decay), the state products with the unit's heads
// side by side as GEMM columns (x, y, dx and dy are read and written in place, rows of h * p),
// and the element-wise terms in the loops that need them. The units run in parallel, each GEMM
// single-threaded; a sample and group are split into head slices only when there are fewer of
// them than threads (the slices' gradients of B and C are then summed afterwards, so their
// rounding, as that of PyTorch's own reductions, follows the thread count in that case). The
// forward pass keeps the state entering each chunk for the backward pass, in pieces of
// consecutive chunks (b, chunks of the piece, g, n, r * p) of at most state_piece_bytes each
// (unless one chunk is larger): glibc's malloc hands blocks above 32 MiB straight to mmap, so
// one large buffer (50 MiB for 24 heads of 64 at L = 4096) would be fresh pages, faulted in and
// zeroed by the kernel on every call (more than half of the forward pass's time at two threads).
constexpr int64_t state_piece_bytes = 16 << 20;

struct ScanShape {
  int64_t batch, length, heads, headdim, groups, state, chunk, chunks, slices;

  int64_t per_group() const { return heads / groups; }
  int64_t units() const { return batch * groups * slices; }
};

// Sample b, group g and the group's heads [h0, h1) (first global head: head0) of unit u.
struct ScanUnit {
  int64_t b, g, slice, h0, h1, head0;

  ScanUnit(const ScanShape& d, int64_t u) {
    const int64_t r = d.per_group();
    b = u / (d.groups * d.slices);
    g = (u / d.slices) % d.groups;
    slice = u % d.slices;
    h0 = slice * r / d.slices;
    h1 = (slice + 1) * r / d.slices;
    head0 = g * r + h0;
  }

  int64_t heads() const { return h1 - h0; }
};

// The states entering the chunks, kept in pieces of `per` chunks (see above).
template <typename T>
struct StatePieces {
  std::vector<T*> data;
  int64_t per, chunks, batch, groups, size;  // size: n * r * p, one (sample, chunk, group)

  T* at(int64_t b, int64_t k, int64_t g) const {
    const int64_t piece = k / per, len = std::min(per, chunks - piece * per);
    return data[piece] + ((b * len + k % per) * groups + g) * size;
  }
};

// exp of a decay exponent clamped to [-60, 0] (as the quadratic form clamps its wide heads).
template <typename T>
inline T scan_decay(double e) {
  return exp_inline<T>(static_cast<T>(std::min(std::max(e, -60.0), 0.0)));
}

// The chunk's cumulative sums s (double, [hh * Q + i]) and its step sizes dtc ([hh * Q + i])
// of the unit's heads, from dt rows of `heads` values.
template <typename T>
void chunk_sums(const T* dtk, const T* A, int64_t heads, int64_t head0, int64_t nh, int64_t q,
                int64_t Q, double* s, T* dtc) {
  for (int64_t hh = 0; hh < nh; ++hh) {
    const double a = static_cast<double>(A[head0 + hh]);
    double acc = 0;
    for (int64_t i = 0; i < q; ++i) {
      const T d = dtk[i * heads + head0 + hh];
      dtc[hh * Q + i] = d;
      acc += static_cast<double>(d) * a;
      s[hh * Q + i] = acc;
    }
  }
}

// The diagonal block's weights W[i, j] = cb[i, j] exp(s_i - s_j) dt_j (j <= i), 0 above
// (q x q, row stride Q), and with E (the backward pass) their decays exp(s_i - s_j) (j <= i).
template <typename T>
void chunk_weights(const T* cb, const double* s, const T* dtc, int64_t q, int64_t Q, T* W,
                   T* E = nullptr) {
  for (int64_t i = 0; i < q; ++i) {
    T* w = W + i * Q;
    const T* c = cb + i * Q;
    if (E == nullptr) {
      for (int64_t j = 0; j <= i; ++j) w[j] = c[j] * scan_decay<T>(s[i] - s[j]) * dtc[j];
    } else {
      T* e = E + i * Q;
      for (int64_t j = 0; j <= i; ++j) {
        e[j] = scan_decay<T>(s[i] - s[j]);
        w[j] = c[j] * e[j] * dtc[j];
      }
    }
    std::fill(w + i + 1, w + q, T(0));
  }
}

template <typename T>
struct ScanTensors {
  const T *x, *dt, *A, *B, *C, *D;  // D: nullptr without skip weights
};

template <typename T>
void chunk_scan_forward_kernel(const ScanTensors<T>& in, const ScanShape& d, T* y,
                               const StatePieces<T>* states) {
  const int64_t Q = d.chunk, n = d.state, p = d.headdim, h = d.heads, rp = d.per_group() * p;
  const int64_t ldx = h * p, ldbc = d.groups * n;
  at::parallel_for(0, d.units(), 1, [&](int64_t begin, int64_t end) {
    const int64_t cols_max = (d.per_group() + d.slices - 1) / d.slices * p;
    Buffer<double> s(cols_max / p * Q);
    Buffer<T> dtc(s.size()), cb(Q * Q), W(Q * Q), H(n * cols_max), xs(Q * cols_max);
    for (int64_t u = begin; u < end; ++u) {
      const ScanUnit w(d, u);
      const int64_t nh = w.heads(), cols = nh * p;
      std::fill(H.begin(), H.end(), T(0));
      for (int64_t k = 0; k < d.chunks; ++k) {
        const int64_t t0 = k * Q, q = std::min(Q, d.length - t0);
        const int64_t row = w.b * d.length + t0;
        const T* xk = in.x + row * ldx + w.head0 * p;
        const T* Bk = in.B + row * ldbc + w.g * n;
        const T* Ck = in.C + row * ldbc + w.g * n;
        T* yk = y + row * ldx + w.head0 * p;
        chunk_sums(in.dt + row * h, in.A, h, w.head0, nh, q, Q, s.data(), dtc.data());
        if (states != nullptr) {
          T* st = states->at(w.b, k, w.g) + w.h0 * p;
          for (int64_t i = 0; i < n; ++i) std::copy_n(H.data() + i * cols, cols, st + i * rp);
        }
        gemm<T>(false, true, q, q, n, Ck, ldbc, Bk, ldbc, cb.data(), Q);
        if (k > 0) {  // y_i = exp(s_i) C_i H (the state is zero before the first chunk)
          gemm<T>(false, false, q, cols, n, Ck, ldbc, H.data(), cols, yk, ldx);
          for (int64_t i = 0; i < q; ++i)
            for (int64_t hh = 0; hh < nh; ++hh) {
              const T e = scan_decay<T>(s[hh * Q + i]);
              T* yi = yk + i * ldx + hh * p;
              for (int64_t c = 0; c < p; ++c) yi[c] *= e;
            }
        }
        for (int64_t hh = 0; hh < nh; ++hh) {  // + the diagonal block
          chunk_weights(cb.data(), s.data() + hh * Q, dtc.data() + hh * Q, q, Q, W.data());
          gemm<T>(false, false, q, p, q, W.data(), Q, xk + hh * p, ldx, yk + hh * p, ldx, k > 0);
          if (in.D != nullptr) {
            const T dd = in.D[w.head0 + hh];
            for (int64_t i = 0; i < q; ++i) {
              T* yi = yk + i * ldx + hh * p;
              const T* xi = xk + i * ldx + hh * p;
              for (int64_t c = 0; c < p; ++c) yi[c] += dd * xi[c];
            }
          }
        }
        if (k + 1 == d.chunks) break;
        // H <- exp(s_Q) H + B^T (exp(s_Q - s_j) dt_j x_j)
        for (int64_t hh = 0; hh < nh; ++hh) {
          const double* sh = s.data() + hh * Q;
          const T e = scan_decay<T>(sh[q - 1]);
          for (int64_t i = 0; i < n; ++i) {
            T* hi = H.data() + i * cols + hh * p;
            for (int64_t c = 0; c < p; ++c) hi[c] *= e;
          }
          for (int64_t j = 0; j < q; ++j) {
            const T coef = scan_decay<T>(sh[q - 1] - sh[j]) * dtc[hh * Q + j];
            const T* xj = xk + j * ldx + hh * p;
            T* o = xs.data() + j * cols + hh * p;
            for (int64_t c = 0; c < p; ++c) o[c] = coef * xj[c];
          }
        }
        gemm<T>(true, false, n, cols, q, Bk, ldbc, xs.data(), cols, H.data(), cols, true);
      }
    }
  });
}

template <typename T>
struct ScanGrads {
  T *dx, *ddt, *dB, *dC;  // dB, dC: (slices, b, L, g, n)
  double *dA, *dD;        // (b, h)
};

template <typename T>
void chunk_scan_backward_kernel(const ScanTensors<T>& in, const ScanShape& d, const T* dy,
                                const StatePieces<T>& states, const ScanGrads<T>& out) {
  const int64_t Q = d.chunk, n = d.state, p = d.headdim, h = d.heads, rp = d.per_group() * p;
  const int64_t ldx = h * p, ldbc = d.groups * n;
  at::parallel_for(0, d.units(), 1, [&](int64_t begin, int64_t end) {
    const int64_t nh_max = (d.per_group() + d.slices - 1) / d.slices, cols_max = nh_max * p;
    Buffer<double> s(nh_max * Q), da(nh_max * Q), dsi(nh_max * Q), cs(nh_max * Q),
        ddt(nh_max * Q), strad(Q), ds_last(nh_max);
    Buffer<T> dtc(nh_max * Q), cb(Q * Q), W(Q * Q), E(Q * Q), dW(Q * Q), dcb(Q * Q), M(Q * n),
        dCl(Q * n), dBl(Q * n), dHn(n * cols_max), dHl(n * cols_max), dys(Q * cols_max),
        Mb(Q * cols_max), xs(Q * cols_max);
    for (int64_t u = begin; u < end; ++u) {
      const ScanUnit w(d, u);
      const int64_t nh = w.heads(), cols = nh * p;
      double* dA = out.dA + w.b * h + w.head0;
      double* dD = out.dD + w.b * h + w.head0;
      for (int64_t k = d.chunks - 1; k >= 0; --k) {
        const int64_t t0 = k * Q, q = std::min(Q, d.length - t0);
        const int64_t row = w.b * d.length + t0;
        const bool has_state = k > 0, later = k + 1 < d.chunks;  // later: dHn is not zero
        const T* xk = in.x + row * ldx + w.head0 * p;
        const T* dyk = dy + row * ldx + w.head0 * p;
        T* dxk = out.dx + row * ldx + w.head0 * p;
        const T* Bk = in.B + row * ldbc + w.g * n;
        const T* Ck = in.C + row * ldbc + w.g * n;
        const int64_t part = ((w.slice * d.batch + w.b) * d.length + t0) * ldbc + w.g * n;
        const T* H = states.at(w.b, k, w.g) + w.h0 * p;
        chunk_sums(in.dt + row * h, in.A, h, w.head0, nh, q, Q, s.data(), dtc.data());
        gemm<T>(false, true, q, q, n, Ck, ldbc, Bk, ldbc, cb.data(), Q);
        std::fill(da.begin(), da.end(), 0.0);
        std::fill(ddt.begin(), ddt.end(), 0.0);
        std::fill(dcb.begin(), dcb.end(), T(0));
        // the state's output terms y_i += exp(s_i) C_i H: dC, ds_i and dH
        if (has_state) {
          for (int64_t i = 0; i < q; ++i)
            for (int64_t hh = 0; hh < nh; ++hh) {
              const T e = scan_decay<T>(s[hh * Q + i]);
              const T* g = dyk + i * ldx + hh * p;
              T* o = dys.data() + i * cols + hh * p;
              for (int64_t c = 0; c < p; ++c) o[c] = e * g[c];
            }
          for (int64_t hh = 0; hh < nh; ++hh) {  // per head: M = dy_s H^T gives ds_i too
            gemm<T>(false, true, q, n, p, dys.data() + hh * p, cols, H + hh * p, rp, M.data(), n);
            for (int64_t i = 0; i < q; ++i) {
              const T* ci = Ck + i * ldbc;
              const T* mi = M.data() + i * n;
              T* dci = dCl.data() + i * n;
              T dot = 0;
              for (int64_t j = 0; j < n; ++j) {
                dot += ci[j] * mi[j];
                dci[j] = hh ? dci[j] + mi[j] : mi[j];
              }
              dsi[hh * Q + i] = dot;
            }
          }
          gemm<T>(true, false, n, cols, q, Ck, ldbc, dys.data(), cols, dHl.data(), cols);
        }
        // the state passed on, H_out = exp(s_Q) H + sum_j exp(s_Q - s_j) dt_j B_j x_j^T, with
        // dH_out = dHn: dx, dB, ddt and the decays' gradients
        if (later) {
          gemm<T>(false, false, q, cols, n, Bk, ldbc, dHn.data(), cols, Mb.data(), cols);
          for (int64_t hh = 0; hh < nh; ++hh) {
            const double* sh = s.data() + hh * Q;
            for (int64_t j = 0; j < q; ++j) {
              const T e = scan_decay<T>(sh[q - 1] - sh[j]), coef = e * dtc[hh * Q + j];
              const T* xj = xk + j * ldx + hh * p;
              T* mj = Mb.data() + j * cols + hh * p;
              T* o = xs.data() + j * cols + hh * p;
              T dot = 0;
              for (int64_t c = 0; c < p; ++c) {
                dot += mj[c] * xj[c];
                o[c] = coef * xj[c];
                mj[c] *= coef;
              }
              ddt[hh * Q + j] += static_cast<double>(e) * dot;
              cs[hh * Q + j] = static_cast<double>(coef) * dot;
            }
            double sum = 0;
            if (has_state)
              for (int64_t i = 0; i < n; ++i) {
                const T* hi = H + i * rp + hh * p;
                const T* gi = dHn.data() + i * cols + hh * p;
                T dot = 0;
                for (int64_t c = 0; c < p; ++c) dot += hi[c] * gi[c];
                sum += dot;
              }
            ds_last[hh] = sum * static_cast<double>(scan_decay<T>(sh[q - 1]));
          }
          gemm<T>(false, true, q, n, cols, xs.data(), cols, dHn.data(), cols, dBl.data(), n);
        }
        if (has_state) {  // the gradient w.r.t. the state leaving chunk k - 1
          if (!later) std::copy_n(dHl.data(), n * cols, dHn.data());
          for (int64_t hh = 0; later && hh < nh; ++hh) {
            const T e = scan_decay<T>(s[hh * Q + q - 1]);
            for (int64_t i = 0; i < n; ++i) {
              T* g = dHn.data() + i * cols + hh * p;
              const T* l = dHl.data() + i * cols + hh * p;
              for (int64_t c = 0; c < p; ++c) g[c] = e * g[c] + l[c];
            }
          }
        }
        // the diagonal block, per head: dx = W^T dy, dW = dy x^T
        for (int64_t hh = 0; hh < nh; ++hh) {
          const double* sh = s.data() + hh * Q;
          const T* dth = dtc.data() + hh * Q;
          chunk_weights(cb.data(), sh, dth, q, Q, W.data(), E.data());
          gemm<T>(true, false, q, p, q, W.data(), Q, dyk + hh * p, ldx, dxk + hh * p, ldx);
          gemm<T>(false, true, q, q, p, dyk + hh * p, ldx, xk + hh * p, ldx, dW.data(), Q);
          double trace = 0;
          std::fill(strad.begin(), strad.end(), 0.0);
          double* ddth = ddt.data() + hh * Q;
          for (int64_t i = 0; i < q; ++i) {
            const T* dwi = dW.data() + i * Q;
            const T* cbi = cb.data() + i * Q;
            const T* ei = E.data() + i * Q;
            T* dcbi = dcb.data() + i * Q;
            trace += dwi[i];
            double prefix = 0;  // sum_{j <= m} G_ij: the pairs (i, j) whose decay holds a_{m+1}
            for (int64_t j = 0; j <= i; ++j) {
              const T v = dwi[j] * ei[j];
              dcbi[j] += v * dth[j];
              const T vc = v * cbi[j];
              ddth[j] += vc;
              if (j < i) {
                prefix += static_cast<double>(vc * dth[j]);
                strad[j] += prefix;
              }
            }
          }
          dD[hh] += trace;
          double* dah = da.data() + hh * Q;
          for (int64_t m = 0; m + 1 < q; ++m) dah[m + 1] += strad[m];
        }
        // the decays' gradients da_k, then ddt_k += da_k A and dA += da_k dt_k
        for (int64_t hh = 0; hh < nh; ++hh) {
          double* dah = da.data() + hh * Q;
          if (has_state) {  // s_i = sum_{k <= i} a_k
            double acc = 0;
            for (int64_t i = q - 1; i >= 0; --i) dah[i] += (acc += dsi[hh * Q + i]);
          }
          if (later) {  // s_Q - s_j = sum_{k > j} a_k; s_Q = sum_k a_k
            double acc = 0;
            for (int64_t i = 0; i < q; ++i) {
              dah[i] += acc + ds_last[hh];
              acc += cs[hh * Q + i];
            }
          }
          const double a = static_cast<double>(in.A[w.head0 + hh]);
          double sum = 0;
          for (int64_t i = 0; i < q; ++i) {
            const double dti = static_cast<double>(dtc[hh * Q + i]);
            sum += dah[i] * dti;
            out.ddt[(row + i) * h + w.head0 + hh] = static_cast<T>(ddt[hh * Q + i] + dah[i] * a);
          }
          dA[hh] += sum;
          const T dd = in.D != nullptr ? in.D[w.head0 + hh] : T(0);
          for (int64_t i = 0; i < q; ++i) {
            T* dxi = dxk + i * ldx + hh * p;
            const T* gi = dyk + i * ldx + hh * p;
            const T* mi = Mb.data() + i * cols + hh * p;
            if (later)
              for (int64_t c = 0; c < p; ++c) dxi[c] += mi[c] + dd * gi[c];
            else
              for (int64_t c = 0; c < p; ++c) dxi[c] += dd * gi[c];
          }
        }
        // dC = dcb B (+ the state's), dB = dcb^T C (+ the passed state's)
        T* dCk = out.dC + part;
        T* dBk = out.dB + part;
        gemm<T>(false, false, q, n, q, dcb.data(), Q, Bk, ldbc, dCk, ldbc);
        gemm<T>(true, false, q, n, q, dcb.data(), Q, Ck, ldbc, dBk, ldbc);
        for (int64_t i = 0; i < q; ++i) {
          if (has_state)
            for (int64_t j = 0; j < n; ++j) dCk[i * ldbc + j] += dCl[i * n + j];
          if (later)
            for (int64_t j = 0; j < n; ++j) dBk[i * ldbc + j] += dBl[i * n + j];
        }
      }
    }
  });
}

void check_scan(const at::Tensor& t, const at::Tensor& x, std::vector<int64_t> shape,
                const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == x.scalar_type() && t.is_contiguous() &&
                  t.sizes() == at::IntArrayRef(shape),
              "chunk scan: ", name, " must be a contiguous CPU tensor of x's dtype with shape ",
              at::IntArrayRef(shape), ", got ", t.sizes(), " ", t.scalar_type(),
              t.is_contiguous() ? "" : " (not contiguous)");
}

ScanShape scan_shape(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                     const at::Tensor& B, const at::Tensor& C,
                     const std::optional<at::Tensor>& D, int64_t chunk) {
  TORCH_CHECK(x.dim() == 4 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble),
              "chunk scan: x must be (b, L, h, p) float32 or float64, got ", x.sizes(), " ",
              x.scalar_type());
  TORCH_CHECK(B.dim() == 4 && B.size(2) > 0 && x.size(2) % B.size(2) == 0,
              "chunk scan: B must be (b, L, g, n) with g dividing the heads, got ", B.sizes());
  TORCH_CHECK(chunk >= 1, "chunk scan: chunk must be >= 1, got ", chunk);
  ScanShape d{};
  d.batch = x.size(0), d.length = x.size(1), d.heads = x.size(2), d.headdim = x.size(3);
  d.groups = B.size(2), d.state = B.size(3);
  d.chunk = std::min(chunk, std::max<int64_t>(1, d.length));  // scratch is chunk x chunk
  d.chunks = (d.length + d.chunk - 1) / d.chunk;
  check_scan(x, x, {d.batch, d.length, d.heads, d.headdim}, "x");
  check_scan(dt, x, {d.batch, d.length, d.heads}, "dt");
  check_scan(A, x, {d.heads}, "A");
  check_scan(B, x, {d.batch, d.length, d.groups, d.state}, "B");
  check_scan(C, x, {d.batch, d.length, d.groups, d.state}, "C");
  if (D) check_scan(*D, x, {d.heads}, "D");
  // head slices only when the (sample, group) pairs do not keep every thread busy
  const int64_t pairs = d.batch * d.groups, threads = at::get_num_threads();
  d.slices = pairs >= threads ? 1 : std::min(d.per_group(), (threads + pairs - 1) / pairs);
  return d;
}

template <typename T>
ScanTensors<T> scan_tensors(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                            const at::Tensor& B, const at::Tensor& C,
                            const std::optional<at::Tensor>& D) {
  return {x.data_ptr<T>(), dt.data_ptr<T>(), A.data_ptr<T>(), B.data_ptr<T>(), C.data_ptr<T>(),
          D ? D->data_ptr<T>() : nullptr};
}

// The chunks per piece of the kept states (see state_piece_bytes).
int64_t state_piece_chunks(const ScanShape& d, int64_t element) {
  const int64_t chunk_bytes = d.batch * d.groups * d.state * d.per_group() * d.headdim * element;
  return std::clamp<int64_t>(state_piece_bytes / std::max<int64_t>(1, chunk_bytes), 1,
                             std::max<int64_t>(1, d.chunks));
}

template <typename T>
StatePieces<T> state_pieces(const ScanShape& d, const std::vector<at::Tensor>& pieces,
                            int64_t per) {
  StatePieces<T> st{{}, per, d.chunks, d.batch, d.groups, d.state * d.per_group() * d.headdim};
  for (const auto& t : pieces) st.data.push_back(t.data_ptr<T>());
  return st;
}

std::tuple<at::Tensor, std::vector<at::Tensor>> chunk_scan_forward(
    const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A, const at::Tensor& B,
    const at::Tensor& C, const std::optional<at::Tensor>& D, int64_t chunk, bool keep_states) {
  const ScanShape d = scan_shape(x, dt, A, B, C, D, chunk);
  auto y = at::empty(x.sizes(), x.options());
  std::vector<at::Tensor> pieces;
  const int64_t per = state_piece_chunks(d, x.element_size());
  if (keep_states) {
    for (int64_t k = 0; k < d.chunks; k += per)
      pieces.push_back(at::empty({d.batch, std::min(per, d.chunks - k), d.groups, d.state,
                                  d.per_group() * d.headdim}, x.options()));
  }
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "chunk_scan_forward", [&] {
    const auto st = state_pieces<scalar_t>(d, pieces, per);
    chunk_scan_forward_kernel<scalar_t>(scan_tensors<scalar_t>(x, dt, A, B, C, D), d,
                                        y.data_ptr<scalar_t>(), keep_states ? &st : nullptr);
  });
  return {y, pieces};
}

std::vector<at::Tensor> chunk_scan_backward(const at::Tensor& dy, const at::Tensor& x,
                                            const at::Tensor& dt, const at::Tensor& A,
                                            const at::Tensor& B, const at::Tensor& C,
                                            const std::optional<at::Tensor>& D,
                                            const std::vector<at::Tensor>& states, int64_t chunk) {
  const ScanShape d = scan_shape(x, dt, A, B, C, D, chunk);
  check_scan(dy, x, {d.batch, d.length, d.heads, d.headdim}, "dy");
  // the pieces' length as the forward pass chose it
  const int64_t per = states.empty() || states[0].dim() != 5 ? 0 : states[0].size(1);
  TORCH_CHECK(d.chunks == 0 ? states.empty()
                            : per >= 1 && static_cast<int64_t>(states.size()) ==
                                              (d.chunks + per - 1) / per,
              "chunk scan: the states must be the pieces chunk_scan_forward kept (keep_states) "
              "for these inputs, got ", states.size(), " pieces");
  for (size_t i = 0; i < states.size(); ++i)
    check_scan(states[i], x, {d.batch, std::min(per, d.chunks - static_cast<int64_t>(i) * per),
                              d.groups, d.state, d.per_group() * d.headdim}, "a state piece");
  auto dx = at::empty(x.sizes(), x.options());
  auto ddt = at::empty(dt.sizes(), dt.options());
  auto dB = at::empty({d.slices, d.batch, d.length, d.groups, d.state}, x.options());
  auto dC = at::empty_like(dB);
  auto wide = x.options().dtype(at::kDouble);
  auto dA = at::zeros({d.batch, d.heads}, wide), dD = at::zeros({d.batch, d.heads}, wide);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "chunk_scan_backward", [&] {
    ScanGrads<scalar_t> g{dx.data_ptr<scalar_t>(), ddt.data_ptr<scalar_t>(),
                          dB.data_ptr<scalar_t>(), dC.data_ptr<scalar_t>(),
                          dA.data_ptr<double>(), dD.data_ptr<double>()};
    chunk_scan_backward_kernel<scalar_t>(scan_tensors<scalar_t>(x, dt, A, B, C, D), d,
                                         dy.data_ptr<scalar_t>(),
                                         state_pieces<scalar_t>(d, states, per), g);
  });
  auto sum_slices = [&](const at::Tensor& t) { return d.slices == 1 ? t[0] : t.sum(0); };
  return {dx, ddt, dA.sum(0).to(x.scalar_type()), sum_slices(dB), sum_slices(dC),
          dD.sum(0).to(x.scalar_type())};
}

}  // namespace
