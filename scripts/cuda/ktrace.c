// ktrace.c: a CUPTI injection library that records every kernel's start and
// end (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: kernels inside CUDA graphs,
// pipelined as they really run) and writes them as CSV lines
// "start_ns,end_ns,stream,name" to $KTRACE_OUT. Loaded by the driver through
// CUDA_INJECTION64_PATH, so the traced program needs no change. Records are
// flushed every 20 ms (a Go program exits without running atexit), so the
// last few milliseconds of a run may be missing. Records CUPTI had to drop
// are reported on stderr ("ktrace: N kernel records dropped").
//   KSTRUCT: the newest CUpti_ActivityKernelN of this CUDA (ktrace.sh finds it)
//   gcc -O2 -shared -fPIC -DKSTRUCT=CUpti_ActivityKernel9 -I$CUPTI/include ktrace.c -L$CUPTI/lib64 -lcupti -o libktrace.so
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef KSTRUCT
#error "define KSTRUCT"
#endif

static FILE *out;

static void CUPTIAPI buf_request(uint8_t **buf, size_t *size, size_t *max_records) {
    *size = 1u << 20;
    *buf = (uint8_t *)aligned_alloc(64, *size);
    *max_records = 0;
}

static void CUPTIAPI buf_complete(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    (void)size;
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped > 0)
        fprintf(stderr, "ktrace: %zu kernel records dropped (stream %u)\n", dropped, (unsigned)stream);
    CUpti_Activity *rec = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && out) {
            const KSTRUCT *k = (const KSTRUCT *)rec;
            fprintf(out, "%llu,%llu,%u,\"%s\"\n", (unsigned long long)k->start, (unsigned long long)k->end,
                    (unsigned)k->streamId, k->name ? k->name : "?");
        }
    }
    if (out) fflush(out);
    free(buf);
}

static void flush_at_exit(void) {
    cuptiActivityFlushAll(1);
    if (out) fclose(out);
    out = NULL;
}

int InitializeInjection(void) {
    const char *path = getenv("KTRACE_OUT");
    out = fopen(path ? path : "ktrace.csv", "w");
    if (!out) return 0;
    fprintf(out, "start,end,stream,name\n");
    cuptiActivityRegisterCallbacks(buf_request, buf_complete);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    cuptiActivityFlushPeriod(20);
    atexit(flush_at_exit);
    return 1;
}
