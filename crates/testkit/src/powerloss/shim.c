/* The power-loss layer's interposer (see powerloss.rs): preloaded into a member, it journals
 * enough to undo every write to a regular file under $ETCDRS_POWER_DIR that no fsync or
 * fdatasync has covered yet. Each record is appended to $ETCDRS_POWER_JOURNAL with one
 * write(2) before the write it stands for; page-cache durability of the journal is enough,
 * since the "power cut" is a SIGKILL followed by the undo, done by the test.
 *
 * Record: u8 kind ('W' undo of a write or truncate, 'S' a sync), u32 path length, path,
 * then for 'W': u64 offset, u64 size of the file before, u32 length, the bytes that were at
 * [offset, offset + length) before. Little-endian, as the machine. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static int (*real_ftruncate64)(int, off_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int journal = -1;

static void init(void) {
    if (real_write) return;
    real_write = (ssize_t (*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    real_pwrite64 = (ssize_t (*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, "pwrite64");
    real_writev = (ssize_t (*)(int, const struct iovec *, int))dlsym(RTLD_NEXT, "writev");
    real_ftruncate64 = (int (*)(int, off_t))dlsym(RTLD_NEXT, "ftruncate64");
    real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
}

/* The path of fd if it is a regular file under the watched directory, else 0. */
static int watched(int fd, char *path, size_t cap) {
    const char *dir = getenv("ETCDRS_POWER_DIR");
    struct stat st;
    char link[64];
    ssize_t n;
    if (dir == NULL || fd == journal) return 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    n = readlink(link, path, cap - 1);
    if (n <= 0) return 0;
    path[n] = 0;
    return strncmp(path, dir, strlen(dir)) == 0;
}

/* The journal every process under the layer appends to, one write(2) per record, so that
 * records of all processes are in one order (an fsync covers the file's earlier writes
 * whoever made them). */
static int open_journal(void) {
    const char *name = getenv("ETCDRS_POWER_JOURNAL");
    if (journal < 0 && name != NULL)
        journal = open(name, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    return journal;
}

/* Journals the undo of a write of len bytes at offset (or of a truncate to offset, len 0
 * and truncating set). */
static void record_undo(int fd, const char *path, uint64_t offset, uint64_t len) {
    struct stat st;
    uint64_t before, keep;
    uint32_t plen = (uint32_t)strlen(path), olen;
    size_t size;
    char *rec, *p;
    if (open_journal() < 0 || fstat(fd, &st) != 0) return;
    before = (uint64_t)st.st_size;
    keep = offset < before ? before - offset : 0;
    if (keep > len) keep = len;
    olen = (uint32_t)keep;
    size = 1 + 4 + plen + 8 + 8 + 4 + olen;
    rec = malloc(size);
    if (rec == NULL) return;
    p = rec;
    *p++ = 'W';
    memcpy(p, &plen, 4); p += 4;
    memcpy(p, path, plen); p += plen;
    memcpy(p, &offset, 8); p += 8;
    memcpy(p, &before, 8); p += 8;
    memcpy(p, &olen, 4); p += 4;
    if (olen > 0 && pread(fd, p, olen, (off_t)offset) != (ssize_t)olen) memset(p, 0, olen);
    real_write(journal, rec, size);
    free(rec);
}

/* Journals the undo of a write of len bytes where fd's next write lands. */
static void record_undo_here(int fd, const char *path, uint64_t len) {
    off_t at = (fcntl(fd, F_GETFL) & O_APPEND) ? lseek(fd, 0, SEEK_END) : lseek(fd, 0, SEEK_CUR);
    if (at >= 0) record_undo(fd, path, (uint64_t)at, len);
}

static void record_sync(const char *path) {
    uint32_t plen = (uint32_t)strlen(path);
    char rec[1 + 4 + PATH_MAX];
    if (open_journal() < 0) return;
    rec[0] = 'S';
    memcpy(rec + 1, &plen, 4);
    memcpy(rec + 5, path, plen);
    real_write(journal, rec, 5 + plen);
}

ssize_t write(int fd, const void *buf, size_t count) {
    char path[PATH_MAX];
    ssize_t r;
    init();
    if (!watched(fd, path, sizeof path)) return real_write(fd, buf, count);
    pthread_mutex_lock(&lock);
    record_undo_here(fd, path, count);
    r = real_write(fd, buf, count);
    pthread_mutex_unlock(&lock);
    return r;
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset) {
    char path[PATH_MAX];
    ssize_t r;
    init();
    if (!watched(fd, path, sizeof path)) return real_pwrite64(fd, buf, count, offset);
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
    ssize_t r;
    size_t total = 0;
    int i;
    init();
    if (!watched(fd, path, sizeof path)) return real_writev(fd, iov, iovcnt);
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
    if (!watched(fd, path, sizeof path)) return real_ftruncate64(fd, length);
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

static int synced(int fd, int (*real)(int)) {
    char path[PATH_MAX];
    int r;
    init();
    if (!watched(fd, path, sizeof path)) return real(fd);
    pthread_mutex_lock(&lock);
    r = real(fd);
    if (r == 0) record_sync(path);
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
