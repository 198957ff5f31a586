// kiln_scalar.h: scalar helpers of Kiln's generated C++ kernels.
//
// Python's integer semantics (floor division, modulo with the divisor's sign),
// torch's NaN-propagating min/max, bfloat16/float16 storage computed in float,
// and loopir's counter-based random hash, so a random kernel's values depend on
// (seed, offset) only, never on the thread count or the device.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace kiln {

// ---- out-of-bounds indirect indices --------------------------------------------
// Each library defines these (see kiln.codegen_cpp.scheduling); a kernel that finds
// a bad index records it and carries on with index 0, and Python raises after the call.
extern "C" int64_t kiln_index_error_flag;
extern "C" int64_t kiln_index_error_value;
extern "C" int64_t kiln_index_error_size;
inline int64_t checked_index(int64_t raw, int64_t size) {
  int64_t idx = raw < 0 ? raw + size : raw;
  if (__builtin_expect(idx < 0 || idx >= size, 0)) {
    __atomic_store_n(&kiln_index_error_value, raw, __ATOMIC_RELAXED);
    __atomic_store_n(&kiln_index_error_size, size, __ATOMIC_RELAXED);
    __atomic_store_n(&kiln_index_error_flag, int64_t(1), __ATOMIC_RELEASE);
    return 0;
  }
  return idx;
}

// ---- small utilities (no <algorithm>/<vector>: every include costs compile time) --
inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t imax(int64_t a, int64_t b) { return a < b ? b : a; }
// A zero-initialised heap array freed at scope exit (per-chunk partial results).
template <typename T>
struct Scratch {
  T* data;
  explicit Scratch(int64_t n) : data(new T[n]()) {}
  ~Scratch() { delete[] data; }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T& operator[](int64_t i) { return data[i]; }
};

// ---- integer arithmetic with Python semantics -------------------------------
template <typename T>
inline T floordiv(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    T q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
  } else {
    // Python's (and torch's) float floor division: exact via fmod, so 1 // 0.1 is 9,
    // where floor(1 / 0.1) would round up to 10.
    if (b == T(0)) return a / b;
    T mod = std::fmod(a, b);
    T div = (a - mod) / b;
    if (mod != T(0) && ((b < T(0)) != (mod < T(0)))) div -= T(1);
    if (div == T(0)) return std::copysign(T(0), a / b);
    T whole = std::floor(div);
    return (div - whole > T(0.5)) ? whole + T(1) : whole;
  }
}
template <typename T>
inline T pymod(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    T r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
  } else {
    T r = std::fmod(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
  }
}

// ---- torch's min/max: NaN wins ----------------------------------------------
template <typename T>
inline T scalar_max(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return a > b ? a : b;
}
template <typename T>
inline T scalar_min(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return a < b ? a : b;
}

// ---- math the C library lacks ------------------------------------------------
template <typename T>
inline T sigmoid(T x) { return T(1) / (T(1) + std::exp(-x)); }
template <typename T>
inline T sign(T x) {  // 0 for NaN (every comparison is false), as torch.sign
  return static_cast<T>((T(0) < x) - (x < T(0)));
}
template <typename T>
inline T relu(T x) { return x < T(0) ? T(0) : x; }
// Integer power by squaring; negative exponents follow torch (0 unless |base| == 1).
template <typename T>
inline T ipow(T base, T exp) {
  if (exp < 0) {
    if (base == 1) return 1;
    if (base == -1) return (exp % 2 == 0) ? 1 : -1;
    return 0;
  }
  T result = 1;
  while (exp) {
    if (exp & 1) result *= base;
    base *= base;
    exp >>= 1;
  }
  return result;
}
// erfinv: Winitzki's closed form as a start, then Newton steps on erf in double.
inline double erfinv(double y) {
  if (y != y || y < -1.0 || y > 1.0) return std::numeric_limits<double>::quiet_NaN();
  if (y == 1.0) return std::numeric_limits<double>::infinity();
  if (y == -1.0) return -std::numeric_limits<double>::infinity();
  const double a = 0.147, two_over_pi_a = 2.0 / (3.141592653589793 * a);
  double l = std::log((1.0 - y) * (1.0 + y));
  double t = two_over_pi_a + 0.5 * l;
  double x = std::copysign(std::sqrt(std::sqrt(t * t - l / a) - t), y);
  for (int i = 0; i < 3; ++i) {
    double err = std::erf(x) - y;
    x -= err / (1.1283791670955126 * std::exp(-x * x));
  }
  return x;
}
// digamma: reflection below 0, recurrence up to 6, then the asymptotic series.
inline double digamma(double x) {
  const double pi = 3.141592653589793;
  if (x == 0.0) return std::copysign(std::numeric_limits<double>::infinity(), -x);
  if (x < 0.0) {
    if (x == std::floor(x)) return std::numeric_limits<double>::quiet_NaN();
    return digamma(1.0 - x) - pi / std::tan(pi * x);
  }
  double acc = 0.0;
  while (x < 6.0) {
    acc -= 1.0 / x;
    x += 1.0;
  }
  double r = 1.0 / (x * x);
  double series = r * (1.0 / 12 - r * (1.0 / 120 - r * (1.0 / 252 - r * (1.0 / 240 - r * (1.0 / 132)))));
  return acc + std::log(x) - 0.5 / x - series;
}

// ---- reduced-precision floats: stored 16-bit, computed in float ------------
using bf16_t = uint16_t;
using half_t = _Float16;

inline float bf16_to_float(bf16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
// Round to nearest even, as torch does; NaN stays a quiet NaN.
inline bf16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if (f != f) return static_cast<bf16_t>((bits >> 16) | 0x40);
  uint32_t rounding = 0x7fff + ((bits >> 16) & 1);
  return static_cast<bf16_t>((bits + rounding) >> 16);
}
inline float half_to_float(half_t h) { return static_cast<float>(h); }
inline half_t float_to_half(float f) { return static_cast<half_t>(f); }
// A float rounded to the nearest value the 16-bit type can hold (a to_dtype).
inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }
inline float round_to_half(float f) { return half_to_float(float_to_half(f)); }

// ---- counter-based random numbers ----------------------------------------------
// The hash of kiln.loopir.random_bits, so CPU kernels draw the same numbers as
// every other backend for a (seed, offset): MurmurHash3's finaliser, twice.
inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}
inline uint32_t hash32(int64_t seed, int64_t offset, uint32_t stream) {
  uint64_t s = static_cast<uint64_t>(seed);
  uint32_t key = fmix32(static_cast<uint32_t>(s) ^ static_cast<uint32_t>(s >> 32));
  uint32_t lo = static_cast<uint32_t>(static_cast<uint64_t>(offset));
  return fmix32(key + 2u * lo + stream);
}
inline float rand(int64_t seed, int64_t offset) {
  return static_cast<float>(hash32(seed, offset, 0) >> 8) * (1.0f / 16777216.0f);
}
// Standard normal by Box-Muller over two streams of the same counter.
inline float randn(int64_t seed, int64_t offset) {
  float u1 = static_cast<float>((hash32(seed, offset, 0) >> 8) + 1) * (1.0f / 16777216.0f);
  float u2 = static_cast<float>(hash32(seed, offset, 1) >> 8) * (1.0f / 16777216.0f);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(static_cast<float>(6.283185307179586) * u2);
}

}  // namespace kiln
