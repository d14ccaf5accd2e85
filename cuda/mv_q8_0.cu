// mv_q8_0.cu: matrix-product kernels for one weight type (see matvec.cuh).
#include "matvec.cuh"

namespace ds4mv {

int launch_q8_0(const MVArgs &a, int n_sel, int nt, bool exact, cudaStream_t st) { return launch_type<TQ8_0>(a, n_sel, nt, exact, st); }
bool pipe_q8_0_f32(const MVArgs &a, const float *xf, const float *nw, float eps, bool exact, bool room, cudaStream_t st,
                   int *rc, int n) {
    return launch_pipe<TQ8_0>(a, 1, exact, st, rc, xf, nw, eps, room, nullptr, n);
}

bool pipe_q8_0_q8out(const MVArgs &a, int n_sel, uint8_t *yq, bool exact, cudaStream_t st, int *rc, int nt) {
    return launch_pipe<TQ8_0>(a, n_sel, exact, st, rc, nullptr, nullptr, 0.f, false, yq, nt);
}

} // namespace ds4mv
