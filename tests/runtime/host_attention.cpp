// host/attention.hpp: the flash-style forward, backward and decode kernels
// against a naive reference in double that materialises
// softmax(Q K^T / sqrt(hd) + causal mask) (RoPE applied to q and k first, with
// math::rope_rotate), and against central differences of sum(o * R).
// Sliding windows (Mistral: query s attends to keys s - W < u <= s) of 1, 5,
// 63, 64 (one tile), 65, 66, 70, 100 and >= seq, on sequences that are not a
// multiple of the tile, against the same reference with the window in its mask.
// Also: float within tolerance of double, bit-identical results for 1, 2 and
// 3 workers and any scratch alignment, decode step by step = forward rows
// (with a window: without reading the cache rows outside it), and no write
// outside the declared scratch or the outputs' data elements.
//
// Heap check: built with -DEIGEN_RUNTIME_NO_MALLOC (and without NDEBUG), every
// kernel call runs with Eigen's heap allocation forbidden, so an Eigen product
// that allocated would fail an assertion. The CMake build does not set it.
// sanitizer build at -O1: a sweep of windows and sequence lengths, four times slower at -O0.
#include <catch2/catch.hpp>

#include <headroom/host/attention.hpp>
#include <headroom/math/rope.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

using headroom::host::AttentionDims;
namespace host = headroom::host;
using i64 = std::int64_t;

// RAII: Eigen may not allocate while one exists (only with EIGEN_RUNTIME_NO_MALLOC).
struct NoHeap {
#ifdef EIGEN_RUNTIME_NO_MALLOC
  NoHeap() { Eigen::internal::set_is_malloc_allowed(false); }
  ~NoHeap() { Eigen::internal::set_is_malloc_allowed(true); }
#else
  NoHeap() {}  // user-provided: a guard variable is not "unused"
#endif
};

std::vector<double> randn(i64 n, unsigned seed, double scale = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> x(static_cast<std::size_t>(n));
  for (auto& e : x) e = scale * dist(rng);
  return x;
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double e : x) m = std::max(m, std::abs(e));
  return m;
}

// max |a - b| / max |b|: error relative to the size of the reference
double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double e = 0;
  for (std::size_t i = 0; i < a.size(); ++i) e = std::max(e, std::abs(a[i] - b[i]));
  const double m = max_abs(b);
  return m > 0 ? e / m : e;
}

// ---------------------------------------------------------------------------
// Problems and layouts

struct Case {
  const char* name;
  i64 batch, seq, heads, kv_heads, head_dim;
  bool rope;
  bool fused;    // q | k | v side by side in one (N, Dq + 2 Dkv + pad) buffer (GPT-2's c_attn)
  i64 pad;       // extra elements at the end of each row (separate buffers) or of the fused row
  double qscale; // larger: sharper softmax, the running max moves between key tiles
  i64 window = 0;  // sliding window (0: none)
  AttentionDims dims() const { return AttentionDims{batch, seq, heads, kv_heads, head_dim, rope, 10000.0, {}, window}; }
};

// Dense inputs in double. q: (N, H hd), k, v: (N, KV hd), dout, r: (N, H hd)
struct Inputs {
  std::vector<double> q, k, v, dout;
};

Inputs make_inputs(const Case& c, unsigned seed) {
  const i64 N = c.batch * c.seq;
  return Inputs{randn(N * c.heads * c.head_dim, seed, c.qscale), randn(N * c.kv_heads * c.head_dim, seed + 1),
                randn(N * c.kv_heads * c.head_dim, seed + 2), randn(N * c.heads * c.head_dim, seed + 3)};
}

// q, k, v (or dq, dk, dv) in the case's layout; every element that is not data
// holds `fill` so a test can see that no kernel wrote there.
template <class T>
struct Strided {
  i64 rows, wq, wkv, ldq, ldk, ldv, offq, offk, offv;
  bool fused;
  std::vector<T> a, b, c;  // fused: all in a

  Strided(const Case& cs, T fill) {
    rows = cs.batch * cs.seq;
    wq = cs.heads * cs.head_dim;
    wkv = cs.kv_heads * cs.head_dim;
    fused = cs.fused;
    if (fused) {
      ldq = ldk = ldv = wq + 2 * wkv + cs.pad;
      offq = 0, offk = wq, offv = wq + wkv;
      a.assign(static_cast<std::size_t>(rows * ldq), fill);
    } else {
      ldq = wq + cs.pad, ldk = ldv = wkv + cs.pad;
      offq = offk = offv = 0;
      a.assign(static_cast<std::size_t>(rows * ldq), fill);
      b.assign(static_cast<std::size_t>(rows * ldk), fill);
      c.assign(static_cast<std::size_t>(rows * ldv), fill);
    }
  }
  T* q() { return a.data() + offq; }
  T* k() { return (fused ? a.data() : b.data()) + offk; }
  T* v() { return (fused ? a.data() : c.data()) + offv; }

  static void put(T* dst, i64 ld, const std::vector<double>& x, i64 rows, i64 w) {
    for (i64 n = 0; n < rows; ++n)
      for (i64 j = 0; j < w; ++j) dst[n * ld + j] = static_cast<T>(x[static_cast<std::size_t>(n * w + j)]);
  }
  static std::vector<double> get(const T* src, i64 ld, i64 rows, i64 w) {
    std::vector<double> x(static_cast<std::size_t>(rows * w));
    for (i64 n = 0; n < rows; ++n)
      for (i64 j = 0; j < w; ++j) x[static_cast<std::size_t>(n * w + j)] = static_cast<double>(src[n * ld + j]);
    return x;
  }
  void set(const Inputs& in) {
    put(q(), ldq, in.q, rows, wq);
    put(k(), ldk, in.k, rows, wkv);
    put(v(), ldv, in.v, rows, wkv);
  }
  std::vector<double> gq() { return get(q(), ldq, rows, wq); }
  std::vector<double> gk() { return get(k(), ldk, rows, wkv); }
  std::vector<double> gv() { return get(v(), ldv, rows, wkv); }

  // true when every element outside the data columns still holds `fill` (bitwise)
  bool padding_is(T fill) const {
    auto same = [&](T x) { return std::memcmp(&x, &fill, sizeof(T)) == 0; };
    auto check = [&](const std::vector<T>& buf, i64 ld, const std::vector<std::pair<i64, i64>>& data) {
      for (i64 n = 0; n < rows; ++n)
        for (i64 j = 0; j < ld; ++j) {
          bool in_data = false;
          for (auto [off, w] : data) in_data = in_data || (j >= off && j < off + w);
          if (!in_data && !same(buf[static_cast<std::size_t>(n * ld + j)])) return false;
        }
      return true;
    };
    if (fused) return check(a, ldq, {{offq, wq}, {offk, wkv}, {offv, wkv}});
    return check(a, ldq, {{0, wq}}) && check(b, ldk, {{0, wkv}}) && check(c, ldv, {{0, wkv}});
  }
};

// ---------------------------------------------------------------------------
// The naive reference, in double: rotate, scores, causal softmax, products.
// Query s attends to keys u0(s) .. s: u0 = 0, or with a window W, max(0, s - W + 1).

struct Reference {
  std::vector<double> o, lse, dq, dk, dv;
};

Reference reference(const AttentionDims& d, const Inputs& in) {
  const i64 B = d.batch, S = d.seq, H = d.heads, KV = d.kv_heads, hd = d.head_dim, rep = H / KV;
  const i64 wq = H * hd, wkv = KV * hd;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  Reference r;
  r.o.assign(static_cast<std::size_t>(B * S * wq), 0.0);
  r.lse.assign(static_cast<std::size_t>(B * H * S), 0.0);
  r.dq.assign(r.o.size(), 0.0);
  r.dk.assign(static_cast<std::size_t>(B * S * wkv), 0.0);
  r.dv.assign(r.dk.size(), 0.0);
  auto at = [](const std::vector<double>& x, i64 i) { return x[static_cast<std::size_t>(i)]; };
  for (i64 b = 0; b < B; ++b)
    for (i64 h = 0; h < H; ++h) {
      const i64 g = h / rep;
      // rotated copies: qr, kr: (S, hd); v, dout rows read in place
      std::vector<double> qr(static_cast<std::size_t>(S * hd)), kr(qr.size());
      for (i64 s = 0; s < S; ++s) {
        for (i64 c = 0; c < hd; ++c) {
          qr[static_cast<std::size_t>(s * hd + c)] = at(in.q, (b * S + s) * wq + h * hd + c);
          kr[static_cast<std::size_t>(s * hd + c)] = at(in.k, (b * S + s) * wkv + g * hd + c);
        }
        if (d.rope) {
          headroom::math::rope_rotate(&qr[static_cast<std::size_t>(s * hd)], static_cast<int>(hd), static_cast<int>(s),
                                      d.rope_theta);
          headroom::math::rope_rotate(&kr[static_cast<std::size_t>(s * hd)], static_cast<int>(hd), static_cast<int>(s),
                                      d.rope_theta);
        }
      }
      // the first key of query s's window
      auto u0 = [&](i64 s) { return d.window > 0 ? std::max<i64>(0, s - d.window + 1) : i64(0); };
      // P: (S, S), zero above the diagonal and left of the window
      std::vector<double> P(static_cast<std::size_t>(S * S), 0.0);
      for (i64 s = 0; s < S; ++s) {
        double m = -std::numeric_limits<double>::infinity();
        for (i64 u = u0(s); u <= s; ++u) {
          double x = 0;
          for (i64 c = 0; c < hd; ++c) x += qr[static_cast<std::size_t>(s * hd + c)] * kr[static_cast<std::size_t>(u * hd + c)];
          P[static_cast<std::size_t>(s * S + u)] = x * scale;
          m = std::max(m, x * scale);
        }
        double l = 0;
        for (i64 u = u0(s); u <= s; ++u) l += std::exp(P[static_cast<std::size_t>(s * S + u)] - m);
        for (i64 u = u0(s); u <= s; ++u) {
          double& p = P[static_cast<std::size_t>(s * S + u)];
          p = std::exp(p - m) / l;
        }
        r.lse[static_cast<std::size_t>((b * H + h) * S + s)] = m + std::log(l);
        for (i64 c = 0; c < hd; ++c) {
          double x = 0;
          for (i64 u = u0(s); u <= s; ++u) x += P[static_cast<std::size_t>(s * S + u)] * at(in.v, (b * S + u) * wkv + g * hd + c);
          r.o[static_cast<std::size_t>((b * S + s) * wq + h * hd + c)] = x;
        }
      }
      if (in.dout.empty()) continue;
      // backward: dP = dO V^T, dS = P (dP - rowsum(P dP)), dQr = dS Kr s, dKr = dS^T Qr s, dV = P^T dO
      std::vector<double> dqr(qr.size(), 0.0), dkr(qr.size(), 0.0);
      for (i64 s = 0; s < S; ++s) {
        std::vector<double> dP(static_cast<std::size_t>(s + 1));
        double delta = 0;
        for (i64 u = u0(s); u <= s; ++u) {
          double x = 0;
          for (i64 c = 0; c < hd; ++c)
            x += at(in.dout, (b * S + s) * wq + h * hd + c) * at(in.v, (b * S + u) * wkv + g * hd + c);
          dP[static_cast<std::size_t>(u)] = x;
          delta += P[static_cast<std::size_t>(s * S + u)] * x;
        }
        for (i64 u = u0(s); u <= s; ++u) {
          const double p = P[static_cast<std::size_t>(s * S + u)];
          const double ds = p * (dP[static_cast<std::size_t>(u)] - delta);
          for (i64 c = 0; c < hd; ++c) {
            dqr[static_cast<std::size_t>(s * hd + c)] += ds * kr[static_cast<std::size_t>(u * hd + c)] * scale;
            dkr[static_cast<std::size_t>(u * hd + c)] += ds * qr[static_cast<std::size_t>(s * hd + c)] * scale;
            r.dv[static_cast<std::size_t>((b * S + u) * wkv + g * hd + c)] += p * at(in.dout, (b * S + s) * wq + h * hd + c);
          }
        }
      }
      for (i64 s = 0; s < S; ++s) {
        if (d.rope) {
          headroom::math::rope_rotate(&dqr[static_cast<std::size_t>(s * hd)], static_cast<int>(hd), static_cast<int>(s),
                                      d.rope_theta, true);
          headroom::math::rope_rotate(&dkr[static_cast<std::size_t>(s * hd)], static_cast<int>(hd), static_cast<int>(s),
                                      d.rope_theta, true);
        }
        for (i64 c = 0; c < hd; ++c) {
          r.dq[static_cast<std::size_t>((b * S + s) * wq + h * hd + c)] = dqr[static_cast<std::size_t>(s * hd + c)];
          r.dk[static_cast<std::size_t>((b * S + s) * wkv + g * hd + c)] += dkr[static_cast<std::size_t>(s * hd + c)];
        }
      }
    }
  return r;
}

// ---------------------------------------------------------------------------
// Running the kernels

template <class T>
struct Result {
  std::vector<T> o, lse;           // o: (N, H hd), lse: (B, H, S)
  std::vector<double> dq, dk, dv;  // dense
  bool grad_padding_ok = true;
};

constexpr float sentinel_f = -7.25e30f;
template <class T>
T sentinel() {
  return static_cast<T>(sentinel_f);
}

// Forward (and backward when in.dout is set) with `workers`; the scratch
// pointer is moved `misalign` elements from the vector's start.
template <class T>
Result<T> run(const Case& cs, const Inputs& in, int workers, i64 misalign = 0) {
  const AttentionDims d = cs.dims();
  const i64 N = d.batch * d.seq, wq = d.heads * d.head_dim;
  Strided<T> x(cs, T(0));
  x.set(in);
  Result<T> r;
  r.o.assign(static_cast<std::size_t>(N * wq), std::numeric_limits<T>::quiet_NaN());
  r.lse.assign(static_cast<std::size_t>(d.batch * d.heads * d.seq), std::numeric_limits<T>::quiet_NaN());
  {
    std::vector<T> scratch(static_cast<std::size_t>(host::attention_forward_scratch(d, workers) + misalign), T(0));
    NoHeap guard;
    host::attention_forward<T>(d, x.q(), x.ldq, x.k(), x.ldk, x.v(), x.ldv, r.o.data(), r.lse.data(),
                               scratch.data() + misalign, workers);
  }
  if (in.dout.empty()) return r;
  std::vector<T> dout(in.dout.size());
  for (std::size_t i = 0; i < dout.size(); ++i) dout[i] = static_cast<T>(in.dout[i]);
  Strided<T> g(cs, sentinel<T>());
  // data elements start as NaN: the kernel must overwrite every one
  Strided<T>::put(g.q(), g.ldq, std::vector<double>(static_cast<std::size_t>(N * g.wq), std::nan("")), N, g.wq);
  Strided<T>::put(g.k(), g.ldk, std::vector<double>(static_cast<std::size_t>(N * g.wkv), std::nan("")), N, g.wkv);
  Strided<T>::put(g.v(), g.ldv, std::vector<double>(static_cast<std::size_t>(N * g.wkv), std::nan("")), N, g.wkv);
  {
    std::vector<T> scratch(static_cast<std::size_t>(host::attention_backward_scratch(d, workers) + misalign), T(0));
    NoHeap guard;
    host::attention_backward<T>(d, x.q(), x.ldq, x.k(), x.ldk, x.v(), x.ldv, r.o.data(), r.lse.data(), dout.data(),
                                g.q(), g.ldq, g.k(), g.ldk, g.v(), g.ldv, scratch.data() + misalign, workers);
  }
  r.dq = g.gq();
  r.dk = g.gk();
  r.dv = g.gv();
  r.grad_padding_ok = g.padding_is(sentinel<T>());
  return r;
}

template <class T>
std::vector<double> to_double(const std::vector<T>& x) {
  return std::vector<double>(x.begin(), x.end());
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// seq 1, 5, 64, 70, 128, 130: one row, a partial tile, exact tiles, a partial second/third tile
const Case cases[] = {
    {"mha", 1, 70, 2, 2, 16, false, false, 0, 1.0},
    {"mha rope batch 2", 2, 130, 2, 2, 32, true, false, 0, 1.0},
    {"gqa 4/2 rope", 2, 130, 4, 2, 8, true, false, 0, 1.0},
    {"gqa 4/2 padded rows", 1, 70, 4, 2, 16, false, false, 3, 1.0},
    {"mqa 4/1 rope", 1, 70, 4, 1, 64, true, false, 5, 1.0},
    {"fused qkv (gpt-2)", 2, 130, 3, 3, 16, false, true, 0, 1.0},
    {"fused qkv rope gqa padded", 1, 70, 4, 2, 8, true, true, 2, 1.0},
    {"sharp softmax", 1, 130, 2, 1, 16, true, false, 0, 6.0},
    {"seq 1", 2, 1, 2, 1, 8, true, false, 0, 1.0},
    {"seq 5", 1, 5, 2, 2, 4, true, false, 0, 1.0},
    {"seq 64", 1, 64, 2, 2, 16, true, false, 0, 1.0},
    {"seq 128", 1, 128, 2, 1, 16, false, false, 0, 1.0},
    {"head_dim 2", 1, 70, 2, 1, 2, true, false, 0, 1.0},
    {"head_dim 6", 1, 70, 2, 2, 6, true, false, 1, 1.0},
    {"head_dim 256", 1, 70, 1, 1, 256, true, false, 0, 1.0},
    {"head_dim 5 (odd, no rope)", 1, 70, 2, 1, 5, false, false, 0, 1.0},
};

}  // namespace

namespace {
// A double run's outputs and gradients against the reference, to rounding.
void matches_in_double(const Result<double>& rd, const Reference& ref) {
  CHECK(rel_err(rd.o, ref.o) < 1e-13);
  CHECK(rel_err(rd.lse, ref.lse) < 1e-13);
  CHECK(rel_err(rd.dq, ref.dq) < 1e-13);
  CHECK(rel_err(rd.dk, ref.dk) < 1e-13);
  CHECK(rel_err(rd.dv, ref.dv) < 1e-13);
  CHECK(rd.grad_padding_ok);
}
// A float run's, to float's accumulated rounding.
void matches_in_float(const Result<float>& rf, const Reference& ref) {
  CHECK(rel_err(to_double(rf.o), ref.o) < 1e-5);
  CHECK(rel_err(to_double(rf.lse), ref.lse) < 1e-5);
  CHECK(rel_err(rf.dq, ref.dq) < 1e-5);
  CHECK(rel_err(rf.dk, ref.dk) < 1e-5);
  CHECK(rel_err(rf.dv, ref.dv) < 1e-5);
  CHECK(rf.grad_padding_ok);
}
}  // namespace

// ---------------------------------------------------------------------------

TEST_CASE("host.attention: forward and backward match the naive reference (double and float)", "[host][attention]") {
  for (const Case& cs : cases) {
    INFO("case: " << cs.name);
    const Inputs in = make_inputs(cs, 11);
    const Reference ref = reference(cs.dims(), in);

    const Result<double> rd = run<double>(cs, in, 2);
    matches_in_double(rd, ref);

    const Result<float> rf = run<float>(cs, in, 2);
    matches_in_float(rf, ref);  // measured: <= 1.5e-6 over all cases
  }
}

TEST_CASE("host.attention: a sliding window matches the naive reference with the window in its mask", "[host][attention]") {
  // windows below a tile (1, 5), of one tile (64) and around it (63, 65; 66:
  // the last key of a tile is reached by exactly the first row of the tile
  // after next), not a multiple of it (70, 100), of the whole sequence and
  // past it (= plain causal); sequences of 150 and 200 end in a partial tile;
  // GQA 4 on 2, with and without RoPE. (With a window of 1 every row has one
  // key, so dS = P (dP - delta) = 0: dq and dk are 0, and rel_err compares
  // them as absolute errors.)
  for (const i64 seq : {150, 200}) {
    for (const i64 window : {i64{1}, i64{5}, i64{63}, i64{64}, i64{65}, i64{66}, i64{70}, i64{100}, seq, seq + 37}) {
      for (const bool rope : {false, true}) {
        const Case cs{"window", 1, seq, 4, 2, 16, rope, false, 0, 2.0, window};
        INFO("seq " << seq << ", window " << window << (rope ? ", rope" : ""));
        const Inputs in = make_inputs(cs, 13);
        const Reference ref = reference(cs.dims(), in);

        const Result<double> rd = run<double>(cs, in, 2);
        matches_in_double(rd, ref);

        const Result<float> rf = run<float>(cs, in, 2);
        matches_in_float(rf, ref);

        if (window >= seq) {  // no key is outside any window: the plain causal kernels' bits
          Case causal = cs;
          causal.window = 0;
          const Result<float> rc = run<float>(causal, in, 2);
          CHECK(same_bits(rf.o, rc.o));
          CHECK(same_bits(rf.lse, rc.lse));
          CHECK(same_bits(rf.dq, rc.dq));
          CHECK(same_bits(rf.dk, rc.dk));
          CHECK(same_bits(rf.dv, rc.dv));
        }
      }
    }
  }
  // batch 2, a fused q|k|v with padded rows, MQA
  const Case more[] = {
      {"window 70, batch 2, fused rope gqa padded", 2, 150, 4, 2, 8, true, true, 2, 1.0, 70},
      {"window 33, mqa 4/1, padded rows", 1, 130, 4, 1, 32, false, false, 3, 1.0, 33},
  };
  for (const Case& cs : more) {
    INFO("case: " << cs.name);
    const Inputs in = make_inputs(cs, 17);
    const Reference ref = reference(cs.dims(), in);
    const Result<double> rd = run<double>(cs, in, 3);
    matches_in_double(rd, ref);
  }
}

TEST_CASE("host.attention: backward matches central differences of sum(o * R)", "[host][attention]") {
  // tiny: every element; two tiles (seq 70): a sample of elements; the same
  // with sliding windows (3; 5, which straddles the tiles' edge at 64)
  const Case tiny{"tiny", 2, 7, 2, 1, 4, true, true, 1, 1.0};
  const Case two_tiles{"two tiles", 1, 70, 2, 1, 4, true, false, 0, 1.0};
  const Case tiny_window{"tiny, window 3", 2, 7, 2, 1, 4, true, true, 1, 1.0, 3};
  const Case two_tiles_window{"two tiles, window 5", 1, 70, 2, 1, 4, true, false, 0, 1.0, 5};
  for (const Case* cs : {&tiny, &two_tiles, &tiny_window, &two_tiles_window}) {
    INFO("case: " << cs->name);
    Inputs in = make_inputs(*cs, 5);  // dout plays R
    const Result<double> grads = run<double>(*cs, in, 1);
    auto loss = [&](const Inputs& x) {
      const Result<double> f = run<double>(*cs, Inputs{x.q, x.k, x.v, {}}, 1);
      double L = 0;
      for (std::size_t i = 0; i < f.o.size(); ++i) L += f.o[i] * in.dout[i];
      return L;
    };
    const bool all = cs->seq < 64;
    std::mt19937 rng(3);
    const double h = 1e-5;
    int checked = 0;
    for (int which = 0; which < 3; ++which) {
      std::vector<double>& x = which == 0 ? in.q : which == 1 ? in.k : in.v;
      const std::vector<double>& g = which == 0 ? grads.dq : which == 1 ? grads.dk : grads.dv;
      const i64 n = static_cast<i64>(x.size());
      for (i64 t = 0; t < (all ? n : 24); ++t) {
        const std::size_t i = static_cast<std::size_t>(all ? t : std::uniform_int_distribution<i64>(0, n - 1)(rng));
        const double x0 = x[i];
        x[i] = x0 + h;
        const double lp = loss(in);
        x[i] = x0 - h;
        const double lm = loss(in);
        x[i] = x0;
        const double fd = (lp - lm) / (2 * h);
        INFO("tensor " << which << " element " << i);
        REQUIRE(g[i] == Approx(fd).margin(1e-8).epsilon(1e-6));
        ++checked;
      }
    }
    CHECK(checked == (all ? static_cast<int>(in.q.size() + in.k.size() + in.v.size()) : 72));
  }
}

TEST_CASE("host.attention: 1, 2 and 3 workers and any scratch alignment give the same bits", "[host][attention]") {
  const Case cs{"gqa rope", 2, 130, 4, 2, 16, true, false, 0, 1.0};
  const Inputs in = make_inputs(cs, 21);
  const Result<float> a = run<float>(cs, in, 1);
  for (int workers : {2, 3}) {
    for (i64 misalign : {0, 1, 3}) {
      INFO("workers " << workers << ", scratch offset " << misalign);
      const Result<float> b = run<float>(cs, in, workers, misalign);
      CHECK(same_bits(a.o, b.o));
      CHECK(same_bits(a.lse, b.lse));
      CHECK(same_bits(a.dq, b.dq));
      CHECK(same_bits(a.dk, b.dk));
      CHECK(same_bits(a.dv, b.dv));
    }
  }
  const Result<double> ad = run<double>(cs, in, 1), bd = run<double>(cs, in, 2, 1);
  CHECK(same_bits(ad.o, bd.o));
  CHECK(same_bits(ad.dq, bd.dq));
  CHECK(same_bits(ad.dk, bd.dk));
  Case windowed = cs;
  windowed.window = 70;
  const Result<float> aw = run<float>(windowed, in, 1), bw = run<float>(windowed, in, 3, 1);
  CHECK(same_bits(aw.o, bw.o));
  CHECK(same_bits(aw.lse, bw.lse));
  CHECK(same_bits(aw.dq, bw.dq));
  CHECK(same_bits(aw.dk, bw.dk));
  CHECK(same_bits(aw.dv, bw.dv));
}

namespace {

// Decode positions 0..seq-1 one at a time; returns out rows as (N, H hd),
// laid out like the forward's o. The caches start as NaN; rows past seq must stay NaN.
// With a sliding window W, after position pos the cache row that leaves the
// window (pos - W + 1) is set to NaN: a later step that read it would give NaN.
template <class T>
std::vector<T> decode_all(const Case& cs, const Inputs& in, i64 max_seq, int workers, bool* tail_untouched) {
  const AttentionDims d = cs.dims();
  const i64 B = d.batch, S = d.seq, H = d.heads, KV = d.kv_heads, hd = d.head_dim;
  const i64 wq = H * hd, wkv = KV * hd;
  const T nan = std::numeric_limits<T>::quiet_NaN();
  std::vector<T> kc(static_cast<std::size_t>(B * KV * max_seq * hd), nan), vc(kc.size(), nan);
  std::vector<T> q_row(static_cast<std::size_t>(B * wq)), k_new(static_cast<std::size_t>(B * wkv)), v_new(k_new.size());
  std::vector<T> out(static_cast<std::size_t>(B * wq)), o(static_cast<std::size_t>(B * S * wq));
  std::vector<T> scratch(static_cast<std::size_t>(host::attention_decode_scratch(d, max_seq, workers)));
  for (i64 pos = 0; pos < S; ++pos) {
    for (i64 b = 0; b < B; ++b) {
      const i64 n = b * S + pos;
      for (i64 c = 0; c < wq; ++c) q_row[static_cast<std::size_t>(b * wq + c)] = static_cast<T>(in.q[static_cast<std::size_t>(n * wq + c)]);
      for (i64 c = 0; c < wkv; ++c) {
        k_new[static_cast<std::size_t>(b * wkv + c)] = static_cast<T>(in.k[static_cast<std::size_t>(n * wkv + c)]);
        v_new[static_cast<std::size_t>(b * wkv + c)] = static_cast<T>(in.v[static_cast<std::size_t>(n * wkv + c)]);
      }
    }
    {
      NoHeap guard;
      host::attention_decode<T>(d, max_seq, pos, q_row.data(), k_new.data(), v_new.data(), kc.data(), vc.data(),
                                out.data(), scratch.data(), workers);
    }
    for (i64 b = 0; b < B; ++b)
      for (i64 c = 0; c < wq; ++c) o[static_cast<std::size_t>((b * S + pos) * wq + c)] = out[static_cast<std::size_t>(b * wq + c)];
    if (d.window > 0 && pos - d.window + 1 >= 0)
      for (i64 bg = 0; bg < B * KV; ++bg)
        for (i64 c = 0; c < hd; ++c) {
          const std::size_t i = static_cast<std::size_t>((bg * max_seq + pos - d.window + 1) * hd + c);
          kc[i] = vc[i] = nan;
        }
  }
  bool ok = true;
  for (i64 bg = 0; bg < B * KV; ++bg)
    for (i64 s = S; s < max_seq; ++s)
      for (i64 c = 0; c < hd; ++c) {
        const std::size_t i = static_cast<std::size_t>((bg * max_seq + s) * hd + c);
        ok = ok && std::isnan(kc[i]) && std::isnan(vc[i]);
      }
  *tail_untouched = ok;
  return o;
}

}  // namespace

TEST_CASE("host.attention: decoding positions 0..T-1 reproduces the forward's rows", "[host][attention]") {
  const Case decode_cases[] = {
      {"gqa rope batch 2", 2, 70, 4, 2, 16, true, false, 0, 1.0},
      {"mha no rope", 1, 40, 3, 3, 8, false, false, 0, 1.0},
      {"window 1, gqa rope", 1, 150, 4, 2, 16, true, false, 0, 1.0, 1},
      {"window 5, gqa no rope, batch 2", 2, 150, 4, 2, 16, false, false, 0, 1.0, 5},
      {"window 64, gqa rope", 1, 150, 4, 2, 16, true, false, 0, 1.0, 64},
      {"window 70, gqa no rope", 1, 150, 4, 2, 16, false, false, 0, 1.0, 70},
      {"window 100, gqa rope", 1, 150, 4, 2, 16, true, false, 0, 1.0, 100},
  };
  for (const Case& cs : decode_cases) {
    INFO("case: " << cs.name);
    const Inputs in = make_inputs(cs, 31);
    const Reference ref = reference(cs.dims(), Inputs{in.q, in.k, in.v, {}});
    bool tail = false;
    const std::vector<double> od = decode_all<double>(cs, in, cs.seq + 9, 2, &tail);
    CHECK(tail);
    CHECK(rel_err(od, to_double(run<double>(cs, Inputs{in.q, in.k, in.v, {}}, 2).o)) < 1e-13);
    CHECK(rel_err(od, ref.o) < 1e-12);
    const std::vector<float> of = decode_all<float>(cs, in, cs.seq + 9, 1, &tail);
    CHECK(tail);
    CHECK(rel_err(to_double(of), to_double(run<float>(cs, Inputs{in.q, in.k, in.v, {}}, 1).o)) < 1e-5);
    const std::vector<float> of2 = decode_all<float>(cs, in, cs.seq + 9, 2, &tail);
    CHECK(same_bits(of, of2));
  }
}

TEST_CASE("host.attention: nothing is written past the declared scratch or the outputs", "[host][attention]") {
  const float s = sentinel_f;
  const i64 guard = 257;
  auto untouched = [&](const std::vector<float>& buf, i64 from) {
    for (std::size_t i = static_cast<std::size_t>(from); i < buf.size(); ++i)
      if (std::memcmp(&buf[i], &s, sizeof(float)) != 0) return false;
    return true;
  };
  for (const Case& cs : {Case{"gqa rope", 2, 130, 4, 2, 16, true, false, 0, 1.0},
                         Case{"fused, no rope", 1, 70, 2, 2, 8, false, true, 0, 1.0}}) {
    INFO("case: " << cs.name);
    const AttentionDims d = cs.dims();
    const i64 N = d.batch * d.seq, wq = d.heads * d.head_dim;
    const Inputs in = make_inputs(cs, 41);
    Strided<float> x(cs, 0.0f);
    x.set(in);
    for (int workers : {1, 2}) {
      const i64 nf = host::attention_forward_scratch(d, workers), nb = host::attention_backward_scratch(d, workers);
      std::vector<float> scratch(static_cast<std::size_t>(std::max(nf, nb) + guard), s);
      std::vector<float> o(static_cast<std::size_t>(N * wq + guard), s), lse(static_cast<std::size_t>(d.batch * d.heads * d.seq + guard), s);
      host::attention_forward<float>(d, x.q(), x.ldq, x.k(), x.ldk, x.v(), x.ldv, o.data(), lse.data(), scratch.data(), workers);
      CHECK(untouched(scratch, nf));
      CHECK(untouched(o, N * wq));
      CHECK(untouched(lse, d.batch * d.heads * d.seq));

      std::fill(scratch.begin(), scratch.end(), s);
      std::vector<float> dout(in.dout.begin(), in.dout.end());
      Strided<float> g(cs, s);
      host::attention_backward<float>(d, x.q(), x.ldq, x.k(), x.ldk, x.v(), x.ldv, o.data(), lse.data(), dout.data(),
                                      g.q(), g.ldq, g.k(), g.ldk, g.v(), g.ldv, scratch.data(), workers);
      CHECK(untouched(scratch, nb));
      CHECK(g.padding_is(s));

      const i64 max_seq = 16, nd = host::attention_decode_scratch(d, max_seq, workers);
      std::vector<float> ds(static_cast<std::size_t>(nd + guard), s), out(static_cast<std::size_t>(d.batch * wq + guard), s);
      std::vector<float> kc(static_cast<std::size_t>(d.batch * d.kv_heads * max_seq * d.head_dim + guard), 0.0f), vc(kc);
      for (std::size_t i = kc.size() - guard; i < kc.size(); ++i) kc[i] = vc[i] = s;
      std::vector<float> kn(static_cast<std::size_t>(d.batch * d.kv_heads * d.head_dim), 0.5f), qn(static_cast<std::size_t>(d.batch * wq), 0.25f);
      host::attention_decode<float>(d, max_seq, max_seq - 1, qn.data(), kn.data(), kn.data(), kc.data(), vc.data(),
                                    out.data(), ds.data(), workers);
      CHECK(untouched(ds, nd));
      CHECK(untouched(out, d.batch * wq));
      CHECK(untouched(kc, static_cast<i64>(kc.size()) - guard));
      CHECK(untouched(vc, static_cast<i64>(vc.size()) - guard));
    }
  }
}

TEST_CASE("host.attention: bad dimensions are rejected with one sentence", "[host][attention]") {
  float x = 0;
  const AttentionDims gqa_bad{1, 4, 3, 2, 8};
  REQUIRE_THROWS_WITH(host::attention_forward<float>(gqa_bad, &x, 24, &x, 16, &x, 16, &x, &x, &x, 1),
                      "attention_forward: kv_heads must divide heads (GQA)");
  const AttentionDims rope_odd{1, 4, 2, 2, 5, true};
  REQUIRE_THROWS_WITH(host::attention_decode<float>(rope_odd, 8, 0, &x, &x, &x, &x, &x, &x, &x, 1),
                      Catch::Contains("even head_dim"));
  const AttentionDims ok{1, 4, 2, 2, 8};
  REQUIRE_THROWS_WITH(host::attention_forward<float>(ok, &x, 8, &x, 16, &x, 16, &x, &x, &x, 1),
                      Catch::Contains("ldq"));
  REQUIRE_THROWS_WITH(host::attention_forward<float>(ok, &x, 16, &x, 16, &x, 16, &x, &x, &x, 0),
                      "attention_forward: workers must be >= 1");
  REQUIRE_THROWS_WITH(host::attention_decode<float>(ok, 8, 8, &x, &x, &x, &x, &x, &x, &x, 1),
                      "attention_decode: pos must be in [0, max_seq)");
  const AttentionDims window_bad{1, 4, 2, 2, 8, false, 10000.0, {}, -1};
  REQUIRE_THROWS_WITH(host::attention_backward<float>(window_bad, &x, 16, &x, 16, &x, 16, &x, &x, &x, &x, 16, &x, 16, &x,
                                                      16, &x, 1),
                      "attention_backward: window must be >= 0 (0: no sliding window)");
}

TEST_CASE("host.attention: the softmax exp is within a few ulp of std::exp", "[host][attention]") {
  using headroom::host::detail::exp_approx;
  double worst_f = 0, worst_d = 0;
  for (double x = -87.0; x <= 0.5; x += 0.0137) {
    const float xf = static_cast<float>(x);
    worst_f = std::max(worst_f, std::abs(static_cast<double>(exp_approx(xf)) / std::exp(static_cast<double>(xf)) - 1));
    worst_d = std::max(worst_d, std::abs(exp_approx(x) / std::exp(x) - 1));
  }
  CHECK(worst_f < 3e-7);   // float ulp 6e-8 (relative, at worst 1.2e-7)
  CHECK(worst_d < 5e-16);  // double ulp 1.1e-16
  const float ninf = -std::numeric_limits<float>::infinity();
  CHECK(exp_approx(ninf) == 0.0f);
  CHECK(exp_approx(-1e30f) == 0.0f);
  CHECK(exp_approx(-std::numeric_limits<double>::infinity()) == 0.0);
  CHECK(exp_approx(0.0f) == 1.0f);
  CHECK(std::isnan(exp_approx(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::isnan(exp_approx(std::numeric_limits<double>::quiet_NaN())));
}
