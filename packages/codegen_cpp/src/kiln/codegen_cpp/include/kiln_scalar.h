// kiln_scalar.h: scalar helpers of Kiln's generated C++ kernels.
//
// Python's integer semantics (floor division, modulo with the divisor's sign),
// torch's NaN-propagating min/max, bfloat16/float16 storage computed in float,
// and a counter-based random number generator (Philox-4x32-10) so a random
// kernel's values depend on (seed, offset) only, never on the thread count.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace kiln {

// ---- integer arithmetic with Python semantics -------------------------------
template <typename T>
inline T floordiv(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    T q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
  } else {
    return std::floor(a / b);
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

// ---- Philox-4x32-10 (Salmon et al., SC'11) -----------------------------------
struct Philox4 {
  uint32_t x[4];
};

inline Philox4 philox(uint64_t seed, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// Uniform in [0, 1) from the top 24 bits of one Philox word.
inline float uniform_from_bits(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}
inline float rand(int64_t seed, int64_t offset) {
  return uniform_from_bits(philox(static_cast<uint64_t>(seed), static_cast<uint64_t>(offset)).x[0]);
}
// Standard normal by Box-Muller over two words of the same counter.
inline float randn(int64_t seed, int64_t offset) {
  Philox4 r = philox(static_cast<uint64_t>(seed), static_cast<uint64_t>(offset));
  float u1 = (static_cast<float>(r.x[0] >> 8) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
  float u2 = uniform_from_bits(r.x[1]);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.283185307179586f * u2);
}
inline int64_t randint64(int64_t seed, int64_t offset, int64_t low, int64_t high) {
  Philox4 r = philox(static_cast<uint64_t>(seed), static_cast<uint64_t>(offset));
  uint64_t bits = (static_cast<uint64_t>(r.x[0]) << 32) | r.x[1];
  return low + static_cast<int64_t>(bits % static_cast<uint64_t>(high - low));
}

}  // namespace kiln
