// mv_float.cu: matrix-product kernels for F32, F16 and BF16 weights (see
// matvec.cuh).
#include "fexact.cuh"

namespace ds4mv {

int launch_float(int type, const MVArgs &a, int n_sel, int nt, bool exact, cudaStream_t st) {
    if (exact) {
        switch (type) {
        case DS4C_F32: return launch_fexact<0>(a, n_sel, nt, st);
        case DS4C_F16: return launch_fexact<1>(a, n_sel, nt, st);
        case DS4C_BF16: return launch_fexact<2>(a, n_sel, nt, st);
        }
    }
    switch (type) {
    case DS4C_F32: return launch_type<TF32>(a, n_sel, nt, false, st);
    case DS4C_F16: return launch_type<TF16>(a, n_sel, nt, false, st);
    case DS4C_BF16: return launch_type<TBF16>(a, n_sel, nt, false, st);
    }
    return ds4c_err(DS4C_ETYPE, "unsupported weight type %d", type);
}

} // namespace ds4mv
