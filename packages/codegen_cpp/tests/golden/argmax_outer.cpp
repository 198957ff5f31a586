// red_argmax: fuses argmax
// numel=21, rnumel=19; in_ptr0=x, out_ptr0=buf0
extern "C" void argmax_outer(const float* __restrict__ in_ptr0, int64_t* out_ptr0, int64_t nthreads) {
  for (int64_t xindex = 0; xindex < 16; xindex += 16) {
    {
      kiln::Vec<float> acc2_val_vec = kiln::Vec<float>(-std::numeric_limits<float>::infinity());
      kiln::Vec<int64_t> acc2_idx_vec = kiln::Vec<int64_t>(0);
      for (int64_t rindex = 0; rindex < 19; ++rindex) {
        auto tmp0 = kiln::Vec<float>::loadu(in_ptr0 + 21 * rindex + xindex);
        auto tmp1 = kiln::Vec<int64_t>(static_cast<int64_t>(rindex));
        kiln::arg_update<true>(acc2_val_vec, acc2_idx_vec, tmp0, tmp1);
      }
      acc2_idx_vec.store(out_ptr0 + xindex);
    }
  }
  for (int64_t xindex = 16; xindex < 21; ++xindex) {
    {
      float acc5_val = -std::numeric_limits<float>::infinity();
      int64_t acc5_idx = 0;
      kiln::Vec<float> acc5_val_vec = kiln::Vec<float>(-std::numeric_limits<float>::infinity());
      kiln::Vec<int64_t> acc5_idx_vec = kiln::Vec<int64_t>(0);
      for (int64_t rindex = 0; rindex < 16; rindex += 16) {
        auto tmp3 = kiln::Vec<float>::gather(in_ptr0 + 21 * rindex + xindex, 21);
        auto tmp4 = kiln::iota<int64_t>(static_cast<int64_t>(rindex), static_cast<int64_t>(1));
        kiln::arg_update<true>(acc5_val_vec, acc5_idx_vec, tmp3, tmp4);
      }
      for (int64_t rindex = 16; rindex < 19; ++rindex) {
        const float tmp6 = in_ptr0[21 * rindex + xindex];
        const int64_t tmp7 = static_cast<int64_t>(rindex);
        kiln::arg_update<true>(acc5_val, acc5_idx, tmp6, tmp7);
      }
      kiln::arg_lanes<true>(acc5_val, acc5_idx, acc5_val_vec, acc5_idx_vec);
      out_ptr0[xindex] = acc5_idx;
    }
  }
}
