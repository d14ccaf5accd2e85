// replay.cu: decode graphs replayed without capturing again.
//
// A recorder watches a batch's streams (main, side, second side). While it
// records, the work queued on them (kernels through ds4c_launch, memsets,
// memcpys, event records and waits) is logged instead of run: a kernel
// costs the host a copy of its arguments. ds4c_rec_launch then runs the
// log as a graph:
//
//   - when the caller's graph was built from a log of the same structure
//     (the same operations in the same order on the same streams: kernel
//     functions, argument sizes, events, copies), only the kernel nodes
//     whose launch configuration or argument bytes changed are set in place
//     (cudaGraphExecKernelNodeSetParams), and the graph is launched;
//   - otherwise the log is issued under stream capture, exactly as the
//     plain launches would have been queued, the node of each operation
//     noted (cudaStreamGetCaptureInfo right after it), and the graph built.
//
// A decode token's work differs from the previous token's in a handful of
// arguments (positions, row counts, ring offsets), so the host's cost per
// token falls from a capture record per kernel plus a whole-graph update
// (cudaGraphExecUpdate) to a memcmp per kernel and a few parameter sets.
// The kernels, their order and their dependencies are the capture's, so
// the results are bit-identical to plain launches.
#include <atomic>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <new>
#include <unordered_map>
#include <vector>

#include "common.cuh"

namespace {

enum { OP_KERNEL, OP_MEMSET, OP_MEMCPY, OP_RECORD, OP_WAIT };

// Op is one logged operation. Kernel arguments live in Log::blob at off
// (len bytes, each argument 16-byte aligned; their offsets relative to off
// in Log::offs from aoff).
struct Op {
    int kind = 0;
    int stream = 0; // 0 main, 1 side, 2 the second side stream (ds4c_rec::st)
    int pdl = 0;
    const void *fn = nullptr;
    dim3 grid, block;
    size_t smem = 0;
    uint32_t off = 0, len = 0, aoff = 0, nargs = 0;
    void *dst = nullptr;
    const void *src = nullptr;
    uint64_t bytes = 0;
    int value = 0;
    int cpkind = 0;
    void *event = nullptr;
};

struct Log {
    std::vector<Op> ops;
    std::vector<unsigned char> blob;
    std::vector<uint32_t> offs;
    void clear() {
        ops.clear();
        blob.clear();
        offs.clear();
    }
};

bool same_dim(dim3 a, dim3 b) { return a.x == b.x && a.y == b.y && a.z == b.z; }

// same_launch: the two kernel ops have the same grid, block and dynamic
// shared memory (a node set needs nothing else when their arguments agree).
bool same_launch(const Op &a, const Op &b) {
    return same_dim(a.grid, b.grid) && same_dim(a.block, b.block) && a.smem == b.smem;
}

// same_structure: the two ops become the same graph node, up to kernel
// launch configuration and argument values.
bool same_structure(const Op &a, const Op &b) {
    if (a.kind != b.kind || a.stream != b.stream) return false;
    switch (a.kind) {
    case OP_KERNEL:
        return a.fn == b.fn && a.pdl == b.pdl && a.nargs == b.nargs && a.len == b.len;
    case OP_MEMSET:
        return a.dst == b.dst && a.value == b.value && a.bytes == b.bytes;
    case OP_MEMCPY:
        return a.dst == b.dst && a.src == b.src && a.bytes == b.bytes && a.cpkind == b.cpkind;
    default:
        return a.event == b.event;
    }
}

} // namespace

constexpr int REC_STREAMS = 3;

struct ds4c_rec {
    cudaStream_t main = nullptr;
    cudaStream_t st[REC_STREAMS] = {}; // st[0] is main; a side stream not given is main
    bool has(cudaStream_t s) const {
        for (cudaStream_t x : st)
            if (x == s) return true;
        return false;
    }
    bool on = false;
    bool failed = false;
    Log log;
};

namespace {

// RGraph is an executable graph built from a log, with the log it runs
// now and the node of each of its operations (null for event operations).
struct RGraph {
    cudaGraph_t g = nullptr;
    cudaGraphExec_t e = nullptr;
    Log log;
    std::vector<cudaGraphNode_t> nodes;
    void drop() {
        if (e) cudaGraphExecDestroy(e);
        if (g) cudaGraphDestroy(g);
        e = nullptr;
        g = nullptr;
        nodes.clear();
    }
};

std::mutex g_mu;
std::vector<ds4c_rec *> g_active;
std::atomic<int> g_live{0};

void deactivate(ds4c_rec *r) {
    std::lock_guard<std::mutex> lk(g_mu);
    for (size_t i = 0; i < g_active.size(); i++) {
        if (g_active[i] == r) {
            g_active.erase(g_active.begin() + i);
            g_live.store((int)g_active.size(), std::memory_order_release);
            break;
        }
    }
    r->on = false;
}

void arg_ptrs(const Log &L, const Op &op, void **p) {
    for (uint32_t i = 0; i < op.nargs; i++) p[i] = (void *)(L.blob.data() + op.off + L.offs[op.aoff + i]);
}

constexpr int MAX_ARGS = 64;

// issue queues the log's operations on the recorder's streams; under
// capture, nodes (when not null) receives each operation's node.
int issue(ds4c_rec *r, const Log &L, std::vector<cudaGraphNode_t> *nodes) {
    if (nodes) nodes->assign(L.ops.size(), nullptr);
    for (size_t i = 0; i < L.ops.size(); i++) {
        const Op &op = L.ops[i];
        cudaStream_t st = r->st[op.stream];
        cudaError_t err = cudaSuccess;
        switch (op.kind) {
        case OP_KERNEL: {
            void *p[MAX_ARGS];
            arg_ptrs(L, op, p);
            ds4c_carveout(op.fn);
            cudaLaunchAttribute attr[1];
            attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            attr[0].val.programmaticStreamSerializationAllowed = op.pdl;
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = op.grid;
            cfg.blockDim = op.block;
            cfg.dynamicSmemBytes = op.smem;
            cfg.stream = st;
            cfg.attrs = attr;
            cfg.numAttrs = 1;
            err = cudaLaunchKernelExC(&cfg, op.fn, p);
            break;
        }
        case OP_MEMSET:
            err = cudaMemsetAsync(op.dst, op.value, op.bytes, st);
            break;
        case OP_MEMCPY:
            err = cudaMemcpyAsync(op.dst, op.src, op.bytes, (cudaMemcpyKind)op.cpkind, st);
            break;
        case OP_RECORD:
            err = cudaEventRecord((cudaEvent_t)op.event, st);
            break;
        case OP_WAIT:
            err = cudaStreamWaitEvent(st, (cudaEvent_t)op.event, 0);
            break;
        }
        if (err != cudaSuccess) return ds4c_cuda_err(err, "replay: issue");
        if (nodes && op.kind <= OP_MEMCPY) {
            cudaStreamCaptureStatus cs;
            const cudaGraphNode_t *deps = nullptr;
            size_t n = 0;
#if CUDART_VERSION >= 13000
            const cudaGraphEdgeData *ed = nullptr;
            err = cudaStreamGetCaptureInfo(st, &cs, nullptr, nullptr, &deps, &ed, &n);
#elif CUDART_VERSION >= 12030
            const cudaGraphEdgeData *ed = nullptr;
            err = cudaStreamGetCaptureInfo_v3(st, &cs, nullptr, nullptr, &deps, &ed, &n);
#else
            err = cudaStreamGetCaptureInfo_v2(st, &cs, nullptr, nullptr, &deps, &n);
#endif
            if (err != cudaSuccess) return ds4c_cuda_err(err, "replay: cudaStreamGetCaptureInfo");
            if (cs != cudaStreamCaptureStatusActive || n != 1)
                return ds4c_err(DS4C_EINVAL, "replay: op %zu left %zu capture dependencies", i, n);
            (*nodes)[i] = deps[0];
        }
    }
    return 0;
}

// edges_note (DS4_CUDA_REC_EDGES=1, a measuring aid; cuda/NOTES.md v68):
// after each build, the edges into each kernel function's nodes by kind —
// from kernel nodes: programmatic (an early launch at the upstream
// kernel's trigger), launch completion, full (the upstream kernel
// complete); and from other nodes — printed to stderr with the graph's
// node and edge counts. v68's traces saw a layer's first side-stream
// kernel start before hc_pre's end in some graphs and after it in others;
// this shows which edges each build made. Written after v68's last device
// call: not yet compiled by a CUDA 12.3+ toolkit.
void edges_note(const RGraph &G) {
    static const bool on = getenv("DS4_CUDA_REC_EDGES") && atoi(getenv("DS4_CUDA_REC_EDGES"));
    if (!on || !G.g) return;
#if CUDART_VERSION >= 12030
    size_t n = 0;
    auto edges = [&](cudaGraphNode_t *from, cudaGraphNode_t *to, cudaGraphEdgeData *data) {
#if CUDART_VERSION >= 13000
        return cudaGraphGetEdges(G.g, from, to, data, &n);
#else
        return cudaGraphGetEdges_v2(G.g, from, to, data, &n);
#endif
    };
    if (edges(nullptr, nullptr, nullptr) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    std::vector<cudaGraphNode_t> from(n), to(n);
    std::vector<cudaGraphEdgeData> data(n);
    if (n > 0 && edges(from.data(), to.data(), data.data()) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    std::unordered_map<cudaGraphNode_t, size_t> op_of; // a node's operation in G.log
    for (size_t i = 0; i < G.nodes.size(); i++)
        if (G.nodes[i]) op_of[G.nodes[i]] = i;
    struct Row {
        std::string name;
        long k[4];
    };
    std::vector<Row> rows;
    std::unordered_map<const void *, size_t> row_of; // a kernel function's row
    for (size_t e = 0; e < n; e++) {
        const auto t = op_of.find(to[e]);
        if (t == op_of.end() || G.log.ops[t->second].kind != OP_KERNEL) continue;
        const Op &op = G.log.ops[t->second];
        const auto f = op_of.find(from[e]);
        const bool from_kernel = f != op_of.end() && G.log.ops[f->second].kind == OP_KERNEL;
        int kind = 3;
        if (from_kernel)
            kind = data[e].type != cudaGraphDependencyTypeProgrammatic                ? 2
                   : data[e].from_port == cudaGraphKernelNodePortLaunchCompletion ? 1
                                                                                      : 0;
        auto r = row_of.find(op.fn);
        if (r == row_of.end()) {
            const char *name = nullptr;
            if (cudaFuncGetName(&name, op.fn) != cudaSuccess || !name) {
                (void)cudaGetLastError();
                name = "?";
            }
            r = row_of.emplace(op.fn, rows.size()).first;
            rows.push_back(Row{name, {0, 0, 0, 0}});
        }
        rows[r->second].k[kind]++;
    }
    fprintf(stderr,
            "replay edges: a graph of %zu nodes, %zu edges; into each kernel: programmatic, launch completion, full "
            "(from kernels), from other nodes\n",
            G.nodes.size(), n);
    for (const Row &r : rows)
        fprintf(stderr, "  %6ld %6ld %6ld %6ld  %s\n", r.k[0], r.k[1], r.k[2], r.k[3], r.name.c_str());
#else
    fprintf(stderr, "replay edges: edge data needs CUDA 12.3 or later\n");
#endif
}

// build captures the log into a new graph for G (replacing what G had).
int build(ds4c_rec *r, RGraph *G, Log &L) {
    G->drop();
    DS4C_CHECK(cudaStreamBeginCapture(r->main, cudaStreamCaptureModeRelaxed));
    int rc = issue(r, L, &G->nodes);
    cudaGraph_t g = nullptr;
    cudaError_t err = cudaStreamEndCapture(r->main, &g);
    if (rc != 0) {
        if (g) cudaGraphDestroy(g);
        (void)cudaGetLastError();
        G->nodes.clear();
        return rc;
    }
    if (err != cudaSuccess) return ds4c_cuda_err(err, "replay: cudaStreamEndCapture");
    G->g = g;
    err = cudaGraphInstantiateWithFlags(&G->e, g, 0);
    if (err != cudaSuccess) {
        G->e = nullptr;
        G->drop();
        return ds4c_cuda_err(err, "replay: cudaGraphInstantiate");
    }
    std::swap(G->log, L);
    edges_note(*G);
    return 0;
}

// Why the replays set nodes (DS4_CUDA_REC_WHY=1, a measuring aid): per
// kernel and reason — its launch shape, or the indices of the arguments
// whose bytes changed — the nodes set, printed to stderr every 20000 sets
// (the process may end without running exit handlers).
struct WhyTable {
    std::mutex mu;
    std::vector<std::pair<std::string, long>> rows;
    long total = 0;
};
WhyTable *why_table() {
    static WhyTable *t = getenv("DS4_CUDA_REC_WHY") && atoi(getenv("DS4_CUDA_REC_WHY")) ? new WhyTable : nullptr;
    return t;
}
void why_note(const Log &O, const Op &a, const Log &L, const Op &b) {
    WhyTable *t = why_table();
    if (!t) return;
    const char *name = nullptr;
    if (cudaFuncGetName(&name, b.fn) != cudaSuccess || !name) {
        (void)cudaGetLastError();
        name = "?";
    }
    std::string key = name;
    if (!same_launch(a, b)) key += " [launch shape]";
    std::string args;
    for (uint32_t i = 0; i < b.nargs; i++) {
        const uint32_t o0 = L.offs[b.aoff + i], o1 = i + 1 < b.nargs ? L.offs[b.aoff + i + 1] : b.len;
        if (memcmp(O.blob.data() + a.off + o0, L.blob.data() + b.off + o0, o1 - o0) != 0)
            args += (args.empty() ? "" : ",") + std::to_string(i);
    }
    if (!args.empty()) key += " args " + args;
    std::lock_guard<std::mutex> lk(t->mu);
    bool found = false;
    for (auto &r : t->rows)
        if (r.first == key) {
            r.second++;
            found = true;
            break;
        }
    if (!found) t->rows.emplace_back(key, 1);
    if (++t->total % 20000 == 0) {
        fprintf(stderr, "rec why: %ld node sets\n", t->total);
        for (auto &r : t->rows) fprintf(stderr, "rec why: %8ld  %s\n", r.second, r.first.c_str());
    }
}

// update sets in G's executable graph the kernel parameters that differ
// between G's log and L (same structure); returns the nodes set, or -1
// when the structure differs or a set failed.
int update(RGraph *G, Log &L) {
    const Log &O = G->log;
    if (!G->e || O.ops.size() != L.ops.size()) return -1;
    for (size_t i = 0; i < L.ops.size(); i++) {
        const Op &a = O.ops[i], &b = L.ops[i];
        if (!same_structure(a, b)) return -1;
        if (a.kind == OP_KERNEL && (a.nargs > 0 && memcmp(&O.offs[a.aoff], &L.offs[b.aoff], 4 * a.nargs) != 0))
            return -1;
    }
    int set = 0;
    // (DS4_CUDA_REC_SETALL=1, a measuring aid: every kernel node set, changed
    // or not — what a node set costs against a graph with any set node)
    static const bool set_all = getenv("DS4_CUDA_REC_SETALL") && atoi(getenv("DS4_CUDA_REC_SETALL"));
    for (size_t i = 0; i < L.ops.size(); i++) {
        const Op &a = O.ops[i], &b = L.ops[i];
        if (b.kind != OP_KERNEL) continue;
        if (!set_all && same_launch(a, b) &&
            (b.len == 0 || memcmp(O.blob.data() + a.off, L.blob.data() + b.off, b.len) == 0))
            continue;
        why_note(O, a, L, b);
        void *p[MAX_ARGS];
        arg_ptrs(L, b, p);
        cudaKernelNodeParams kp = {};
        kp.func = (void *)b.fn;
        kp.gridDim = b.grid;
        kp.blockDim = b.block;
        kp.sharedMemBytes = (unsigned)b.smem;
        kp.kernelParams = p;
        if (cudaGraphExecKernelNodeSetParams(G->e, G->nodes[i], &kp) != cudaSuccess) {
            (void)cudaGetLastError();
            return -1;
        }
        set++;
    }
    std::swap(G->log, L);
    return set;
}

} // namespace

int ds4c_rec_any(void) { return g_live.load(std::memory_order_acquire); }

ds4c_rec *ds4c_rec_of(cudaStream_t s) {
    std::lock_guard<std::mutex> lk(g_mu);
    for (ds4c_rec *r : g_active)
        if (r->has(s)) return r;
    return nullptr;
}

static Op *rec_op(ds4c_rec *r, cudaStream_t s, int kind) {
    try {
        r->log.ops.emplace_back();
    } catch (...) {
        r->failed = true;
        return nullptr;
    }
    Op *op = &r->log.ops.back();
    op->kind = kind;
    op->stream = 0;
    for (int i = REC_STREAMS - 1; i > 0; i--)
        if (s == r->st[i] && s != r->main) {
            op->stream = i;
            break;
        }
    return op;
}

void ds4c_rec_kernel(ds4c_rec *r, cudaStream_t s, const void *fn, dim3 grid, dim3 block, size_t smem, int pdl,
                     int nargs, void *const *args, const size_t *sizes) {
    if (nargs > MAX_ARGS) {
        r->failed = true;
        return;
    }
    Op *op = rec_op(r, s, OP_KERNEL);
    if (!op) return;
    op->fn = fn;
    op->grid = grid;
    op->block = block;
    op->smem = smem;
    op->pdl = pdl;
    op->nargs = (uint32_t)nargs;
    Log &L = r->log;
    op->off = (uint32_t)L.blob.size();
    op->aoff = (uint32_t)L.offs.size();
    try {
        uint32_t at = 0;
        for (int i = 0; i < nargs; i++) {
            L.offs.push_back(at);
            at += (uint32_t)((sizes[i] + 15) & ~(size_t)15);
        }
        L.blob.resize(op->off + at, 0);
        for (int i = 0; i < nargs; i++) memcpy(L.blob.data() + op->off + L.offs[op->aoff + i], args[i], sizes[i]);
        op->len = at;
    } catch (...) {
        r->failed = true;
    }
}

int ds4c_rec_event(ds4c_rec *r, cudaStream_t s, void *event, int wait) {
    Op *op = rec_op(r, s, wait ? OP_WAIT : OP_RECORD);
    if (!op) return ds4c_err((int)cudaErrorMemoryAllocation, "replay: log");
    op->event = event;
    return 0;
}

int ds4c_rec_memset(ds4c_rec *r, cudaStream_t s, void *dst, int value, uint64_t bytes) {
    Op *op = rec_op(r, s, OP_MEMSET);
    if (!op) return ds4c_err((int)cudaErrorMemoryAllocation, "replay: log");
    op->dst = dst;
    op->value = value;
    op->bytes = bytes;
    return 0;
}

int ds4c_rec_memcpy(ds4c_rec *r, cudaStream_t s, void *dst, const void *src, uint64_t bytes, int kind) {
    Op *op = rec_op(r, s, OP_MEMCPY);
    if (!op) return ds4c_err((int)cudaErrorMemoryAllocation, "replay: log");
    op->dst = dst;
    op->src = src;
    op->bytes = bytes;
    op->cpkind = kind;
    return 0;
}

int ds4c_rec_create(void *main, void *side, void *side2, void **rec) {
    DS4C_READY();
    *rec = nullptr;
    if (!main) return ds4c_err(DS4C_EINVAL, "replay: recorder on the default stream");
    ds4c_rec *r = new (std::nothrow) ds4c_rec;
    if (!r) return ds4c_err((int)cudaErrorMemoryAllocation, "replay: recorder");
    r->main = as_stream(main);
    r->st[0] = r->main;
    r->st[1] = side ? as_stream(side) : r->main;
    r->st[2] = side2 ? as_stream(side2) : r->main;
    *rec = r;
    return 0;
}

int ds4c_rec_destroy(void *rec) {
    if (!rec) return 0;
    ds4c_rec *r = (ds4c_rec *)rec;
    if (r->on) deactivate(r);
    delete r;
    return 0;
}

int ds4c_rec_begin(void *rec) {
    DS4C_READY();
    ds4c_rec *r = (ds4c_rec *)rec;
    if (r->on) return ds4c_err(DS4C_EINVAL, "replay: recorder already recording");
    std::lock_guard<std::mutex> lk(g_mu);
    for (ds4c_rec *o : g_active)
        for (cudaStream_t x : r->st)
            if (o->has(x)) return ds4c_err(DS4C_EINVAL, "replay: a stream already recorded");
    r->log.clear();
    r->failed = false;
    r->on = true;
    g_active.push_back(r);
    g_live.store((int)g_active.size(), std::memory_order_release);
    return 0;
}

int ds4c_rec_abort(void *rec) {
    ds4c_rec *r = (ds4c_rec *)rec;
    if (r && r->on) deactivate(r);
    if (r) r->log.clear();
    return 0;
}

int ds4c_rec_launch(void *rec, void **graph, int *stats) {
    DS4C_READY();
    ds4c_rec *r = (ds4c_rec *)rec;
    if (!r->on) return ds4c_err(DS4C_EINVAL, "replay: recorder not recording");
    deactivate(r);
    stats[0] = 0;
    stats[1] = 0;
    stats[2] = (int)r->log.ops.size();
    if (r->failed) {
        r->log.clear();
        return ds4c_err((int)cudaErrorMemoryAllocation, "replay: logging the work failed");
    }
    RGraph *G = (RGraph *)*graph;
    if (!G) {
        G = new (std::nothrow) RGraph;
        if (!G) return ds4c_err((int)cudaErrorMemoryAllocation, "replay: graph");
        *graph = G;
    }
    int set = update(G, r->log);
    if (set < 0) {
        int rc = build(r, G, r->log);
        r->log.clear();
        if (rc != 0) return rc;
        stats[0] = 1;
    } else {
        stats[1] = set;
    }
    r->log.clear();
    DS4C_CHECK(cudaGraphLaunch(G->e, r->main));
    return 0;
}

int ds4c_rgraph_destroy(void *graph) {
    RGraph *G = (RGraph *)graph;
    if (!G) return 0;
    G->drop();
    delete G;
    return 0;
}
