// mv_q2_k.cu: matrix-product kernels for one weight type (see matvec.cuh).
#include "matvec.cuh"

namespace ds4mv {

int launch_q2_k(const MVArgs &a, int n_sel, int nt, bool exact, cudaStream_t st) { return launch_type<TQ2_K>(a, n_sel, nt, exact, st); }
bool dec_q2_k(const MVArgs &a, int n_sel, bool exact, cudaStream_t st, int *rc) {
    return launch_dec<TQ2_K>(a, n_sel, exact, st, rc);
}

} // namespace ds4mv
