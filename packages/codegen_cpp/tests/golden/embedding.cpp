// embedding: fuses embedding
// numel=312, rnumel=1; in_ptr0=table, in_ptr1=idx, out_ptr0=buf0
extern "C" void embedding(const float* __restrict__ in_ptr0, const int64_t* __restrict__ in_ptr1, float* out_ptr0, int64_t nthreads) {
  for (int64_t xindex = 0; xindex < 312; ++xindex) {
    const int64_t tmp0 = in_ptr1[xindex / 24];
    const int64_t indirect1 = kiln::checked_index(tmp0, 50);
    const float tmp2 = in_ptr0[24 * indirect1 + xindex % 24];
    const float tmp3 = tmp2 * 2.0f;
    out_ptr0[xindex] = tmp3;
  }
}
