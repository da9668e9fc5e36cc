// mmdinomamba native CPU kernels: the SSD scan by its recurrence for heads of 16 channels and 16 states.
// Part of one translation unit (bindings.cpp includes every part in order).
#pragma once

namespace {

// ---------------------------------------------------------------------------------------------
// The SSD scan by its recurrence, for heads of 16 channels with 16 states (bidir_inner.py):
//   h_t = a_t h_{t-1} + B_t (dt_t x_t)^T,   y_t = C_t^T h_t + D x_t,   a_t = exp(dt_t A).
// A head's state (N x P values) lives in N vectors of P lanes (its channels): 16 registers of
// 16 floats with AVX-512, so a token costs 2 N vector FMAs and no (L, L) matrix is built. For
// short sequences of small heads (the demo's 65 tokens) this is several times faster than the
// quadratic form, whose many small GEMMs cost more than their work (docs/results.md).
// Layout of ssd_quadratic.py: x (b, R, h, p, L) with contiguous (p, L) planes, dt (b, R, h, L)
// contiguous, A and D (R, h), B and C (b, R, g, n, L) with contiguous (n, L) planes; direction 0
// (causal) runs t = 0 .. L-1, direction 1 (anti-causal) t = L-1 .. 0. One task per (sample,
// direction, group): the group's B and C and each head's x are transposed token-major into
// cache. The backward pass runs the reverse recurrence of the states' gradient
//   G_t = C_t dy_t^T + a_{t+1} G_{t+1},
// dx_t = dt_t sum_n B_tn G_tn + D dy_t, dB_tn = <G_tn, dt_t x_t>, dC_tn = <h_tn, dy_t>,
// dL/da_t = sum_n <G_tn, h_{t-1,n}>, in blocks of REC_BLOCK tokens taken in reverse: a first
// pass in order keeps each head's state where a block starts, and each block recomputes its
// heads' states from there into cache; the group's heads add their dB and dC terms lane by lane
// in a block-sized buffer, one horizontal sum per (token, state) follows. So the pass touches
// L1-sized buffers only (keeping every token's state and terms, 3 L N P values a head, ran
// 1.3-1.6x slower on an Intel Xeon, whose L2 bandwidth bound it). Each task writes its own
// outputs, so results do not depend on the thread count.

// P lanes of T as one GCC / Clang vector (several registers where P T is wider than one).
template <typename T, int P>
struct Lanes {
  typedef T V __attribute__((vector_size(P * sizeof(T))));
};

template <typename V, typename T>
inline V load_lanes(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}

template <typename V, typename T>
inline void store_lanes(T* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}

// The sum of a vector's lanes (a reduction instruction sequence where there is one: GCC turns
// the plain loop into one scalar addition per lane).
template <typename T, int P, typename V>
inline T lane_sum(const V& v) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float> && P == 16) {
    __m512 r;
    std::memcpy(&r, &v, sizeof r);
    return _mm512_reduce_add_ps(r);
  }
#endif
  T s = v[0];
  for (int i = 1; i < P; ++i) s += v[i];
  return s;
}

// red[n] = sum_p acc[n P + p]: the lane sums of one tile of N x P values, transposed in cache
// and its rows added as vectors.
template <typename T, int N, int P>
inline void tile_lane_sums(const T* acc, T* red) {
  using V = typename Lanes<T, N>::V;
  alignas(CACHE_LINE) T tile[P * N];
  transpose_tiles(acc, int64_t(P), tile, int64_t(N), int64_t(P), int64_t(N));
  V sum = load_lanes<V>(tile);
  for (int p = 1; p < P; ++p) sum += load_lanes<V>(tile + p * N);
  store_lanes(red, sum);
}

constexpr int REC_STATE = 16, REC_CHANNELS = 16;

struct RecurrentShape {
  int64_t batch, dirs, heads, groups, length;
  int64_t per_group() const { return heads / groups; }
  int64_t tasks() const { return batch * dirs * groups; }
};

template <typename T>
struct RecurrentInputs {
  const T *x, *dt, *A, *B, *C, *D;  // D may be null
  Planes px, pb, pc;
};

// The forward pass's per-thread buffers of one task: the group's B and C token-major (L x N), a
// head's x and output token-major (L x P), its decays (L).
template <typename T, int N, int P>
struct RecurrentBuffers {
  Buffer<T> bt, ct, xt, ot, decay;
  explicit RecurrentBuffers(int64_t L)
      : bt(L * N), ct(L * N), xt(L * P), ot(L * P), decay(L) {}
};

// Loads the task's group operands token-major into bt and ct (L x N each) and returns the first
// head's index; `task` in (b, R, g) order.
template <typename T, int N>
int64_t load_group(const RecurrentInputs<T>& in, const RecurrentShape& d, int64_t task, T* bt,
                   T* ct) {
  const int64_t L = d.length, plane = task / d.groups, g = task % d.groups;
  const int64_t unit = plane * d.groups + g;  // (b, R, g) plane of B and C
  transpose_tiles(in.B + in.pb.offset(unit), L, bt, int64_t(N), L, int64_t(N));
  transpose_tiles(in.C + in.pc.offset(unit), L, ct, int64_t(N), L, int64_t(N));
  return plane * d.heads + g * d.per_group();
}

// The (b, R, h) head `unit`'s x token-major into xt (L x P) and its decays into decay (L).
template <typename T, int P>
void load_head(const RecurrentInputs<T>& in, const RecurrentShape& d, int64_t unit, T Ah, T* xt,
               T* decay) {
  const int64_t L = d.length;
  transpose_tiles(in.x + in.px.offset(unit), L, xt, int64_t(P), L, int64_t(P));
  const T* dt = in.dt + unit * L;
  for (int64_t t = 0; t < L; ++t) decay[t] = exp_inline<T>(dt[t] * Ah);
}

template <typename T, int N, int P>
void recurrent_forward_kernel(const RecurrentInputs<T>& in, const RecurrentShape& d, T* y) {
  using V = typename Lanes<T, P>::V;
  const int64_t L = d.length;
  at::parallel_for(0, d.tasks(), 1, [&](int64_t begin, int64_t end) {
    RecurrentBuffers<T, N, P> buf(L);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t first = load_group<T, N>(in, d, task, buf.bt.data(), buf.ct.data());
      const int64_t r = (task / d.groups) % d.dirs;
      for (int64_t unit = first; unit < first + d.per_group(); ++unit) {
        const int64_t h = unit % d.heads;
        const T Ah = in.A[r * d.heads + h], Dh = in.D ? in.D[r * d.heads + h] : T(0);
        load_head<T, P>(in, d, unit, Ah, buf.xt.data(), buf.decay.data());
        const T* dt = in.dt + unit * L;
        V state[N];
        for (int n = 0; n < N; ++n) state[n] = V{};
        for (int64_t s = 0; s < L; ++s) {
          const int64_t t = r == 0 ? s : L - 1 - s;
          const T a = buf.decay[t];
          const V xv = load_lanes<V>(&buf.xt[t * P]);
          const V xd = xv * dt[t];
          const T* bn = &buf.bt[t * N];
          const T* cn = &buf.ct[t * N];
          V yv = xv * Dh;
#pragma GCC unroll 16
          for (int n = 0; n < N; ++n) {
            state[n] = state[n] * a + xd * bn[n];
            yv += state[n] * cn[n];
          }
          store_lanes(&buf.ot[t * P], yv);
        }
        transpose_tiles(buf.ot.data(), int64_t(P), y + unit * P * L, L, int64_t(P), L);
      }
    }
  });
}

template <typename T>
struct RecurrentGrads {
  T *dx, *ddt, *dB, *dC;
  double *dA, *dD;  // (b, R, h) parts, summed over the batch by the caller
};

// Tokens per block of the backward pass: the block's dB / dC sums and states stay in L1.
constexpr int64_t REC_BLOCK = 4;

template <typename T, int N, int P>
void recurrent_backward_kernel(const RecurrentInputs<T>& in, const RecurrentShape& d,
                               const T* dy, const Planes& pdy, const RecurrentGrads<T>& g) {
  using V = typename Lanes<T, P>::V;
  constexpr int64_t TILE = N * P, Q = REC_BLOCK;
  const int64_t L = d.length, H = d.per_group(), blocks = (L + Q - 1) / Q;
  at::parallel_for(0, d.tasks(), 1, [&](int64_t begin, int64_t end) {
    // the group's B and C, every head's x, dy, dx (token-major) and decays; each head's state
    // at the start of every block (in processing order) and its state gradient between blocks;
    // one block's states of a head and the group's dB / dC terms of its tokens, lane by lane;
    // their lane sums
    Buffer<T> bt(L * N), ct(L * N), xs(H * L * P), dys(H * L * P), dxs(H * L * P), decays(H * L);
    Buffer<T> starts(H * blocks * TILE), grads(H * TILE), block(Q * TILE);
    Buffer<T> accB(Q * TILE), accC(Q * TILE), redB(L * N), redC(L * N);
    std::vector<T> a_next(H);
    std::vector<double> dA(H), dD(H);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t first = load_group<T, N>(in, d, task, bt.data(), ct.data());
      const int64_t r = (task / d.groups) % d.dirs;
      const auto token = [&](int64_t s) { return r == 0 ? s : L - 1 - s; };
      // pass 1, in order: each head's states at the blocks' starts, and dD
      for (int64_t j = 0; j < H; ++j) {
        const int64_t unit = first + j, h = unit % d.heads;
        T* xt = &xs[j * L * P];
        T* dyt = &dys[j * L * P];
        load_head<T, P>(in, d, unit, in.A[r * d.heads + h], xt, &decays[j * L]);
        transpose_tiles(dy + pdy.offset(unit), L, dyt, int64_t(P), L, int64_t(P));
        const T* dt = in.dt + unit * L;
        V state[N];
        for (int n = 0; n < N; ++n) state[n] = V{};
        double dDh = 0;
        for (int64_t s = 0; s < L; ++s) {
          if (s % Q == 0) {
            T* start = &starts[(j * blocks + s / Q) * TILE];
            for (int n = 0; n < N; ++n) store_lanes(start + n * P, state[n]);
          }
          const int64_t t = token(s);
          const T a = decays[j * L + t];
          const V xv = load_lanes<V>(xt + t * P);
          const V xd = xv * dt[t];
          const T* bn = &bt[t * N];
#pragma GCC unroll 16
          for (int n = 0; n < N; ++n) state[n] = state[n] * a + xd * bn[n];
          dDh += double(lane_sum<T, P>(xv * load_lanes<V>(dyt + t * P)));
        }
        dD[j] = dDh;
        dA[j] = 0;
        a_next[j] = 0;
        std::fill(&grads[j * TILE], &grads[(j + 1) * TILE], T(0));
      }
      // pass 2, the blocks in reverse: per head its block's states again (dC), then the reverse
      // recurrence of their gradient G_t (dB, dx, ddt, dL/da_t = sum_n <G_tn, h_{t-1,n}>)
      for (int64_t k = blocks - 1; k >= 0; --k) {
        const int64_t s0 = k * Q, s1 = std::min(L, s0 + Q);
        std::fill(accB.begin(), accB.end(), T(0));
        std::fill(accC.begin(), accC.end(), T(0));
        for (int64_t j = 0; j < H; ++j) {
          const int64_t unit = first + j, h = unit % d.heads;
          const T Ah = in.A[r * d.heads + h], Dh = in.D ? in.D[r * d.heads + h] : T(0);
          const T* dt = in.dt + unit * L;
          const T* xt = &xs[j * L * P];
          const T* dyt = &dys[j * L * P];
          const T* start = &starts[(j * blocks + k) * TILE];
          {
            V state[N];
            for (int n = 0; n < N; ++n) state[n] = load_lanes<V>(start + n * P);
            for (int64_t s = s0; s < s1; ++s) {
              const int64_t t = token(s);
              const T a = decays[j * L + t];
              const V xd = load_lanes<V>(xt + t * P) * dt[t];
              const V dyv = load_lanes<V>(dyt + t * P);
              const T* bn = &bt[t * N];
              T* kept = &block[(s - s0) * TILE];
              T* ac = &accC[(s - s0) * TILE];
#pragma GCC unroll 16
              for (int n = 0; n < N; ++n) {
                state[n] = state[n] * a + xd * bn[n];
                store_lanes(kept + n * P, state[n]);
                store_lanes(ac + n * P, load_lanes<V>(ac + n * P) + state[n] * dyv);
              }
            }
          }
          V grad[N];
          T* gj = &grads[j * TILE];
          for (int n = 0; n < N; ++n) grad[n] = load_lanes<V>(gj + n * P);
          T an = a_next[j];
          double dAh = dA[j];
          T* ddt = g.ddt + unit * L;
          T* dxt = &dxs[j * L * P];
          for (int64_t s = s1 - 1; s >= s0; --s) {
            const int64_t t = token(s);
            const V dyv = load_lanes<V>(dyt + t * P);
            const V xv = load_lanes<V>(xt + t * P);
            const V xd = xv * dt[t];
            const T* bn = &bt[t * N];
            const T* cn = &ct[t * N];
            const T* before = s > s0 ? &block[(s - 1 - s0) * TILE] : start;
            T* ab = &accB[(s - s0) * TILE];
            V v = V{}, q = V{};
#pragma GCC unroll 16
            for (int n = 0; n < N; ++n) {
              grad[n] = grad[n] * an + dyv * cn[n];
              v += grad[n] * bn[n];
              q += grad[n] * load_lanes<V>(before + n * P);
              store_lanes(ab + n * P, load_lanes<V>(ab + n * P) + grad[n] * xd);
            }
            store_lanes(dxt + t * P, v * dt[t] + dyv * Dh);
            const T a = decays[j * L + t], da = lane_sum<T, P>(q);
            ddt[t] = lane_sum<T, P>(v * xv) + Ah * a * da;
            dAh += double(dt[t]) * double(a) * double(da);
            an = a;
          }
          for (int n = 0; n < N; ++n) store_lanes(gj + n * P, grad[n]);
          a_next[j] = an;
          dA[j] = dAh;
        }
        for (int64_t s = s0; s < s1; ++s) {
          tile_lane_sums<T, N, P>(&accB[(s - s0) * TILE], &redB[token(s) * N]);
          tile_lane_sums<T, N, P>(&accC[(s - s0) * TILE], &redC[token(s) * N]);
        }
      }
      for (int64_t j = 0; j < H; ++j) {
        const int64_t unit = first + j;
        transpose_tiles(&dxs[j * L * P], int64_t(P), g.dx + unit * P * L, L, int64_t(P), L);
        g.dA[unit] = dA[j];
        g.dD[unit] = dD[j];
      }
      // the group's dB and dC: token-major, one transpose into (n, L)
      transpose_tiles(redB.data(), int64_t(N), g.dB + task * N * L, L, int64_t(N), L);
      transpose_tiles(redC.data(), int64_t(N), g.dC + task * N * L, L, int64_t(N), L);
    }
  });
}

RecurrentShape recurrent_shape(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                               const at::Tensor& B, const at::Tensor& C,
                               const std::optional<at::Tensor>& D) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 5 &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble),
              "recurrent scan: x must be a float32 or float64 (b, R, h, p, L) CPU tensor, got ",
              x.sizes(), " ", x.scalar_type());
  TORCH_CHECK(x.size(3) == REC_CHANNELS && B.dim() == 5 && B.size(3) == REC_STATE,
              "recurrent scan: heads of ", REC_CHANNELS, " channels with ", REC_STATE,
              " states only, got x ", x.sizes(), " and B ", B.sizes());
  check_planes(x, x, "x");
  const RecurrentShape d{x.size(0), x.size(1), x.size(2), B.size(2), x.size(4)};
  TORCH_CHECK(d.dirs == 1 || d.dirs == 2, "recurrent scan: 1 or 2 directions, got ", d.dirs);
  TORCH_CHECK(d.groups >= 1 && d.heads % d.groups == 0,
              "recurrent scan: the heads (", d.heads, ") must split into the groups (", d.groups,
              ")");
  for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{B, "B"}, {C, "C"}})
    TORCH_CHECK(t.sizes() == at::IntArrayRef({d.batch, d.dirs, d.groups, REC_STATE, d.length}) &&
                    t.scalar_type() == x.scalar_type() && contiguous_planes(t),
                "recurrent scan: ", name, " must be (", d.batch, ", ", d.dirs, ", ", d.groups,
                ", ", REC_STATE, ", ", d.length, ") of x's dtype with contiguous (n, L) planes, "
                "got ", t.sizes(), " with strides ", t.strides(), ", ", t.scalar_type());
  check_tokens(dt, x, "dt");
  for (const at::Tensor* t : {&A, D ? &*D : nullptr}) {
    if (t == nullptr) continue;
    TORCH_CHECK(t->sizes() == at::IntArrayRef({d.dirs, d.heads}) && t->is_contiguous() &&
                    t->scalar_type() == x.scalar_type(),
                "recurrent scan: A and D must be contiguous (", d.dirs, ", ", d.heads,
                ") tensors of x's dtype, got ", t->sizes(), " ", t->scalar_type());
  }
  return d;
}

template <typename T>
RecurrentInputs<T> recurrent_inputs(const at::Tensor& x, const at::Tensor& dt,
                                    const at::Tensor& A, const at::Tensor& B,
                                    const at::Tensor& C, const std::optional<at::Tensor>& D) {
  return {x.data_ptr<T>(), dt.data_ptr<T>(), A.data_ptr<T>(), B.data_ptr<T>(), C.data_ptr<T>(),
          D ? D->data_ptr<T>() : nullptr, Planes(x), Planes(B), Planes(C)};
}

at::Tensor recurrent_scan_forward(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                                  const at::Tensor& B, const at::Tensor& C,
                                  const std::optional<at::Tensor>& D) {
  const RecurrentShape d = recurrent_shape(x, dt, A, B, C, D);
  auto y = at::empty(x.sizes(), x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "recurrent_scan_forward", [&] {
    recurrent_forward_kernel<scalar_t, REC_STATE, REC_CHANNELS>(
        recurrent_inputs<scalar_t>(x, dt, A, B, C, D), d, y.data_ptr<scalar_t>());
  });
  return y;
}

std::vector<at::Tensor> recurrent_scan_backward(const at::Tensor& dy, const at::Tensor& x,
                                                const at::Tensor& dt, const at::Tensor& A,
                                                const at::Tensor& B, const at::Tensor& C,
                                                const std::optional<at::Tensor>& D) {
  const RecurrentShape d = recurrent_shape(x, dt, A, B, C, D);
  check_planes(dy, x, "dy");
  auto dx = at::empty(x.sizes(), x.options()), ddt = at::empty(dt.sizes(), dt.options());
  auto dB = at::empty(B.sizes(), B.options()), dC = at::empty(C.sizes(), C.options());
  auto wide = x.options().dtype(at::kDouble);
  auto dA = at::empty({d.batch, d.dirs, d.heads}, wide), dD = at::empty_like(dA);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "recurrent_scan_backward", [&] {
    RecurrentGrads<scalar_t> g{dx.data_ptr<scalar_t>(), ddt.data_ptr<scalar_t>(),
                               dB.data_ptr<scalar_t>(), dC.data_ptr<scalar_t>(),
                               dA.data_ptr<double>(), dD.data_ptr<double>()};
    recurrent_backward_kernel<scalar_t, REC_STATE, REC_CHANNELS>(
        recurrent_inputs<scalar_t>(x, dt, A, B, C, D), d, dy.data_ptr<scalar_t>(), Planes(dy),
        g);
  });
  return {dx, ddt, dA.sum(0).to(x.scalar_type()), dB, dC, dD.sum(0).to(x.scalar_type())};
}

}  // namespace
