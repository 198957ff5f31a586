// strided: fuses pw
// numel=960, rnumel=1; in_ptr0=a, in_ptr1=b, out_ptr0=buf0
extern "C" void strided(const float* __restrict__ in_ptr0, const float* __restrict__ in_ptr1, float* out_ptr0, int64_t nthreads) {
  for (int64_t xindex = 0; xindex < 960; xindex += 16) {
    auto tmp0 = kiln::Vec<float>::loadu(in_ptr0 + xindex);
    auto tmp1 = kiln::tanh(tmp0);
    auto tmp2 = kiln::from_lanes<float>([&](int64_t lane) { return in_ptr1[(lane + xindex) / 24 + 40 * ((lane + xindex) % 24)]; });
    auto tmp3 = tmp1 + tmp2;
    tmp3.store(out_ptr0 + xindex);
  }
}
