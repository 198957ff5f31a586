// random: fuses rand
// numel=1000, rnumel=1; in_ptr0=seeds, out_ptr0=buf0
extern "C" void random(const int64_t* __restrict__ in_ptr0, float* out_ptr0, int64_t nthreads) {
  auto tmp1 = kiln::Vec<int64_t>(in_ptr0[0]);
  auto tmp3 = kiln::Vec<int64_t>(in_ptr0[1]);
  for (int64_t xindex = 0; xindex < 992; xindex += 16) {
    auto tmp0 = kiln::iota<int64_t>(static_cast<int64_t>(xindex), static_cast<int64_t>(1));
    auto tmp2 = kiln::from_lanes<float>([&](int64_t lane) { return kiln::rand(tmp1[lane], tmp0[lane]); });
    auto tmp4 = kiln::from_lanes<float>([&](int64_t lane) { return kiln::randn(tmp3[lane], tmp0[lane]); });
    auto tmp5 = tmp2 + tmp4;
    tmp5.store(out_ptr0 + xindex);
  }
  const int64_t tmp7 = in_ptr0[0];
  const int64_t tmp9 = in_ptr0[1];
  for (int64_t xindex = 992; xindex < 1000; ++xindex) {
    const int64_t tmp6 = static_cast<int64_t>(xindex);
    const float tmp8 = kiln::rand(tmp7, tmp6);
    const float tmp10 = kiln::randn(tmp9, tmp6);
    const float tmp11 = tmp8 + tmp10;
    out_ptr0[xindex] = tmp11;
  }
}
