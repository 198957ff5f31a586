// softmax: fuses max, sum, div
// numel=9, rnumel=64; in_ptr0=x, out_ptr0=buf0, out_ptr1=buf1, out_ptr2=buf2
extern "C" void softmax_rows(const float* __restrict__ in_ptr0, float* out_ptr0, float* out_ptr1, float* out_ptr2, int64_t nthreads) {
  for (int64_t xindex = 0; xindex < 9; ++xindex) {
    alignas(64) float row4[64];
    {
      float acc1 = -std::numeric_limits<float>::infinity();
      kiln::Vec<float> acc1_vec = kiln::Vec<float>(-std::numeric_limits<float>::infinity());
      for (int64_t rindex = 0; rindex < 64; rindex += 16) {
        auto tmp0 = kiln::Vec<float>::loadu(in_ptr0 + rindex + 64 * xindex);
        acc1_vec = kiln::maximum(acc1_vec, tmp0);
      }
      acc1 = kiln::scalar_max(kiln::reduce_max(acc1_vec), acc1);
      out_ptr0[xindex] = acc1;
    }
    {
      float acc7 = static_cast<float>(0);
      kiln::Vec<float> acc7_vec = kiln::Vec<float>(static_cast<float>(0));
      auto tmp4 = kiln::Vec<float>(out_ptr0[xindex]);
      for (int64_t rindex = 0; rindex < 64; rindex += 16) {
        auto tmp3 = kiln::Vec<float>::loadu(in_ptr0 + rindex + 64 * xindex);
        auto tmp5 = tmp3 - tmp4;
        auto tmp6 = kiln::exp(tmp5);
        tmp6.store(row4 + rindex);
        acc7_vec = acc7_vec + tmp6;
      }
      acc7 = acc7 + kiln::reduce_sum(acc7_vec);
      out_ptr1[xindex] = acc7;
    }
    {
      auto tmp16 = kiln::Vec<float>(out_ptr1[xindex]);
      for (int64_t rindex = 0; rindex < 64; rindex += 16) {
        auto tmp15 = kiln::Vec<float>::loadu(row4 + rindex);
        auto tmp17 = tmp15 / tmp16;
        tmp17.store(out_ptr2 + rindex + 64 * xindex);
      }
    }
  }
}
