// pad: fuses constant_pad_nd
// numel=350, rnumel=1; in_ptr0=x, out_ptr0=buf0
extern "C" void pad(const float* __restrict__ in_ptr0, float* out_ptr0, int64_t nthreads) {
  for (int64_t xrow = 0; xrow < 10; ++xrow) {
    auto tmp1 = kiln::Vec<int64_t>(static_cast<int64_t>(2));
    auto tmp3 = kiln::Vec<int64_t>(static_cast<int64_t>(32));
    auto tmp8 = kiln::Vec<float>(-1.5f);
    for (int64_t xcol = 0; xcol < 32; xcol += 16) {
      auto tmp0 = kiln::iota<int64_t>(static_cast<int64_t>(xcol), static_cast<int64_t>(1));
      auto tmp2 = tmp0 >= tmp1;
      auto tmp4 = tmp0 < tmp3;
      auto tmp5 = tmp2 & tmp4;
      auto tmp6 = kiln::masked_loadu<float>(tmp5, in_ptr0 + xcol + 30 * xrow - 2);
      auto tmp7 = kiln::exp(tmp6);
      auto tmp9 = kiln::where(tmp5, tmp7, tmp8);
      tmp9.store(out_ptr0 + xcol + 35 * xrow);
    }
    for (int64_t xcol = 32; xcol < 35; ++xcol) {
      const int64_t tmp10 = static_cast<int64_t>(xcol);
      const bool tmp11 = tmp10 >= (static_cast<int64_t>(2));
      const bool tmp12 = tmp10 < (static_cast<int64_t>(32));
      const bool tmp13 = tmp11 && tmp12;
      auto tmp16 = [&] {
        const float tmp14 = in_ptr0[xcol + 30 * xrow - 2];
        const float tmp15 = std::exp(tmp14);
        return tmp15;
      };
      const float tmp17 = tmp13 ? tmp16() : -1.5f;
      out_ptr0[xcol + 35 * xrow] = tmp17;
    }
  }
}
