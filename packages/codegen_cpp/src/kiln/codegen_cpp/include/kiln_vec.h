// kiln_vec.h: the SIMD vocabulary of Kiln's generated C++ kernels.
//
// Built on GCC/Clang vector extensions, so one source serves AVX-512, AVX2 and
// SSE: the widest instruction set the build's -march enables picks the lane
// count (every vector of a kernel has kLanes lanes, whatever its element type;
// doubles and int64 span two registers). Cheap math (exp, log, tanh, sigmoid)
// has vector implementations accurate to a few ulp, and square root and rounding
// exact ones on AVX; the rest runs per lane with the C library's scalar
// function, which is exact but slower.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kiln_scalar.h"

#if defined(__AVX__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define KILN_VEC_BYTES 64
#elif defined(__AVX__)
#define KILN_VEC_BYTES 32
#else
#define KILN_VEC_BYTES 16
#endif

namespace kiln {

constexpr int64_t kLanes = KILN_VEC_BYTES / 4;

template <typename T>
struct Raw {
  typedef T type __attribute__((vector_size(sizeof(T) * kLanes)));
};

// The signed integer of T's width: what a comparison of two T vectors yields.
template <typename T>
using same_int_t = std::conditional_t<
    sizeof(T) == 8, int64_t,
    std::conditional_t<sizeof(T) == 4, int32_t, std::conditional_t<sizeof(T) == 2, int16_t, int8_t>>>;

template <typename T>
struct Vec {
  using raw_t = typename Raw<T>::type;
  raw_t v;

  Vec() : v{} {}
  Vec(raw_t r) : v(r) {}
  Vec(T s) : v(raw_t{} + s) {}

  static Vec loadu(const T* p) {
    Vec r;
    std::memcpy(&r.v, p, sizeof(raw_t));
    return r;
  }
  void store(T* p) const { std::memcpy(p, &v, sizeof(raw_t)); }
  // A vector over p[base + i * stride] for a non-unit stride.
  static Vec gather(const T* p, int64_t stride) {
    Vec r;
    for (int64_t i = 0; i < kLanes; ++i) r.v[i] = p[i * stride];
    return r;
  }
  void scatter(T* p, int64_t stride) const {
    for (int64_t i = 0; i < kLanes; ++i) p[i * stride] = v[i];
  }
  T operator[](int64_t i) const { return v[i]; }
};

// Lanes of a condition: -1 (true) or 0, 32 bits wide whatever compared them.
struct Mask {
  using raw_t = Raw<int32_t>::type;
  raw_t m;
  Mask() : m{} {}
  Mask(raw_t r) : m(r) {}
  Mask(bool b) : m(raw_t{} + (b ? -1 : 0)) {}
  static Mask loadu(const bool* p) {
    Mask r;
    for (int64_t i = 0; i < kLanes; ++i) r.m[i] = p[i] ? -1 : 0;
    return r;
  }
  void store(bool* p) const {
    for (int64_t i = 0; i < kLanes; ++i) p[i] = m[i] != 0;
  }
  bool any() const {
    for (int64_t i = 0; i < kLanes; ++i)
      if (m[i]) return true;
    return false;
  }
  bool all() const {
    for (int64_t i = 0; i < kLanes; ++i)
      if (!m[i]) return false;
    return true;
  }
};

template <typename T>
inline Mask to_mask(typename Raw<same_int_t<T>>::type c) {
  if constexpr (sizeof(T) == 4) {
    return Mask(c);
  } else {
    return Mask(__builtin_convertvector(c, Mask::raw_t));
  }
}

// ---- arithmetic and comparisons ------------------------------------------
#define KILN_BINARY(op)                                                         \
  template <typename T>                                                         \
  inline Vec<T> operator op(Vec<T> a, Vec<T> b) { return Vec<T>(a.v op b.v); } \
  template <typename T>                                                         \
  inline Vec<T> operator op(Vec<T> a, T b) { return a op Vec<T>(b); }           \
  template <typename T>                                                         \
  inline Vec<T> operator op(T a, Vec<T> b) { return Vec<T>(a) op b; }
KILN_BINARY(+)
KILN_BINARY(-)
KILN_BINARY(*)
KILN_BINARY(/)
KILN_BINARY(&)
KILN_BINARY(|)
KILN_BINARY(^)
KILN_BINARY(<<)
KILN_BINARY(>>)
#undef KILN_BINARY

#define KILN_COMPARE(op)                                 \
  template <typename T>                                  \
  inline Mask operator op(Vec<T> a, Vec<T> b) {          \
    return to_mask<T>(a.v op b.v);                       \
  }
KILN_COMPARE(<)
KILN_COMPARE(<=)
KILN_COMPARE(>)
KILN_COMPARE(>=)
KILN_COMPARE(==)
KILN_COMPARE(!=)
#undef KILN_COMPARE

template <typename T>
inline Vec<T> operator-(Vec<T> a) { return Vec<T>(-a.v); }

inline Mask operator&(Mask a, Mask b) { return Mask(a.m & b.m); }
inline Mask operator|(Mask a, Mask b) { return Mask(a.m | b.m); }
inline Mask operator^(Mask a, Mask b) { return Mask(a.m ^ b.m); }
inline Mask operator!(Mask a) { return Mask(~a.m); }

template <typename T>
inline Vec<T> where(Mask c, Vec<T> a, Vec<T> b) {
  using I = typename Raw<same_int_t<T>>::type;
  I wide;
  if constexpr (sizeof(T) == 4) {
    wide = c.m;
  } else {
    wide = __builtin_convertvector(c.m, I);
  }
  return Vec<T>(wide ? a.v : b.v);
}
inline Mask where(Mask c, Mask a, Mask b) { return Mask(c.m ? a.m : b.m); }

template <typename To, typename From>
inline Vec<To> cast(Vec<From> a) {
  return Vec<To>(__builtin_convertvector(a.v, typename Raw<To>::type));
}
template <typename To>
inline Vec<To> cast(Mask a) {
  return where(a, Vec<To>(To(1)), Vec<To>(To(0)));
}
template <typename From>
inline Mask to_bool(Vec<From> a) { return a != Vec<From>(From(0)); }

// Per-lane application of a scalar function: exact, for what has no vector form.
template <typename T, typename F>
inline Vec<T> map(Vec<T> a, F f) {
  Vec<T> r;
  for (int64_t i = 0; i < kLanes; ++i) r.v[i] = f(a.v[i]);
  return r;
}
template <typename T, typename F>
inline Vec<T> map2(Vec<T> a, Vec<T> b, F f) {
  Vec<T> r;
  for (int64_t i = 0; i < kLanes; ++i) r.v[i] = f(a.v[i], b.v[i]);
  return r;
}

// ---- NaN-propagating min/max, abs (torch semantics) -------------------------
template <typename T>
inline Vec<T> maximum(Vec<T> a, Vec<T> b) {
  if constexpr (std::is_floating_point_v<T>) {
    auto r = where(a > b, a, b);
    return where(a != a, a, where(b != b, b, r));
  } else {
    return where(a > b, a, b);
  }
}
template <typename T>
inline Vec<T> minimum(Vec<T> a, Vec<T> b) {
  if constexpr (std::is_floating_point_v<T>) {
    auto r = where(a < b, a, b);
    return where(a != a, a, where(b != b, b, r));
  } else {
    return where(a < b, a, b);
  }
}
template <typename T>
inline Vec<T> abs(Vec<T> a) { return where(a < Vec<T>(T(0)), -a, a); }

// ---- float math ------------------------------------------------------------
// Round to nearest integer (ties to even) for |a| < 2^22 (float) or 2^51 (double):
// adding and removing 1.5 * 2^mantissa_bits leaves no fraction bits.
inline Vec<float> round_nearest(Vec<float> a) {
  Vec<float> magic(12582912.0f);
  return (a + magic) - magic;
}
inline Vec<double> round_nearest(Vec<double> a) {
  Vec<double> magic(6755399441055744.0);
  return (a + magic) - magic;
}
// Square root and the rounding functions: one instruction where the instruction set has
// them (IEEE square root is correctly rounded and rounding is exact, so every lane equals the
// C library's answer), else per lane. Applied per lane, the C library's calls cost several
// times a memory-bound kernel's loads: batch norm's sqrt(var + eps) runs at every element.
// KILN_PS: the register type of a Vec<float>, where these instructions take it.
#if defined(__AVX512F__)
#define KILN_PS __m512
#define KILN_SQRT_PS(v) _mm512_sqrt_ps(v)
#define KILN_ROUND_PS(v, mode) _mm512_roundscale_ps(v, (mode) | _MM_FROUND_NO_EXC)
#define KILN_FMADD_PS(a, b, c) _mm512_fmadd_ps(a, b, c)
#elif defined(__AVX__)
#define KILN_PS __m256
#define KILN_SQRT_PS(v) _mm256_sqrt_ps(v)
#define KILN_ROUND_PS(v, mode) _mm256_round_ps(v, (mode) | _MM_FROUND_NO_EXC)
#if defined(__FMA__)
#define KILN_FMADD_PS(a, b, c) _mm256_fmadd_ps(a, b, c)
#endif
#endif
#ifdef KILN_PS
inline Vec<float> sqrt(Vec<float> a) {
  return Vec<float>((Raw<float>::type)KILN_SQRT_PS((KILN_PS)a.v));
}
template <int Mode>
inline Vec<float> rounded(Vec<float> a) {
  return Vec<float>((Raw<float>::type)KILN_ROUND_PS((KILN_PS)a.v, Mode));
}
inline Vec<float> floor(Vec<float> a) { return rounded<_MM_FROUND_TO_NEG_INF>(a); }
inline Vec<float> ceil(Vec<float> a) { return rounded<_MM_FROUND_TO_POS_INF>(a); }
inline Vec<float> trunc(Vec<float> a) { return rounded<_MM_FROUND_TO_ZERO>(a); }
inline Vec<float> nearbyint(Vec<float> a) { return rounded<_MM_FROUND_TO_NEAREST_INT>(a); }
#else
inline Vec<float> sqrt(Vec<float> a) { return map(a, [](float x) { return std::sqrt(x); }); }
inline Vec<float> floor(Vec<float> a) { return map(a, [](float x) { return std::floor(x); }); }
inline Vec<float> ceil(Vec<float> a) { return map(a, [](float x) { return std::ceil(x); }); }
inline Vec<float> trunc(Vec<float> a) { return map(a, [](float x) { return std::trunc(x); }); }
inline Vec<float> nearbyint(Vec<float> a) {
  return map(a, [](float x) { return std::nearbyint(x); });
}
#endif

// a * b + c rounded once where the instruction set fuses them (FMA): the polynomials of the
// math functions below evaluate in half the instructions and no less accurately. The kernels'
// own arithmetic stays unfused (-ffp-contract=off), as eager's is.
inline Vec<float> fmadd(Vec<float> a, Vec<float> b, Vec<float> c) {
#ifdef KILN_FMADD_PS
  return Vec<float>((Raw<float>::type)KILN_FMADD_PS((KILN_PS)a.v, (KILN_PS)b.v, (KILN_PS)c.v));
#else
  return a * b + c;
#endif
}

// exp: x = n*ln2 + r with |r| <= ln2/2, e^r by Cephes' minimax polynomial (relative error
// below 1e-7 overall), 2^n by building the exponent bits.
namespace detail {
// n = round(x / ln2) and e^r for r = x - n*ln2, for |x| < 2^8 ln2.
inline Vec<float> exp_reduced(Vec<float> x, Vec<float>& n) {
  using VF = Vec<float>;
  n = round_nearest(x * VF(1.44269504088896341f));
  // r = x - n*ln2 in two steps keeps r exact for |n| < 2^8 (ln2 split hi+lo).
  VF r = x - n * VF(0.693145751953125f) - n * VF(1.428606765330187e-06f);
  VF p(1.9875691500e-4f);
  p = fmadd(p, r, VF(1.3981999507e-3f));
  p = fmadd(p, r, VF(8.3334519073e-3f));
  p = fmadd(p, r, VF(4.1665795894e-2f));
  p = fmadd(p, r, VF(1.6666665459e-1f));
  p = fmadd(p, r, VF(5.0000001201e-1f));
  return fmadd(p, r * r, r) + VF(1.0f);
}
// 2^e for integral e in [-126, 127]: the exponent bits alone.
inline Vec<float> pow2(Vec<int32_t> e) {
  Vec<int32_t> bits = (e + Vec<int32_t>(127)) << 23;
  Vec<float> s;
  std::memcpy(&s.v, &bits.v, sizeof(s.v));
  return s;
}
}  // namespace detail

inline Vec<float> exp(Vec<float> x) {
  using VF = Vec<float>;
  using VI = Vec<int32_t>;
  // Past these bounds the scaling below overflows to inf or underflows to 0 by itself;
  // NaN fails both comparisons and propagates through the arithmetic.
  VF c = where(x > VF(88.8f), VF(88.8f), where(x < VF(-104.0f), VF(-104.0f), x));
  VF n;
  VF p = detail::exp_reduced(c, n);
  // Scale by 2^n in two halves so subnormal results (n < -126) and n = 128 stay right.
  VI ni = cast<int32_t>(n);
  VI half = ni >> 1;
  return p * detail::pow2(half) * detail::pow2(ni - half);
}

// log: x = m * 2^e with m in [sqrt(1/2), sqrt(2)); log(m) = 2*atanh(s), s = (m-1)/(m+1),
// |s| <= 0.1716, by the odd series of atanh to s^11 (error below 1e-10).
inline Vec<float> log(Vec<float> x) {
  using VF = Vec<float>;
  using VI = Vec<int32_t>;
  // Bring subnormals into the normal range first.
  Mask tiny = x < VF(1.17549435e-38f);
  VF xs = where(tiny, x * VF(8388608.0f), x);
  VI bits;
  std::memcpy(&bits.v, &xs.v, sizeof(bits.v));
  VI e = ((bits >> 23) & VI(0xff)) - VI(127);
  VI mbits = (bits & VI(0x007fffff)) | VI(0x3f800000);
  VF m;
  std::memcpy(&m.v, &mbits.v, sizeof(m.v));
  Mask big = m > VF(1.41421356237f);
  m = where(big, m * VF(0.5f), m);
  e = where(big, e + VI(1), e);
  VF ef = cast<float>(e) - where(tiny, VF(23.0f), VF(0.0f));
  VF s = (m - VF(1.0f)) / (m + VF(1.0f));
  VF s2 = s * s;
  VF p(2.0f / 11.0f);
  p = fmadd(p, s2, VF(2.0f / 9.0f));
  p = fmadd(p, s2, VF(2.0f / 7.0f));
  p = fmadd(p, s2, VF(2.0f / 5.0f));
  p = fmadd(p, s2, VF(2.0f / 3.0f));
  p = fmadd(p, s2, VF(2.0f));
  VF result = p * s + ef * VF(0.693147180559945309f);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  result = where(x == VF(0.0f), VF(-inf), result);
  result = where(x < VF(0.0f), VF(nan), result);
  result = where(x == VF(inf), VF(inf), result);
  return where(x != x, x, result);
}

inline Vec<float> sigmoid(Vec<float> x) { return Vec<float>(1.0f) / (Vec<float>(1.0f) + exp(-x)); }

// tanh: the odd Taylor series near 0 (to x^9, error < 1e-9 for |x| < 0.2),
// 1 - 2/(e^{2|x|}+1) elsewhere.
inline Vec<float> tanh(Vec<float> x) {
  using VF = Vec<float>;
  VF ax = abs(x);
  VF far = VF(1.0f) - VF(2.0f) / (exp(ax * VF(2.0f)) + VF(1.0f));
  far = where(x < VF(0.0f), -far, far);
  VF x2 = x * x;
  VF p(62.0f / 2835.0f);
  p = p * x2 - VF(17.0f / 315.0f);
  p = p * x2 + VF(2.0f / 15.0f);
  p = p * x2 - VF(1.0f / 3.0f);
  VF near = x + x * x2 * p;
  return where(ax < VF(0.2f), near, far);
}

// erf: x * P(x^2) for |x| < 0.921875; 1 - e^{t H(t)} beyond, t = |x| clamped to 4 (past which
// erf rounds to 1 in float). P and H are degree-5 least-squares fits, reweighted toward minimax,
// of erf(x)/x and of log(erfc(t))/t weighted by erfc(t) t (relative error of erf below 2e-8
// before rounding). Neither range divides, and the exponent stays within [-18, -1.5].
inline Vec<float> erf(Vec<float> x) {
  using VF = Vec<float>;
  static constexpr float near_coeffs[] = {-5.990992067e-04f, 4.993212875e-03f, -2.676664479e-02f,
                                          1.128181741e-01f,  -3.761249483e-01f, 1.128379107e+00f};
  static constexpr float far_coeffs[] = {2.134701353e-04f,  -3.210796975e-03f, 2.287692949e-02f,
                                         -1.052420214e-01f, -6.357329488e-01f, -1.128510118e+00f};
  VF ax = abs(x);
  VF x2 = x * x;
  VF p(near_coeffs[0]);
  for (int i = 1; i < 6; ++i) p = fmadd(p, x2, VF(near_coeffs[i]));
  VF near = x * p;
  VF t = where(ax > VF(4.0f), VF(4.0f), ax);
  VF h(far_coeffs[0]);
  for (int i = 1; i < 6; ++i) h = fmadd(h, t, VF(far_coeffs[i]));
  VF n;  // e^{t H(t)}: the exponent lies in [-18, -1.5], where one scale by 2^n is exact
  VF e = detail::exp_reduced(h * t, n);
  VF far = VF(1.0f) - e * detail::pow2(cast<int32_t>(n));
  far = where(x < VF(0.0f), -far, far);
  return where(ax < VF(0.921875f), near, where(x != x, x, far));
}

// sin/cos: reduce by multiples of pi/2 in double precision (exact enough for
// |x| < 2^20), then Taylor polynomials on [-pi/4, pi/4]; larger or non-finite
// arguments go lane by lane through the C library.
namespace detail {
inline void sincos_reduce(Vec<float> x, Vec<float>& r, Vec<int32_t>& q) {
  Vec<double> xd = cast<double>(x);
  Vec<double> n = round_nearest(xd * Vec<double>(0.63661977236758134));
  Vec<double> rd = xd - n * Vec<double>(1.5707963267948966) - n * Vec<double>(6.123233995736766e-17);
  r = cast<float>(rd);
  q = cast<int32_t>(cast<float>(n));
}
inline Vec<float> sin_poly(Vec<float> r) {
  using VF = Vec<float>;
  VF r2 = r * r;
  VF p(1.0f / 362880.0f);
  p = p * r2 - VF(1.0f / 5040.0f);
  p = p * r2 + VF(1.0f / 120.0f);
  p = p * r2 - VF(1.0f / 6.0f);
  return r + r * r2 * p;
}
inline Vec<float> cos_poly(Vec<float> r) {
  using VF = Vec<float>;
  VF r2 = r * r;
  VF p(-1.0f / 3628800.0f);
  p = p * r2 + VF(1.0f / 40320.0f);
  p = p * r2 - VF(1.0f / 720.0f);
  p = p * r2 + VF(1.0f / 24.0f);
  p = p * r2 - VF(0.5f);
  return VF(1.0f) + r2 * p;
}
inline bool all_small(Vec<float> x) {
  Vec<float> a = abs(x);
  for (int64_t i = 0; i < kLanes; ++i)
    if (!(a.v[i] < 1048576.0f)) return false;
  return true;
}
}  // namespace detail

inline Vec<float> sin(Vec<float> x) {
  if (!detail::all_small(x)) return map(x, [](float t) { return std::sin(t); });
  Vec<float> r;
  Vec<int32_t> q;
  detail::sincos_reduce(x, r, q);
  Vec<int32_t> k = q & Vec<int32_t>(3);
  Vec<float> s = detail::sin_poly(r), c = detail::cos_poly(r);
  Vec<float> v = where((k & Vec<int32_t>(1)) != Vec<int32_t>(0), c, s);
  return where((k & Vec<int32_t>(2)) != Vec<int32_t>(0), -v, v);
}
inline Vec<float> cos(Vec<float> x) {
  if (!detail::all_small(x)) return map(x, [](float t) { return std::cos(t); });
  Vec<float> r;
  Vec<int32_t> q;
  detail::sincos_reduce(x, r, q);
  Vec<int32_t> k = (q + Vec<int32_t>(1)) & Vec<int32_t>(3);
  Vec<float> s = detail::sin_poly(r), c = detail::cos_poly(r);
  Vec<float> v = where((k & Vec<int32_t>(1)) != Vec<int32_t>(0), c, s);
  return where((k & Vec<int32_t>(2)) != Vec<int32_t>(0), -v, v);
}

// ---- lane-wise construction, masked access, 16-bit floats -------------------
// A vector whose lane i is f(i): gathers with any index arithmetic.
template <typename T, typename F>
inline Vec<T> from_lanes(F f) {
  Vec<T> r;
  for (int64_t i = 0; i < kLanes; ++i) r.v[i] = f(i);
  return r;
}
template <typename F>
inline Mask mask_from_lanes(F f) {
  Mask r;
  for (int64_t i = 0; i < kLanes; ++i) r.m[i] = f(i) ? -1 : 0;
  return r;
}
// Lanes where `m` holds read f(i); the others are 0 and touch no memory.
template <typename T, typename F>
inline Vec<T> masked_lanes(Mask m, F f) {
  Vec<T> r;
  for (int64_t i = 0; i < kLanes; ++i) r.v[i] = m.m[i] ? f(i) : T(0);
  return r;
}
// A masked load whose mask is usually uniform across the vector (concatenation, padding):
// all lanes on take the plain vector load `full`, all off touch no memory, and only a
// mixed mask reads lane by lane.
template <typename T, typename Full, typename F>
inline Vec<T> masked_load(Mask m, Full full, F f) {
  if (m.all()) return full();
  if (!m.any()) return Vec<T>(T(0));
  return masked_lanes<T>(m, f);
}
// A contiguous masked load (a padded window's taps at a row's edge, where the mask is
// mixed in two of every few vectors): one masked move of the lanes on, which reads no
// memory of the lanes off, where the target has it (AVX-512, AVX) for 32-bit lanes;
// elsewhere as masked_load. Lanes off are zero.
template <typename T>
inline Vec<T> masked_loadu(Mask m, const T* p) {
#if KILN_VEC_BYTES == 64
  if constexpr (sizeof(T) == 4) {
    __m512i on;
    std::memcpy(&on, &m.m, sizeof(on));
    __m512 bits = _mm512_maskz_loadu_ps(_mm512_test_epi32_mask(on, on), p);
    Vec<T> r;
    std::memcpy(&r.v, &bits, sizeof(bits));
    return r;
  }
#elif KILN_VEC_BYTES == 32
  if constexpr (sizeof(T) == 4) {
    __m256i on;
    std::memcpy(&on, &m.m, sizeof(on));
    __m256 bits = _mm256_maskload_ps(reinterpret_cast<const float*>(p), on);
    Vec<T> r;
    std::memcpy(&r.v, &bits, sizeof(bits));
    return r;
  }
#endif
  if (m.all()) return Vec<T>::loadu(p);
  if (!m.any()) return Vec<T>(T(0));
  return masked_lanes<T>(m, [&](int64_t i) { return p[i]; });
}
template <typename Full, typename F>
inline Mask masked_load_mask(Mask m, Full full, F f) {
  if (m.all()) return full();
  if (!m.any()) return Mask(false);
  return mask_from_lanes([&](int64_t lane) { return m.m[lane] && f(lane); });
}
template <typename T>
inline Vec<T> iota(T start, T step) {
  return from_lanes<T>([&](int64_t i) { return static_cast<T>(start + step * static_cast<T>(i)); });
}

inline Vec<float> load_bf16(const bf16_t* p) {
  Raw<uint16_t>::type h;
  std::memcpy(&h, p, sizeof(h));
  Raw<uint32_t>::type bits = __builtin_convertvector(h, Raw<uint32_t>::type) << 16;
  Vec<float> r;
  std::memcpy(&r.v, &bits, sizeof(bits));
  return r;
}
inline Raw<uint16_t>::type to_bf16_bits(Vec<float> f) {
  Raw<uint32_t>::type bits;
  std::memcpy(&bits, &f.v, sizeof(bits));
  Raw<uint32_t>::type rounded = (bits + (0x7fffu + ((bits >> 16) & 1u))) >> 16;
  Raw<uint32_t>::type quiet = (bits >> 16) | 0x40u;
  Raw<uint32_t>::type out = (f.v != f.v) ? quiet : rounded;
  return __builtin_convertvector(out, Raw<uint16_t>::type);
}
inline void store_bf16(bf16_t* p, Vec<float> f) {
  Raw<uint16_t>::type h = to_bf16_bits(f);
  std::memcpy(p, &h, sizeof(h));
}
inline Vec<float> round_to_bf16(Vec<float> f) {
  Raw<uint32_t>::type bits = __builtin_convertvector(to_bf16_bits(f), Raw<uint32_t>::type) << 16;
  Vec<float> r;
  std::memcpy(&r.v, &bits, sizeof(bits));
  return r;
}
inline Vec<float> load_half(const half_t* p) {
  Raw<half_t>::type h;
  std::memcpy(&h, p, sizeof(h));
  return Vec<float>(__builtin_convertvector(h, Raw<float>::type));
}
inline void store_half(half_t* p, Vec<float> f) {
  Raw<half_t>::type h = __builtin_convertvector(f.v, Raw<half_t>::type);
  std::memcpy(p, &h, sizeof(h));
}
inline Vec<float> round_to_half(Vec<float> f) {
  return Vec<float>(__builtin_convertvector(__builtin_convertvector(f.v, Raw<half_t>::type), Raw<float>::type));
}

// ---- horizontal reductions --------------------------------------------------
template <typename T>
inline T reduce_sum(Vec<T> a) {
  T s = T(0);
  for (int64_t i = 0; i < kLanes; ++i) s += a.v[i];
  return s;
}
template <typename T>
inline T reduce_max(Vec<T> a) {
  T s = a.v[0];
  for (int64_t i = 1; i < kLanes; ++i) s = scalar_max(s, a.v[i]);
  return s;
}
template <typename T>
inline T reduce_min(Vec<T> a) {
  T s = a.v[0];
  for (int64_t i = 1; i < kLanes; ++i) s = scalar_min(s, a.v[i]);
  return s;
}

}  // namespace kiln
