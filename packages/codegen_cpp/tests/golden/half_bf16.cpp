// half_torch_bfloat16: fuses pw
// numel=77, rnumel=1; in_ptr0=a, out_ptr0=buf0, out_ptr1=buf1
extern "C" void half_bf16(const kiln::bf16_t* __restrict__ in_ptr0, kiln::bf16_t* out_ptr0, float* out_ptr1, int64_t nthreads) {
  auto tmp2 = kiln::Vec<float>(3.0f);
  for (int64_t xindex = 0; xindex < 64; xindex += 16) {
    auto tmp0 = kiln::load_bf16(in_ptr0 + xindex);
    auto tmp1 = tmp0;
    auto tmp3 = tmp1 * tmp2;
    auto tmp4 = kiln::round_to_bf16(tmp3);
    kiln::store_bf16(out_ptr0 + xindex, tmp4);
    auto tmp5 = tmp4;
    auto tmp6 = kiln::sigmoid(tmp1);
    auto tmp7 = tmp5 + tmp6;
    tmp7.store(out_ptr1 + xindex);
  }
  for (int64_t xindex = 64; xindex < 77; ++xindex) {
    const float tmp8 = kiln::bf16_to_float(in_ptr0[xindex]);
    const float tmp9 = tmp8 * 3.0f;
    const float tmp10 = kiln::round_to_bf16(static_cast<float>(tmp9));
    out_ptr0[xindex] = kiln::float_to_bf16(tmp10);
    const float tmp11 = kiln::sigmoid(tmp8);
    const float tmp12 = tmp10 + tmp11;
    out_ptr1[xindex] = tmp12;
  }
}
