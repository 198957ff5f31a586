// layer_norm: fuses welford_reduce, mul
// numel=6, rnumel=100; in_ptr0=x, in_ptr1=w, out_ptr0=buf0, out_ptr1=buf1, out_ptr2=buf2
extern "C" void layer_norm(const float* __restrict__ in_ptr0, const float* __restrict__ in_ptr1, float* out_ptr0, float* out_ptr1, float* out_ptr2, int64_t nthreads) {
  for (int64_t xindex = 0; xindex < 6; ++xindex) {
    {
      float acc1_mean = static_cast<float>(0);
      float acc1_m2 = static_cast<float>(0);
      float acc1_weight = static_cast<float>(0);
      kiln::Vec<float> acc1_mean_vec = kiln::Vec<float>(static_cast<float>(0));
      kiln::Vec<float> acc1_m2_vec = kiln::Vec<float>(static_cast<float>(0));
      kiln::Vec<float> acc1_weight_vec = kiln::Vec<float>(static_cast<float>(0));
      for (int64_t rindex = 0; rindex < 96; rindex += 16) {
        auto tmp0 = kiln::Vec<float>::loadu(in_ptr0 + rindex + 100 * xindex);
        kiln::welford_update<kiln::Vec<float>, float>(acc1_mean_vec, acc1_m2_vec, acc1_weight_vec, tmp0);
      }
      for (int64_t rindex = 96; rindex < 100; ++rindex) {
        const float tmp2 = in_ptr0[rindex + 100 * xindex];
        kiln::welford_update<float, float>(acc1_mean, acc1_m2, acc1_weight, tmp2);
      }
      kiln::welford_lanes(acc1_mean, acc1_m2, acc1_weight, acc1_mean_vec, acc1_m2_vec, acc1_weight_vec);
      out_ptr0[xindex] = acc1_mean;
      out_ptr1[xindex] = acc1_m2;
    }
    {
      auto tmp3 = kiln::Vec<float>(out_ptr1[xindex]);
      auto tmp4 = kiln::Vec<float>(100.0f);
      auto tmp5 = tmp3 / tmp4;
      auto tmp6 = kiln::Vec<float>(1e-05f);
      auto tmp7 = tmp5 + tmp6;
      auto tmp8 = kiln::sqrt(tmp7);
      auto tmp9 = kiln::Vec<float>(1) / tmp8;
      auto tmp11 = kiln::Vec<float>(out_ptr0[xindex]);
      for (int64_t rindex = 0; rindex < 96; rindex += 16) {
        auto tmp10 = kiln::Vec<float>::loadu(in_ptr0 + rindex + 100 * xindex);
        auto tmp12 = tmp10 - tmp11;
        auto tmp13 = tmp12 * tmp9;
        auto tmp14 = kiln::Vec<float>::loadu(in_ptr1 + rindex);
        auto tmp15 = tmp13 * tmp14;
        tmp15.store(out_ptr2 + rindex + 100 * xindex);
      }
      const float tmp16 = out_ptr1[xindex];
      const float tmp17 = tmp16 / 100.0f;
      const float tmp18 = tmp17 + 1e-05f;
      const float tmp19 = std::sqrt(tmp18);
      const float tmp20 = static_cast<float>(1) / tmp19;
      const float tmp22 = out_ptr0[xindex];
      for (int64_t rindex = 96; rindex < 100; ++rindex) {
        const float tmp21 = in_ptr0[rindex + 100 * xindex];
        const float tmp23 = tmp21 - tmp22;
        const float tmp24 = tmp23 * tmp20;
        const float tmp25 = in_ptr1[rindex];
        const float tmp26 = tmp24 * tmp25;
        out_ptr2[rindex + 100 * xindex] = tmp26;
      }
    }
  }
}
