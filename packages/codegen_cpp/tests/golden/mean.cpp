// mean: fuses sum, div
// numel=33, rnumel=18; in_ptr0=x, out_ptr0=buf0, out_ptr1=buf1
extern "C" void mean(const float* __restrict__ in_ptr0, float* out_ptr0, float* out_ptr1, int64_t nthreads) {
  for (int64_t xindex = 0; xindex < 33; ++xindex) {
    {
      float acc1 = static_cast<float>(0);
      kiln::Vec<float> acc1_vec = kiln::Vec<float>(static_cast<float>(0));
      for (int64_t rindex = 0; rindex < 16; rindex += 16) {
        auto tmp0 = kiln::Vec<float>::loadu(in_ptr0 + rindex + 18 * xindex);
        acc1_vec = acc1_vec + tmp0;
      }
      for (int64_t rindex = 16; rindex < 18; ++rindex) {
        const float tmp2 = in_ptr0[rindex + 18 * xindex];
        acc1 = acc1 + tmp2;
      }
      acc1 = acc1 + kiln::reduce_sum(acc1_vec);
      out_ptr0[xindex] = acc1;
    }
    const float tmp3 = out_ptr0[xindex];
    const float tmp4 = tmp3 / 18.0f;
    out_ptr1[xindex] = tmp4;
  }
}
