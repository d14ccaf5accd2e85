// mv_iq2_xxs.cu: matrix-product kernels for one weight type (see matvec.cuh).
#include "matvec.cuh"

namespace ds4mv {

int launch_iq2_xxs(const MVArgs &a, int n_sel, int nt, bool exact, cudaStream_t st) { return launch_type<TIQ2_XXS>(a, n_sel, nt, exact, st); }
bool dec_iq2_xxs(const MVArgs &a, int n_sel, bool exact, cudaStream_t st, int *rc) {
    return launch_dec<TIQ2_XXS>(a, n_sel, exact, st, rc);
}

} // namespace ds4mv
