// kiln_reduce.h: accumulators of Kiln's reductions, scalar and vector alike.
//
// A vectorized reduction keeps one accumulator per lane and a scalar one for
// the tail; the *_lanes helpers fold the lanes in order and then the tail, so
// argmax/argmin keep torch's "first occurrence" answer and Welford stays stable.
#pragma once

#include "kiln_vec.h"

namespace kiln {

template <typename T>
inline T reduce_prod(Vec<T> a) {
  T s = T(1);
  for (int64_t i = 0; i < kLanes; ++i) s *= a.v[i];
  return s;
}
template <typename T>
inline T reduce_xor(Vec<T> a) {
  T s = T(0);
  for (int64_t i = 0; i < kLanes; ++i) s ^= a.v[i];
  return s;
}

// ---- argmax / argmin: NaN counts as the extreme, ties keep the first index ---
template <bool IsMax, typename T>
inline bool arg_better(T v, T best) {
  if constexpr (std::is_floating_point_v<T>) {
    if (v != v) return best == best;
    if (best != best) return false;
  }
  return IsMax ? v > best : v < best;
}
template <bool IsMax, typename T>
inline void arg_update(T& best, int64_t& best_idx, T v, int64_t idx) {
  if (arg_better<IsMax>(v, best)) {
    best = v;
    best_idx = idx;
  }
}
template <bool IsMax, typename T>
inline void arg_update(Vec<T>& best, Vec<int64_t>& best_idx, Vec<T> v, Vec<int64_t> idx) {
  Mask take = mask_from_lanes([&](int64_t i) { return arg_better<IsMax>(v.v[i], best.v[i]); });
  best = where(take, v, best);
  best_idx = where(take, idx, best_idx);
}
// Merge two candidates whose positions may interleave: ties go to the smaller index.
template <bool IsMax, typename T>
inline void arg_merge(T& best, int64_t& best_idx, T v, int64_t idx) {
  bool same = (v == best) || (v != v && best != best);
  if (arg_better<IsMax>(v, best) || (same && idx < best_idx)) {
    best = v;
    best_idx = idx;
  }
}
// Fold vector lanes into the scalar tail accumulator (which holds the result).
template <bool IsMax, typename T>
inline void arg_lanes(T& best, int64_t& best_idx, Vec<T> lanes, Vec<int64_t> lane_idx) {
  T b = lanes.v[0];
  int64_t bi = lane_idx.v[0];
  for (int64_t i = 1; i < kLanes; ++i) arg_merge<IsMax>(b, bi, lanes.v[i], lane_idx.v[i]);
  arg_merge<IsMax>(b, bi, best, best_idx);
  best = b;
  best_idx = bi;
}

// ---- Welford: running mean, sum of squared deviations (m2) and count ---------
template <typename V, typename T>
inline void welford_update(V& mean, V& m2, V& weight, V x) {
  V delta = x - mean;
  if constexpr (std::is_same_v<V, Vec<T>>) {
    // Every lane has seen as many elements: one scalar division for all of them.
    T w = weight.v[0] + T(1);
    weight = V(w);
    mean = mean + delta * V(T(1) / w);
  } else {
    weight = weight + T(1);
    mean = mean + delta / weight;
  }
  m2 = m2 + delta * (x - mean);
}
// Chan et al.'s parallel merge of (mean_b, m2_b, weight_b) into (mean, m2, weight).
template <typename T>
inline void welford_merge(T& mean, T& m2, T& weight, T mean_b, T m2_b, T weight_b) {
  if (weight_b == T(0)) return;
  T total = weight + weight_b;
  T delta = mean_b - mean;
  T frac = weight_b / total;
  mean = mean + delta * frac;
  m2 = m2 + m2_b + delta * delta * weight * frac;
  weight = total;
}
template <typename T>
inline void welford_lanes(T& mean, T& m2, T& weight, Vec<T> mv, Vec<T> m2v, Vec<T> wv) {
  T m = 0, s = 0, w = 0;
  for (int64_t i = 0; i < kLanes; ++i) welford_merge(m, s, w, mv.v[i], m2v.v[i], wv.v[i]);
  welford_merge(m, s, w, mean, m2, weight);
  mean = m;
  m2 = s;
  weight = w;
}

}  // namespace kiln
