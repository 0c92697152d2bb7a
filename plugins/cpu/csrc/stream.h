/* In-order streams (one worker thread each, FIFO task queue) and events, with
 * CUDA-like semantics, entirely outside the GIL. */
#ifndef UNICCL_CPU_STREAM_H
#define UNICCL_CPU_STREAM_H

#include <stddef.h>
#include <stdint.h>

typedef struct uc_stream uc_stream;
typedef struct uc_event uc_event;

/* Kernels are passed in rather than linked, so that the stream module shares the
 * kernel module's single dispatch table (see _kernels.pxd). */
typedef int (*uc_reduce_fn)(void *dst, const void *a, const void *b, size_t n, int dtype, int op);
typedef int (*uc_scale_fn)(void *dst, const void *src, size_t n, int dtype, int64_t divisor);

/* First failure of asynchronous work since it was last reported. */
typedef struct {
    int status;       /* status.h code; UC_OK when nothing failed */
    const char *task; /* "reduce" or "scale" */
    int dtype;
    int64_t arg; /* op for reduce, divisor for scale */
} uc_error;

uc_stream *uc_stream_create(void); /* NULL when out of memory or threads */
/* Wait for all enqueued work, stop and join the worker, free the stream. */
uc_error uc_stream_destroy(uc_stream *s);
/* Wait for the work enqueued so far; return (and clear) its first failure. */
uc_error uc_stream_synchronize(uc_stream *s);

/* Enqueue work; UC_OK, or UC_ENOMEM with nothing enqueued. */
int uc_stream_copy(uc_stream *s, void *dst, const void *src, size_t nbytes);
int uc_stream_reduce(uc_stream *s, uc_reduce_fn fn, void *dst, const void *a, const void *b, size_t n,
                     int dtype, int op);
int uc_stream_scale(uc_stream *s, uc_scale_fn fn, void *dst, const void *src, size_t n, int dtype,
                    int64_t divisor);
/* The event completes when the work enqueued on s before it has. */
int uc_stream_record(uc_stream *s, uc_event *e);
/* Work enqueued on s later waits for the event's latest record (none: no wait). */
int uc_stream_wait(uc_stream *s, uc_event *e);

uc_event *uc_event_create(void);       /* NULL when out of memory */
void uc_event_destroy(uc_event *e);    /* safe while records of it are pending */
void uc_event_record_now(uc_event *e); /* record with no stream: completed at once */
int uc_event_query(uc_event *e);       /* 1 when the latest record completed or none exists */
void uc_event_synchronize(uc_event *e);

#endif
