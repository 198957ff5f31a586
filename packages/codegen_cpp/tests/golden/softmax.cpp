// softmax: fuses max, sum, div
// numel=9, rnumel=53; in_ptr0=x, out_ptr0=buf0, out_ptr1=buf1, out_ptr2=buf2
extern "C" void softmax(const float* __restrict__ in_ptr0, float* out_ptr0, float* out_ptr1, float* out_ptr2, int64_t nthreads) {
  for (int64_t xindex = 0; xindex < 9; ++xindex) {
    alignas(64) float row7[53];
    alignas(64) float row4[53];
    {
      float acc1 = -std::numeric_limits<float>::infinity();
      kiln::Vec<float> acc1_vec = kiln::Vec<float>(-std::numeric_limits<float>::infinity());
      for (int64_t rindex = 0; rindex < 48; rindex += 16) {
        auto tmp0 = kiln::Vec<float>::loadu(in_ptr0 + rindex + 53 * xindex);
        acc1_vec = kiln::maximum(acc1_vec, tmp0);
      }
      for (int64_t rindex = 48; rindex < 53; ++rindex) {
        const float tmp2 = in_ptr0[rindex + 53 * xindex];
        acc1 = kiln::scalar_max(acc1, tmp2);
      }
      acc1 = kiln::scalar_max(kiln::reduce_max(acc1_vec), acc1);
      out_ptr0[xindex] = acc1;
    }
    {
      float acc7 = static_cast<float>(0);
      kiln::Vec<float> acc7_vec = kiln::Vec<float>(static_cast<float>(0));
      auto tmp4 = kiln::Vec<float>(out_ptr0[xindex]);
      for (int64_t rindex = 0; rindex < 48; rindex += 16) {
        auto tmp3 = kiln::Vec<float>::loadu(in_ptr0 + rindex + 53 * xindex);
        auto tmp5 = tmp3 - tmp4;
        auto tmp6 = kiln::exp(tmp5);
        tmp6.store(row4 + rindex);
        acc7_vec = acc7_vec + tmp6;
      }
      const float tmp9 = out_ptr0[xindex];
      for (int64_t rindex = 48; rindex < 53; ++rindex) {
        const float tmp8 = in_ptr0[rindex + 53 * xindex];
        const float tmp10 = tmp8 - tmp9;
        const float tmp11 = std::exp(tmp10);
        row7[rindex] = tmp11;
        acc7 = acc7 + tmp11;
      }
      acc7 = acc7 + kiln::reduce_sum(acc7_vec);
      out_ptr1[xindex] = acc7;
    }
    {
      auto tmp16 = kiln::Vec<float>(out_ptr1[xindex]);
      for (int64_t rindex = 0; rindex < 48; rindex += 16) {
        auto tmp15 = kiln::Vec<float>::loadu(row4 + rindex);
        auto tmp17 = tmp15 / tmp16;
        tmp17.store(out_ptr2 + rindex + 53 * xindex);
      }
      const float tmp22 = out_ptr1[xindex];
      for (int64_t rindex = 48; rindex < 53; ++rindex) {
        const float tmp21 = row7[rindex];
        const float tmp23 = tmp21 / tmp22;
        out_ptr2[rindex + 53 * xindex] = tmp23;
      }
    }
  }
}
