/* Test-only fault injection: LD_PRELOADed into a process, it makes reads of one file fail with EIO once
 * faults are on, whoever reads: Python (os.preadv is preadv64v2, os.pread pread64) or llama.cpp (read(),
 * fread()). Reads of every other file pass through untouched. Mapped pages are not reads: a fault there
 * (SIGBUS) is not injected here.
 *
 *   EIO_SHIM_FILE     the file whose reads fail, matched by device and inode (any descriptor of it)
 *   EIO_SHIM_AFTER    bytes of it read successfully before the faults start (default 0)
 *   EIO_SHIM_FROM     only reads reaching byte FROM of it or past fail (default 0: every read)
 *   EIO_SHIM_TRIGGER  a path: faults start only once it exists (a test creates it mid-decode)
 *   EIO_SHIM_FIRED    a path created when the first fault is injected: the test's proof that it fired
 * A read crossing the AFTER or FROM mark comes back short, the next one fails.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int armed;
static dev_t dev;
static ino_t ino;
static long long after, from;
static long long done;  /* bytes of the file read so far, every thread together */
static const char *trigger, *fired;

static void init(void) {
    const char *path = getenv("EIO_SHIM_FILE"), *n = getenv("EIO_SHIM_AFTER"), *at = getenv("EIO_SHIM_FROM");
    struct stat st;
    if (path && stat(path, &st) == 0) {
        dev = st.st_dev, ino = st.st_ino, armed = 1;
    }
    after = n ? atoll(n) : 0;
    from = at ? atoll(at) : 0;
    trigger = getenv("EIO_SHIM_TRIGGER");
    fired = getenv("EIO_SHIM_FIRED");
}

/* -1 where fd is not the file's (or want is 0): the read passes, uncounted; else how many of `want` bytes at
 * pos (-1: the position of fp, or else of fd) it may return: all where faults are off, fewer up to the later
 * of the two marks, 0 where it must fail. errno is left as it was. */
static long long allowed(int fd, FILE *fp, long long pos, size_t want) {
    struct stat st;
    int saved = errno;
    long long ok = want;
    pthread_once(&once, init);
    if (!armed || want == 0 || fstat(fd, &st) != 0 || st.st_dev != dev || st.st_ino != ino) {
        ok = -1;
    } else if (!trigger || access(trigger, F_OK) == 0) {
        if (pos < 0) pos = fp ? ftell(fp) : lseek(fd, 0, SEEK_CUR);
        long long left = after - __atomic_load_n(&done, __ATOMIC_SEQ_CST), before = from - pos;
        if (before > left) left = before;  /* a fault needs both marks passed */
        ok = left <= 0 ? 0 : (size_t) left < want ? left : (long long) want;
    }
    errno = saved;
    return ok;
}

static ssize_t counted(ssize_t n) {
    if (n > 0) __atomic_add_fetch(&done, n, __ATOMIC_SEQ_CST);
    return n;
}

static ssize_t fail(void) {
    if (fired) close(open(fired, O_WRONLY | O_CREAT, 0644));
    errno = EIO;
    return -1;
}

#define REAL(name) static __typeof__(name) *real; if (!real) real = (__typeof__(name) *) dlsym(RTLD_NEXT, #name)

ssize_t read(int fd, void *buf, size_t n) {
    REAL(read);
    long long ok = allowed(fd, NULL, -1, n);
    if (ok < 0) return real(fd, buf, n);
    return ok ? counted(real(fd, buf, ok)) : fail();
}

static ssize_t positioned(int fd, void *buf, size_t n, off64_t off) {
    REAL(pread64);
    long long ok = allowed(fd, NULL, off, n);
    if (ok < 0) return real(fd, buf, n, off);
    return ok ? counted(real(fd, buf, ok, off)) : fail();
}

ssize_t pread(int fd, void *buf, size_t n, off_t off) { return positioned(fd, buf, n, off); }
ssize_t pread64(int fd, void *buf, size_t n, off64_t off) { return positioned(fd, buf, n, off); }

/* Vectored reads, all through preadv64v2 (flags 0 is preadv): within the mark, all of it; crossing it, a
 * short read of the first buffer's share. */
static ssize_t vectored(int fd, const struct iovec *iov, int cnt, off64_t off, int flags) {
    REAL(preadv64v2);
    size_t want = 0;
    for (int i = 0; i < cnt; i++) want += iov[i].iov_len;
    long long ok = allowed(fd, NULL, off, want);
    if (ok < 0) return real(fd, iov, cnt, off, flags);
    if (!ok) return fail();
    if ((size_t) ok == want) return counted(real(fd, iov, cnt, off, flags));
    struct iovec one = {iov[0].iov_base, (size_t) ok < iov[0].iov_len ? (size_t) ok : iov[0].iov_len};
    return counted(real(fd, &one, 1, off, flags));
}

ssize_t preadv(int fd, const struct iovec *iov, int cnt, off_t off) { return vectored(fd, iov, cnt, off, 0); }
ssize_t preadv64(int fd, const struct iovec *iov, int cnt, off64_t off) { return vectored(fd, iov, cnt, off, 0); }
ssize_t preadv2(int fd, const struct iovec *iov, int cnt, off_t off, int flags) {
    return vectored(fd, iov, cnt, off, flags);
}
ssize_t preadv64v2(int fd, const struct iovec *iov, int cnt, off64_t off, int flags) {
    return vectored(fd, iov, cnt, off, flags);
}
/* offset -1: the descriptor's own position, as readv reads */
ssize_t readv(int fd, const struct iovec *iov, int cnt) { return vectored(fd, iov, cnt, -1, 0); }

/* stdio's own reads are internal to libc: fread is caught where it is called, whole items only, and a fault
 * sets the stream's error flag as a failed read() would. */
size_t fread(void *ptr, size_t size, size_t nmemb, FILE *fp) {
    REAL(fread);
    long long ok = allowed(fileno(fp), fp, -1, size * nmemb);
    if (ok < 0) return real(ptr, size, nmemb, fp);
    ok /= size;
    if (!ok) {
#ifdef _IO_ERR_SEEN
        fp->_flags |= _IO_ERR_SEEN;
#endif
        fail();
        return 0;
    }
    size_t got = real(ptr, size, ok, fp);
    counted((ssize_t) (got * size));
    return got;
}
