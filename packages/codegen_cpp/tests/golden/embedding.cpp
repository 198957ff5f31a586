// embedding: fuses embedding
// numel=312, rnumel=1; in_ptr0=table, in_ptr1=idx, out_ptr0=buf0
extern "C" void embedding(const float* __restrict__ in_ptr0, const int64_t* __restrict__ in_ptr1, float* out_ptr0, int64_t nthreads) {
  auto tmp4 = kiln::Vec<float>(2.0f);
  for (int64_t xindex = 0; xindex < 304; xindex += 16) {
    auto tmp0 = kiln::from_lanes<int64_t>([&](int64_t lane) { return in_ptr1[(lane + xindex) / 24]; });
    auto tmp2 = kiln::map(tmp0, [&](int64_t t) { return kiln::checked_index(t, 50); });
    auto tmp3 = kiln::from_lanes<float>([&](int64_t lane) { return in_ptr0[24 * (tmp2[lane]) + (lane + xindex) % 24]; });
    auto tmp5 = tmp3 * tmp4;
    tmp5.store(out_ptr0 + xindex);
  }
  for (int64_t xindex = 304; xindex < 312; ++xindex) {
    const int64_t tmp6 = in_ptr1[xindex / 24];
    const int64_t tmp7 = kiln::checked_index(tmp6, 50);
    const float tmp8 = in_ptr0[24 * tmp7 + xindex % 24];
    const float tmp9 = tmp8 * 2.0f;
    out_ptr0[xindex] = tmp9;
  }
}
