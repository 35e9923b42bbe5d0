/*
 * A minimal ITT collector: what VTune's libittnotify collector is to torch's ITT calls, minus VTune.
 *
 * libtorch carries ITT's static part. On the first task call it dlopen()s the library named by
 * INTEL_LIBITTNOTIFY64 and, because this library exports __itt_api_version (a "version 1"
 * collector), binds every ITT function of the groups in INTEL_ITTNOTIFY_GROUPS to this library's
 * symbol of the same name. Defined here: domain and string-handle creation (once a collector is
 * loaded, the static part leaves them to it and would hand torch NULL handles) and task begin/end.
 *
 * Each task begin/end is one line appended to $KIT_ITT_DIR/itt-<pid>.tsv with a single write(2)
 * (O_APPEND: whole lines, no lock, nothing buffered to lose when a worker is killed):
 *     B <tid> <CLOCK_MONOTONIC ns> <name>
 *     E <tid> <CLOCK_MONOTONIC ns>
 * kit/itt.py builds this file with the system compiler and reads the records back.
 *
 * Only the domains named in $KIT_ITT_DOMAINS (comma-separated; kit/itt.py: torch's "PyTorch") are
 * recorded, and the others are created disabled, so that ITT's callers skip their calls altogether
 * (flags 0). OpenVINO and TBB carry ITT too: TBB sets its own domains' flags and records a task per
 * parallel loop, OpenVINO asks for string handles per node it runs.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ITT's structs, field for field (ittnotify.h): callers read a domain's flags (0 = disabled). */
typedef struct kit_itt_domain {
    volatile int flags;
    const char *name;
    void *name_w;
    int extra1;
    void *extra2;
    struct kit_itt_domain *next;
} kit_itt_domain;
typedef struct kit_itt_string_handle {
    const char *str;
    void *str_w;
    int extra1;
    void *extra2;
    struct kit_itt_string_handle *next;
} kit_itt_string_handle;
typedef struct kit_itt_id { unsigned long long d1, d2, d3; } kit_itt_id;

static int out_fd = -2; /* -2: not opened yet; -1: no KIT_ITT_DIR, or it could not be opened */

static int output(void) {
    if (out_fd == -2) {
        const char *dir = getenv("KIT_ITT_DIR");
        char path[4096];
        out_fd = -1;
        if (dir && snprintf(path, sizeof path, "%s/itt-%d.tsv", dir, (int)getpid()) < (int)sizeof path)
            out_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    }
    return out_fd;
}

static void record(char kind, const char *name) {
    struct timespec now;
    char line[512];
    int fd = output(), length;
    if (fd < 0)
        return;
    clock_gettime(CLOCK_MONOTONIC, &now);
    length = snprintf(line, sizeof line, "%c\t%ld\t%lld%s%.400s\n", kind, (long)syscall(SYS_gettid),
                      (long long)now.tv_sec * 1000000000LL + now.tv_nsec, name ? "\t" : "", name ? name : "");
    if (length > 0 && write(fd, line, (size_t)length) < 0)
        return; /* nowhere to report it: the trace is simply short */
}

/* Handles live as long as the process. OpenVINO asks for a string handle by name on every node it
 * runs (hundreds per inference, each name once more): they are found by hash, not by a list walk. */
#define BUCKETS 4096
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
/* The domain ITT's callers see, and whether this collector records it: kept apart from the flags,
 * which a caller may set itself (TBB turns its own domains' flags on after creating them). */
typedef struct kit_domain {
    kit_itt_domain itt; /* first: callers get a pointer to it */
    int recorded;
} kit_domain;
static kit_itt_domain *domains;
static kit_itt_string_handle *strings[BUCKETS];

static unsigned bucket(const char *name) {
    unsigned hash = 2166136261u; /* FNV-1a */
    for (; *name; name++)
        hash = (hash ^ (unsigned char)*name) * 16777619u;
    return hash % BUCKETS;
}

const char *__itt_api_version(void) { return "kit-itt-collector 1"; }

/* Whether `name` is one of the comma-separated $KIT_ITT_DOMAINS. */
static int enabled(const char *name) {
    const char *list = getenv("KIT_ITT_DOMAINS"), *start;
    size_t length = strlen(name);
    for (start = list; start && *start; start = strchr(start, ',') ? strchr(start, ',') + 1 : NULL) {
        const char *end = strchr(start, ',');
        if ((end ? (size_t)(end - start) : strlen(start)) == length && !strncmp(start, name, length))
            return 1;
    }
    return 0;
}

kit_itt_domain *__itt_domain_create(const char *name) {
    kit_itt_domain *d;
    kit_domain *created;
    if (!name)
        return NULL;
    pthread_mutex_lock(&lock);
    for (d = domains; d && strcmp(d->name, name); d = d->next) {}
    if (!d && (created = calloc(1, sizeof *created)) && (created->itt.name = strdup(name))) {
        d = &created->itt;
        created->recorded = d->flags = enabled(name);
        d->next = domains;
        domains = d;
    }
    pthread_mutex_unlock(&lock);
    return d;
}

static int recorded(const kit_itt_domain *domain) {
    return domain && ((const kit_domain *)domain)->recorded;
}

kit_itt_string_handle *__itt_string_handle_create(const char *name) {
    kit_itt_string_handle *h;
    unsigned b;
    if (!name)
        return NULL;
    b = bucket(name);
    pthread_mutex_lock(&lock);
    for (h = strings[b]; h && strcmp(h->str, name); h = h->next) {}
    if (!h && (h = calloc(1, sizeof *h)) && (h->str = strdup(name))) {
        h->next = strings[b];
        strings[b] = h;
    }
    pthread_mutex_unlock(&lock);
    return h;
}

/* A caller that ignores the flags, or sets them itself, still records nothing for another domain. */
void __itt_task_begin(const kit_itt_domain *domain, kit_itt_id id, kit_itt_id parent, kit_itt_string_handle *name) {
    (void)id; (void)parent;
    if (recorded(domain))
        record('B', name ? name->str : "?");
}

void __itt_task_end(const kit_itt_domain *domain) {
    if (recorded(domain))
        record('E', NULL);
}
