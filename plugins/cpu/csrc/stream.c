#define _GNU_SOURCE /* pthread_setname_np */
/* Streams and events.  A stream is a FIFO of tasks run by its own pthread, so
 * tasks complete in issue order.  Each record of an event creates a marker that
 * the record task completes; the event points at its latest marker, and waits
 * hold a reference to the marker current when they were issued (CUDA semantics:
 * re-recording an event does not change what earlier waits wait for). */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"
#include "stream.h"

/* ------------------------------------------------------------------ markers */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    int refs;
} marker;

static marker *marker_new(int refs) {
    marker *m = calloc(1, sizeof *m);
    if (m) {
        pthread_mutex_init(&m->mu, NULL);
        pthread_cond_init(&m->cv, NULL);
        m->refs = refs;
    }
    return m;
}

static void marker_release(marker *m) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    int last = --m->refs == 0;
    pthread_mutex_unlock(&m->mu);
    if (last) {
        pthread_mutex_destroy(&m->mu);
        pthread_cond_destroy(&m->cv);
        free(m);
    }
}

static void marker_complete(marker *m) {
    pthread_mutex_lock(&m->mu);
    m->done = 1;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
}

static int marker_done(marker *m) {
    pthread_mutex_lock(&m->mu);
    int done = m->done;
    pthread_mutex_unlock(&m->mu);
    return done;
}

static void marker_wait(marker *m) {
    pthread_mutex_lock(&m->mu);
    while (!m->done)
        pthread_cond_wait(&m->cv, &m->mu);
    pthread_mutex_unlock(&m->mu);
}

/* ------------------------------------------------------------------- events */
struct uc_event {
    pthread_mutex_t mu;
    marker *latest; /* NULL: never recorded, or recorded without a stream */
};

uc_event *uc_event_create(void) {
    uc_event *e = calloc(1, sizeof *e);
    if (e) pthread_mutex_init(&e->mu, NULL);
    return e;
}

void uc_event_destroy(uc_event *e) {
    marker_release(e->latest);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

/* Make m (already holding the event's reference) the latest record. */
static void event_set_latest(uc_event *e, marker *m) {
    pthread_mutex_lock(&e->mu);
    marker *old = e->latest;
    e->latest = m;
    pthread_mutex_unlock(&e->mu);
    marker_release(old);
}

/* The latest marker with a reference for the caller, or NULL. */
static marker *event_acquire_latest(uc_event *e) {
    pthread_mutex_lock(&e->mu);
    marker *m = e->latest;
    if (m) {
        pthread_mutex_lock(&m->mu);
        m->refs++;
        pthread_mutex_unlock(&m->mu);
    }
    pthread_mutex_unlock(&e->mu);
    return m;
}

void uc_event_record_now(uc_event *e) {
    event_set_latest(e, NULL);
}

int uc_event_query(uc_event *e) {
    marker *m = event_acquire_latest(e);
    int done = 1;
    if (m) {
        done = marker_done(m);
        marker_release(m);
    }
    return done;
}

void uc_event_synchronize(uc_event *e) {
    marker *m = event_acquire_latest(e);
    if (m) {
        marker_wait(m);
        marker_release(m);
    }
}

/* ------------------------------------------------------------------ streams */
enum { T_COPY, T_REDUCE, T_SCALE, T_RECORD, T_WAIT };

typedef struct task {
    struct task *next;
    int kind;
    void *dst;
    const void *a, *b;
    size_t n;
    int dtype;
    int64_t arg; /* op for reduce, divisor for scale */
    uc_reduce_fn reduce;
    uc_scale_fn scale;
    marker *marker; /* record and wait tasks own one reference */
} task;

struct uc_stream {
    pthread_mutex_t mu;
    pthread_cond_t work; /* tasks queued or stopping */
    pthread_cond_t idle; /* a task finished */
    task *head, *tail;
    uint64_t issued, done;
    int stopping;
    uc_error err;
    pthread_t thread;
};

static int run(task *t) {
    switch (t->kind) {
    case T_COPY: memcpy(t->dst, t->a, t->n); return UC_OK;
    case T_REDUCE: return t->reduce(t->dst, t->a, t->b, t->n, t->dtype, (int)t->arg);
    case T_SCALE: return t->scale(t->dst, t->a, t->n, t->dtype, t->arg);
    case T_RECORD: marker_complete(t->marker); break;
    case T_WAIT: marker_wait(t->marker); break;
    }
    marker_release(t->marker);
    return UC_OK;
}

static void *worker(void *arg) {
    uc_stream *s = arg;
    /* no signal for this thread: a process-directed one (Ctrl-C) must wake the caller's main
     * thread, which runs Python's handlers; one taken here would leave it asleep */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    pthread_setname_np(pthread_self(), "uniccl-stream"); /* what tools (and the tests) see */
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stopping)
            pthread_cond_wait(&s->work, &s->mu);
        task *t = s->head;
        if (!t) break; /* stopping and drained */
        s->head = t->next;
        if (!s->head) s->tail = NULL;
        pthread_mutex_unlock(&s->mu);

        int status = run(t);

        pthread_mutex_lock(&s->mu);
        if (status != UC_OK && s->err.status == UC_OK)
            s->err = (uc_error){status, t->kind == T_REDUCE ? "reduce" : "scale", t->dtype, t->arg};
        s->done++;
        pthread_cond_broadcast(&s->idle);
        free(t);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

uc_stream *uc_stream_create(void) {
    uc_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->idle, NULL);
    if (pthread_create(&s->thread, NULL, worker, s) != 0) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->work);
        pthread_cond_destroy(&s->idle);
        free(s);
        return NULL;
    }
    return s;
}

uc_error uc_stream_destroy(uc_stream *s) {
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    uc_error err = s->err;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->idle);
    free(s);
    return err;
}

uc_error uc_stream_synchronize(uc_stream *s) {
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->issued;
    while (s->done < target)
        pthread_cond_wait(&s->idle, &s->mu);
    uc_error err = s->err;
    s->err.status = UC_OK;
    pthread_mutex_unlock(&s->mu);
    return err;
}

static task *task_new(int kind) {
    task *t = calloc(1, sizeof *t);
    if (t) t->kind = kind;
    return t;
}

static void push(uc_stream *s, task *t) {
    pthread_mutex_lock(&s->mu);
    if (s->tail)
        s->tail->next = t;
    else
        s->head = t;
    s->tail = t;
    s->issued++;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
}

int uc_stream_copy(uc_stream *s, void *dst, const void *src, size_t nbytes) {
    task *t = task_new(T_COPY);
    if (!t) return UC_ENOMEM;
    t->dst = dst;
    t->a = src;
    t->n = nbytes;
    push(s, t);
    return UC_OK;
}

int uc_stream_reduce(uc_stream *s, uc_reduce_fn fn, void *dst, const void *a, const void *b, size_t n,
                     int dtype, int op) {
    task *t = task_new(T_REDUCE);
    if (!t) return UC_ENOMEM;
    t->reduce = fn;
    t->dst = dst;
    t->a = a;
    t->b = b;
    t->n = n;
    t->dtype = dtype;
    t->arg = op;
    push(s, t);
    return UC_OK;
}

int uc_stream_scale(uc_stream *s, uc_scale_fn fn, void *dst, const void *src, size_t n, int dtype,
                    int64_t divisor) {
    task *t = task_new(T_SCALE);
    if (!t) return UC_ENOMEM;
    t->scale = fn;
    t->dst = dst;
    t->a = src;
    t->n = n;
    t->dtype = dtype;
    t->arg = divisor;
    push(s, t);
    return UC_OK;
}

int uc_stream_record(uc_stream *s, uc_event *e) {
    task *t = task_new(T_RECORD);
    marker *m = t ? marker_new(2) : NULL; /* one reference for the task, one for the event */
    if (!m) {
        free(t);
        return UC_ENOMEM;
    }
    t->marker = m;
    event_set_latest(e, m);
    push(s, t);
    return UC_OK;
}

int uc_stream_wait(uc_stream *s, uc_event *e) {
    marker *m = event_acquire_latest(e);
    if (!m) return UC_OK;
    if (marker_done(m)) { /* nothing to wait for: keep the queue short */
        marker_release(m);
        return UC_OK;
    }
    task *t = task_new(T_WAIT);
    if (!t) {
        marker_release(m);
        return UC_ENOMEM;
    }
    t->marker = m;
    push(s, t);
    return UC_OK;
}
