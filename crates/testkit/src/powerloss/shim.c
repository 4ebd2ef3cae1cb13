/* The power-loss layer's interposer (see powerloss.rs): preloaded into a member, it journals
 * enough to undo every write to a regular file under $ETCDRS_POWER_DIR that no fsync or
 * fdatasync has covered yet, and every change of a directory entry there (a file created,
 * a directory made or removed, a rename, an unlink) that no fsync of the directory has
 * covered yet. Each record is appended to $ETCDRS_POWER_JOURNAL with one write(2): a write's
 * before the write (it holds the bytes the write replaces), a directory change's after it
 * succeeded. Page-cache durability of the journal is enough, since the "power cut" is a
 * SIGKILL followed by the undo, done by the test.
 *
 * An unlinked file, or one a rename replaces, is kept as a hard link in $ETCDRS_POWER_STASH
 * until the cut, so that the cut can bring it back.
 *
 * Records: u8 kind, then fields; a string is u32 length and bytes; numbers are u64;
 * little-endian, as the machine. An inode is dev, ino.
 *   'W' path, inode, offset, size before, string: bytes at [offset, offset+len) before
 *   'S' path, inode             (the file's data is durable)
 *   'D' path                    (the directory's entries are durable)
 *   'C' path, inode             (a file created)
 *   'M' path                    (a directory made)
 *   'X' path                    (a directory removed)
 *   'R' from, to, stash, inode, inode  (a rename: the file moved and the one it replaced,
 *                                       stash "" and inode 0, 0 when it replaced nothing)
 *   'U' path, stash, inode      (an unlink; stash "" when no link could be kept)
 *
 * The stop at a sync: while the file $ETCDRS_POWER_STOP exists, the first thread to fsync or
 * fdatasync a watched regular file whose path contains what the stop file holds (anything,
 * when it is empty) removes it, writes that file's path to $ETCDRS_POWER_STOP.at and stops
 * its process (SIGSTOP) before the sync, so that the test's SIGKILL then finds the file's
 * latest writes unsynced.
 *
 * The slow disk: while the file $ETCDRS_POWER_DELAY exists, holding a number of microseconds
 * and, on the next line, part of a path, every fsync or fdatasync of a watched regular file
 * whose path contains that part sleeps that long before it syncs (outside the journal's
 * lock: other files' syncs do not queue behind it). A stalled disk, not a failing one. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static int (*real_ftruncate64)(int, off_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_openat64)(int, const char *, int, ...);
static int (*real_renameat2)(int, const char *, int, const char *, unsigned int);
static int (*real_unlinkat)(int, const char *, int);
static int (*real_mkdirat)(int, const char *, mode_t);
static int journal = -1;
static unsigned long stash_seq;

static void init(void) {
    if (real_write) return;
    real_pwrite64 = (ssize_t (*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, "pwrite64");
    real_writev = (ssize_t (*)(int, const struct iovec *, int))dlsym(RTLD_NEXT, "writev");
    real_ftruncate64 = (int (*)(int, off_t))dlsym(RTLD_NEXT, "ftruncate64");
    real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    real_openat64 = (int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, "openat64");
    real_renameat2 = (int (*)(int, const char *, int, const char *, unsigned int))dlsym(RTLD_NEXT, "renameat2");
    real_unlinkat = (int (*)(int, const char *, int))dlsym(RTLD_NEXT, "unlinkat");
    real_mkdirat = (int (*)(int, const char *, mode_t))dlsym(RTLD_NEXT, "mkdirat");
    real_write = (ssize_t (*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
}

static int under_watched(const char *path) {
    const char *dir = getenv("ETCDRS_POWER_DIR");
    return dir != NULL && strncmp(path, dir, strlen(dir)) == 0;
}

/* The path of fd if it is a regular file (or, with dirs set, a directory) under the watched
 * directory, else 0. Standard output and error are the test's logs, not the member's data. */
static int watched_fd(int fd, char *path, size_t cap, struct stat *st, int dirs) {
    char link[64];
    ssize_t n;
    if (fd <= 2 || fd == journal) return 0;
    if (fstat(fd, st) != 0) return 0;
    if (!S_ISREG(st->st_mode) && !(dirs && S_ISDIR(st->st_mode))) return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    n = readlink(link, path, cap - 1);
    if (n <= 0) return 0;
    path[n] = 0;
    return under_watched(path);
}

/* The absolute path that (dirfd, path) names, its parent resolved with realpath (the parent
 * exists while the call is made), if it is under the watched directory; else 0. */
static int resolve(int dirfd, const char *path, char *out) {
    char joined[PATH_MAX], parent[PATH_MAX], real_parent[PATH_MAX], *slash;
    const char *name;
    size_t n;
    if (path == NULL || path[0] == 0) return 0;
    if (path[0] == '/') {
        snprintf(joined, sizeof joined, "%s", path);
    } else {
        char base[PATH_MAX];
        if (dirfd == AT_FDCWD) {
            if (getcwd(base, sizeof base) == NULL) return 0;
        } else {
            char link[64];
            ssize_t len;
            snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
            len = readlink(link, base, sizeof base - 1);
            if (len <= 0) return 0;
            base[len] = 0;
        }
        if (snprintf(joined, sizeof joined, "%s/%s", base, path) >= (int)sizeof joined) return 0;
    }
    n = strlen(joined);
    while (n > 1 && joined[n - 1] == '/') joined[--n] = 0;
    slash = strrchr(joined, '/');
    if (slash == NULL) return 0;
    name = slash + 1;
    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0 || name[0] == 0) return 0;
    if (slash == joined) {
        snprintf(parent, sizeof parent, "/");
    } else {
        memcpy(parent, joined, (size_t)(slash - joined));
        parent[slash - joined] = 0;
    }
    if (realpath(parent, real_parent) == NULL) return 0;
    if (snprintf(out, PATH_MAX, "%s/%s", strcmp(real_parent, "/") == 0 ? "" : real_parent, name) >= PATH_MAX)
        return 0;
    return under_watched(out);
}

/* The journal every process under the layer appends to, one write(2) per record, so that
 * records of all processes are in one order (an fsync covers the file's earlier writes
 * whoever made them). */
static int open_journal(void) {
    const char *name = getenv("ETCDRS_POWER_JOURNAL");
    if (journal < 0 && name != NULL)
        journal = real_openat64(AT_FDCWD, name, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    return journal;
}

/* A record under construction. */
struct rec {
    char *buf;
    size_t len, cap;
};

static void put(struct rec *r, const void *bytes, size_t n) {
    if (r->buf == NULL && r->cap == (size_t)-1) return;
    if (r->len + n > r->cap) {
        size_t cap = (r->len + n) * 2 + 64;
        char *grown = realloc(r->buf, cap);
        if (grown == NULL) {
            free(r->buf);
            r->buf = NULL;
            r->cap = (size_t)-1;
            return;
        }
        r->buf = grown;
        r->cap = cap;
    }
    memcpy(r->buf + r->len, bytes, n);
    r->len += n;
}

static void put_u64(struct rec *r, uint64_t v) { put(r, &v, 8); }

static void put_str(struct rec *r, const char *s) {
    uint32_t n = (uint32_t)strlen(s);
    put(r, &n, 4);
    put(r, s, n);
}

static void put_inode(struct rec *r, const struct stat *st) {
    put_u64(r, (uint64_t)st->st_dev);
    put_u64(r, (uint64_t)st->st_ino);
}

static struct rec begin(char kind) {
    struct rec r = {NULL, 0, 0};
    put(&r, &kind, 1);
    return r;
}

static void finish(struct rec *r) {
    if (r->buf != NULL && open_journal() >= 0) real_write(journal, r->buf, r->len);
    free(r->buf);
}

/* Journals the undo of a write of len bytes at offset (or of a truncate to offset, len the
 * bytes it cuts off). */
static void record_undo(int fd, const char *path, uint64_t offset, uint64_t len) {
    struct stat st;
    uint64_t before, keep;
    uint32_t olen;
    struct rec r;
    char *old;
    if (fstat(fd, &st) != 0) return;
    before = (uint64_t)st.st_size;
    keep = offset < before ? before - offset : 0;
    if (keep > len) keep = len;
    olen = (uint32_t)keep;
    old = malloc(olen > 0 ? olen : 1);
    if (old == NULL) return;
    if (olen > 0 && pread(fd, old, olen, (off_t)offset) != (ssize_t)olen) memset(old, 0, olen);
    r = begin('W');
    put_str(&r, path);
    put_inode(&r, &st);
    put_u64(&r, offset);
    put_u64(&r, before);
    put(&r, &olen, 4);
    put(&r, old, olen);
    free(old);
    finish(&r);
}

/* Journals the undo of a write of len bytes where fd's next write lands. */
static void record_undo_here(int fd, const char *path, uint64_t len) {
    off_t at = (fcntl(fd, F_GETFL) & O_APPEND) ? lseek(fd, 0, SEEK_END) : lseek(fd, 0, SEEK_CUR);
    if (at >= 0) record_undo(fd, path, (uint64_t)at, len);
}

ssize_t write(int fd, const void *buf, size_t count) {
    char path[PATH_MAX];
    struct stat st;
    ssize_t r;
    init();
    if (!watched_fd(fd, path, sizeof path, &st, 0)) return real_write(fd, buf, count);
    pthread_mutex_lock(&lock);
    record_undo_here(fd, path, count);
    r = real_write(fd, buf, count);
    pthread_mutex_unlock(&lock);
    return r;
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset) {
    char path[PATH_MAX];
    struct stat st;
    ssize_t r;
    init();
    if (!watched_fd(fd, path, sizeof path, &st, 0)) return real_pwrite64(fd, buf, count, offset);
    pthread_mutex_lock(&lock);
    record_undo(fd, path, (uint64_t)offset, count);
    r = real_pwrite64(fd, buf, count, offset);
    pthread_mutex_unlock(&lock);
    return r;
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    return pwrite64(fd, buf, count, offset);
}

ssize_t writev(int fd, const struct iovec *iov, int iovcnt) {
    char path[PATH_MAX];
    struct stat st;
    ssize_t r;
    size_t total = 0;
    int i;
    init();
    if (!watched_fd(fd, path, sizeof path, &st, 0)) return real_writev(fd, iov, iovcnt);
    for (i = 0; i < iovcnt; i++) total += iov[i].iov_len;
    pthread_mutex_lock(&lock);
    record_undo_here(fd, path, total);
    r = real_writev(fd, iov, iovcnt);
    pthread_mutex_unlock(&lock);
    return r;
}

int ftruncate64(int fd, off_t length) {
    char path[PATH_MAX];
    int r;
    struct stat st;
    init();
    if (!watched_fd(fd, path, sizeof path, &st, 0)) return real_ftruncate64(fd, length);
    pthread_mutex_lock(&lock);
    if (fstat(fd, &st) == 0) {
        uint64_t cut = st.st_size > length ? (uint64_t)(st.st_size - length) : 0;
        record_undo(fd, path, (uint64_t)length, cut);
    }
    r = real_ftruncate64(fd, length);
    pthread_mutex_unlock(&lock);
    return r;
}

int ftruncate(int fd, off_t length) {
    return ftruncate64(fd, length);
}

/* The stop at a sync (see the top): only the thread whose unlink removed the stop file
 * stops the process. */
static void stop_if_asked(const char *path) {
    const char *stop = getenv("ETCDRS_POWER_STOP");
    char at[PATH_MAX], wanted[PATH_MAX];
    ssize_t n;
    int fd;
    if (stop == NULL) return;
    fd = real_openat64(AT_FDCWD, stop, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    n = read(fd, wanted, sizeof wanted - 1);
    close(fd);
    if (n < 0) return;
    wanted[n] = 0;
    if (strstr(path, wanted) == NULL) return;
    if (real_unlinkat(AT_FDCWD, stop, 0) != 0) return;
    if (snprintf(at, sizeof at, "%s.at", stop) < (int)sizeof at) {
        fd = real_openat64(AT_FDCWD, at, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            real_write(fd, path, strlen(path));
            close(fd);
        }
    }
    raise(SIGSTOP);
}

/* The slow disk (see the top). */
static void delay_if_asked(const char *path) {
    const char *delay = getenv("ETCDRS_POWER_DELAY");
    char wanted[PATH_MAX + 32], *part;
    unsigned long long micros;
    struct timespec pause;
    ssize_t n;
    int fd;
    if (delay == NULL) return;
    fd = real_openat64(AT_FDCWD, delay, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    n = read(fd, wanted, sizeof wanted - 1);
    close(fd);
    if (n <= 0) return;
    wanted[n] = 0;
    micros = strtoull(wanted, &part, 10);
    if (*part == '\n') part++;
    if (strstr(path, part) == NULL) return;
    pause.tv_sec = (time_t)(micros / 1000000);
    pause.tv_nsec = (long)(micros % 1000000) * 1000;
    while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {}
}

static int synced(int fd, int (*real)(int)) {
    char path[PATH_MAX];
    struct stat st;
    int r;
    init();
    if (!watched_fd(fd, path, sizeof path, &st, 1)) return real(fd);
    if (S_ISREG(st.st_mode)) {
        stop_if_asked(path);
        delay_if_asked(path);
    }
    pthread_mutex_lock(&lock);
    r = real(fd);
    if (r == 0) {
        struct rec rec = begin(S_ISDIR(st.st_mode) ? 'D' : 'S');
        put_str(&rec, path);
        if (!S_ISDIR(st.st_mode)) put_inode(&rec, &st);
        finish(&rec);
    }
    pthread_mutex_unlock(&lock);
    return r;
}

int fsync(int fd) {
    init();
    return synced(fd, real_fsync);
}

int fdatasync(int fd) {
    init();
    return synced(fd, real_fdatasync);
}

/* Opens, journaling a file it creates ('C') and the contents an O_TRUNC cuts off ('W'). */
static int opened(int dirfd, const char *path, int flags, mode_t mode) {
    char abs[PATH_MAX];
    struct stat before, after;
    int existed, fd;
    init();
    if (!(flags & (O_CREAT | O_TRUNC)) || !resolve(dirfd, path, abs))
        return real_openat64(dirfd, path, flags, mode);
    pthread_mutex_lock(&lock);
    existed = stat(abs, &before) == 0;
    if (existed && (flags & O_TRUNC) && S_ISREG(before.st_mode) && before.st_size > 0 &&
        !(flags & O_EXCL)) {
        int old = real_openat64(AT_FDCWD, abs, O_RDONLY | O_CLOEXEC, 0);
        if (old >= 0) {
            record_undo(old, abs, 0, (uint64_t)before.st_size);
            close(old);
        }
    }
    fd = real_openat64(dirfd, path, flags, mode);
    if (fd >= 0 && !existed && fstat(fd, &after) == 0 && S_ISREG(after.st_mode)) {
        struct rec rec = begin('C');
        put_str(&rec, abs);
        put_inode(&rec, &after);
        finish(&rec);
    }
    pthread_mutex_unlock(&lock);
    return fd;
}

static mode_t mode_arg(int flags, va_list ap) {
    return (flags & (O_CREAT | __O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
}

int open(const char *path, int flags, ...) {
    va_list ap;
    mode_t mode;
    va_start(ap, flags);
    mode = mode_arg(flags, ap);
    va_end(ap);
    return opened(AT_FDCWD, path, flags, mode);
}

int open64(const char *path, int flags, ...) {
    va_list ap;
    mode_t mode;
    va_start(ap, flags);
    mode = mode_arg(flags, ap);
    va_end(ap);
    return opened(AT_FDCWD, path, flags, mode);
}

int openat(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    mode_t mode;
    va_start(ap, flags);
    mode = mode_arg(flags, ap);
    va_end(ap);
    return opened(dirfd, path, flags, mode);
}

int openat64(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    mode_t mode;
    va_start(ap, flags);
    mode = mode_arg(flags, ap);
    va_end(ap);
    return opened(dirfd, path, flags, mode);
}

int creat(const char *path, mode_t mode) {
    return opened(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

int creat64(const char *path, mode_t mode) {
    return opened(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

/* A hard link to the regular file abs in the stash, written to stash; "" if none was made. */
static void keep_in_stash(const char *abs, const struct stat *st, char *stash) {
    const char *dir = getenv("ETCDRS_POWER_STASH");
    stash[0] = 0;
    if (dir == NULL || !S_ISREG(st->st_mode)) return;
    snprintf(stash, PATH_MAX, "%s/%d-%lu", dir, (int)getpid(), ++stash_seq);
    if (link(abs, stash) != 0) stash[0] = 0;
}

int renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags) {
    char from[PATH_MAX], to[PATH_MAX], stash[PATH_MAX];
    struct stat moved, replaced;
    int r;
    init();
    if (!resolve(olddirfd, oldpath, from) || !resolve(newdirfd, newpath, to))
        return real_renameat2(olddirfd, oldpath, newdirfd, newpath, flags);
    pthread_mutex_lock(&lock);
    if (lstat(from, &moved) != 0) {
        pthread_mutex_unlock(&lock);
        return real_renameat2(olddirfd, oldpath, newdirfd, newpath, flags);
    }
    stash[0] = 0;
    if (lstat(to, &replaced) == 0) keep_in_stash(to, &replaced, stash);
    if (!stash[0]) memset(&replaced, 0, sizeof replaced);
    r = real_renameat2(olddirfd, oldpath, newdirfd, newpath, flags);
    if (r == 0) {
        struct rec rec = begin('R');
        put_str(&rec, from);
        put_str(&rec, to);
        put_str(&rec, stash);
        put_inode(&rec, &moved);
        put_inode(&rec, &replaced);
        finish(&rec);
    } else if (stash[0]) {
        int saved = errno;
        real_unlinkat(AT_FDCWD, stash, 0);
        errno = saved;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

int renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath) {
    return renameat2(olddirfd, oldpath, newdirfd, newpath, 0);
}

int rename(const char *oldpath, const char *newpath) {
    return renameat2(AT_FDCWD, oldpath, AT_FDCWD, newpath, 0);
}

int unlinkat(int dirfd, const char *path, int flags) {
    char abs[PATH_MAX], stash[PATH_MAX];
    struct stat st;
    int r;
    init();
    if (!resolve(dirfd, path, abs)) return real_unlinkat(dirfd, path, flags);
    pthread_mutex_lock(&lock);
    stash[0] = 0;
    if (lstat(abs, &st) != 0) {
        pthread_mutex_unlock(&lock);
        return real_unlinkat(dirfd, path, flags);
    }
    if (!(flags & AT_REMOVEDIR)) keep_in_stash(abs, &st, stash);
    r = real_unlinkat(dirfd, path, flags);
    if (r == 0) {
        struct rec rec = begin((flags & AT_REMOVEDIR) ? 'X' : 'U');
        put_str(&rec, abs);
        if (!(flags & AT_REMOVEDIR)) {
            put_str(&rec, stash);
            put_inode(&rec, &st);
        }
        finish(&rec);
    } else if (stash[0]) {
        int saved = errno;
        real_unlinkat(AT_FDCWD, stash, 0);
        errno = saved;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

int unlink(const char *path) {
    return unlinkat(AT_FDCWD, path, 0);
}

int rmdir(const char *path) {
    return unlinkat(AT_FDCWD, path, AT_REMOVEDIR);
}

int mkdirat(int dirfd, const char *path, mode_t mode) {
    char abs[PATH_MAX];
    int r;
    init();
    if (!resolve(dirfd, path, abs)) return real_mkdirat(dirfd, path, mode);
    pthread_mutex_lock(&lock);
    r = real_mkdirat(dirfd, path, mode);
    if (r == 0) {
        struct rec rec = begin('M');
        put_str(&rec, abs);
        finish(&rec);
    }
    pthread_mutex_unlock(&lock);
    return r;
}

int mkdir(const char *path, mode_t mode) {
    return mkdirat(AT_FDCWD, path, mode);
}
