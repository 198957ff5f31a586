// arange_where: fuses where, isnan
// numel=168, rnumel=1; in_ptr0=x, out_ptr0=buf0, out_ptr1=buf1
extern "C" void arange_where(const float* __restrict__ in_ptr0, float* out_ptr0, bool* out_ptr1, int64_t nthreads) {
  auto tmp3 = kiln::Vec<float>(0.0f);
  for (int64_t xindex = 0; xindex < 160; xindex += 16) {
    auto tmp0 = kiln::iota<int64_t>(static_cast<int64_t>(xindex), static_cast<int64_t>(1));
    auto tmp1 = kiln::cast<float>(tmp0);
    auto tmp2 = kiln::Vec<float>::loadu(in_ptr0 + xindex);
    auto tmp4 = tmp2 > tmp3;
    auto tmp5 = -tmp1;
    auto tmp6 = kiln::where(tmp4, tmp1, tmp5);
    tmp6.store(out_ptr0 + xindex);
    auto tmp7 = kiln::log(tmp2);
    auto tmp8 = kiln::mask_from_lanes([&](int64_t lane) { return std::isnan((tmp7[lane])); });
    tmp8.store(out_ptr1 + xindex);
  }
  for (int64_t xindex = 160; xindex < 168; ++xindex) {
    const int64_t tmp9 = static_cast<int64_t>(xindex);
    const float tmp10 = static_cast<float>(tmp9);
    const float tmp11 = in_ptr0[xindex];
    const bool tmp12 = tmp11 > 0.0f;
    const float tmp13 = -tmp10;
    const float tmp14 = tmp12 ? tmp10 : tmp13;
    out_ptr0[xindex] = tmp14;
    const float tmp15 = std::log(tmp11);
    const bool tmp16 = std::isnan(tmp15);
    out_ptr1[xindex] = tmp16;
  }
}
