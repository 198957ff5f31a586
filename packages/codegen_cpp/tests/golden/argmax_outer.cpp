// red_argmax: fuses argmax
// numel=21, rnumel=19; in_ptr0=x, out_ptr0=buf0
extern "C" void argmax_outer(const float* __restrict__ in_ptr0, int64_t* out_ptr0, int64_t nthreads) {
  for (int64_t xindex = 0; xindex < 21; ++xindex) {
    {
      float acc2_val = -std::numeric_limits<float>::infinity();
      int64_t acc2_idx = 0;
      kiln::Vec<float> acc2_val_vec = kiln::Vec<float>(-std::numeric_limits<float>::infinity());
      kiln::Vec<int64_t> acc2_idx_vec = kiln::Vec<int64_t>(0);
      for (int64_t rindex = 0; rindex < 16; rindex += 16) {
        auto tmp0 = kiln::Vec<float>::gather(in_ptr0 + 21 * rindex + xindex, 21);
        auto tmp1 = kiln::iota<int64_t>(static_cast<int64_t>(rindex), static_cast<int64_t>(1));
        kiln::arg_update<true>(acc2_val_vec, acc2_idx_vec, tmp0, tmp1);
      }
      for (int64_t rindex = 16; rindex < 19; ++rindex) {
        const float tmp3 = in_ptr0[21 * rindex + xindex];
        const int64_t tmp4 = static_cast<int64_t>(rindex);
        kiln::arg_update<true>(acc2_val, acc2_idx, tmp3, tmp4);
      }
      kiln::arg_lanes<true>(acc2_val, acc2_idx, acc2_val_vec, acc2_idx_vec);
      out_ptr0[xindex] = acc2_idx;
    }
  }
}
