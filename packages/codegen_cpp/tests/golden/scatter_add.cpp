// scatter_add: fuses scatter
// numel=300, rnumel=1; in_ptr0=src, in_ptr1=idx, out_ptr0=t
extern "C" void scatter_add(const float* __restrict__ in_ptr0, const int64_t* __restrict__ in_ptr1, float* out_ptr0, int64_t nthreads) {
  for (int64_t xindex = 0; xindex < 300; ++xindex) {
    const float tmp0 = in_ptr0[xindex];
    const int64_t tmp1 = in_ptr1[xindex];
    const int64_t tmp2 = kiln::checked_index(tmp1, 20);
    #pragma omp atomic
    out_ptr0[tmp2] += tmp0;
  }
}
