/* Reads and writes through Debian's libiscsi (iscsi:// over TCP, iser:// over RDMA), data
 * checked against a pattern that the test also writes into and checks in the target's backing
 * file, so both directions are seen end to end.
 *
 * Usage:
 *   iscsi_rw fill FILE BYTES SEED     write pattern SEED into FILE (no iSCSI)
 *   iscsi_rw verify FILE SEED         check that FILE holds pattern SEED
 *   iscsi_rw rw URL INITIATOR SEED    log in; read the whole LUN and check pattern SEED; write
 *                                     pattern SEED+1 over it in pieces of 512 B to 256 KiB
 *                                     (libiscsi's iSER transport takes at most 256 KiB per
 *                                     command); read it back and check; log out
 *   iscsi_rw loop URL INITIATOR SECS  log in; write and read back 64 KiB pieces for SECS
 *                                     seconds (or until an error: exit 2 with the error)
 * Prints "iscsi_rw: ok ..." and exits 0 on success; 3 if the login failed (nothing was read or
 * written), 1 on any other failure (2 in `loop`).
 *
 * Commands are waited for here, not with libiscsi's *_sync calls. Debian's libiscsi 1.19 polls
 * its descriptor a second at a time, and its iSER transport fails the command ("revents is not
 * POLLIN") when a second passes without a completion (changed upstream since): that second is
 * also how it notices a dead target, as it reads no CM events once connected. Here a command
 * fails after ISCSI_RW_WAIT seconds without an answer (default 1, as libiscsi); the lab sets
 * more for targets in TCG guests, which pause for a second now and then. The longest wait is
 * printed with the result. */
#include <fcntl.h>
#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FAIL(...) do { fprintf(stderr, "iscsi_rw: " __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)
#define MAX_XFER (256 * 1024)

static uint64_t splitmix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

/* The pattern's bytes [off, off + len) (off and len multiples of 8). */
static void pattern(uint64_t seed, uint64_t off, unsigned char *buf, size_t len)
{
	for (size_t i = 0; i < len; i += 8) {
		uint64_t w = splitmix(seed * 0x100000001b3ULL ^ ((off + i) / 8));

		memcpy(buf + i, &w, 8);
	}
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void file_mode(int fill, const char *path, uint64_t bytes, uint64_t seed)
{
	unsigned char *want = malloc(MAX_XFER), *got = malloc(MAX_XFER);
	int fd = open(path, fill ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY, 0644);
	struct stat st;

	if (fd < 0 || !want || !got)
		FAIL("%s: %m", path);
	if (!fill) {
		if (fstat(fd, &st))
			FAIL("fstat: %m");
		bytes = st.st_size;
	}
	for (uint64_t off = 0; off < bytes; off += MAX_XFER) {
		size_t n = bytes - off < MAX_XFER ? bytes - off : MAX_XFER;

		pattern(seed, off, want, n);
		if (fill) {
			if (pwrite(fd, want, n, off) != (ssize_t)n)
				FAIL("pwrite: %m");
		} else {
			if (pread(fd, got, n, off) != (ssize_t)n)
				FAIL("pread: %m");
			if (memcmp(got, want, n))
				FAIL("%s: bytes at %llu differ from pattern %llu", path,
				     (unsigned long long)off, (unsigned long long)seed);
		}
	}
	if (fill && fsync(fd))
		FAIL("fsync: %m");
	close(fd);
	printf("iscsi_rw: ok, %s %llu bytes of pattern %llu\n", fill ? "wrote" : "checked",
	       (unsigned long long)bytes, (unsigned long long)seed);
}

static struct iscsi_context *login(const char *url, const char *initiator, int *lun)
{
	struct iscsi_context *iscsi = iscsi_create_context(initiator);
	struct iscsi_url *u;

	if (!iscsi)
		FAIL("iscsi_create_context");
	if (!(u = iscsi_parse_full_url(iscsi, url)))
		FAIL("%s: %s", url, iscsi_get_error(iscsi));
	iscsi_set_session_type(iscsi, ISCSI_SESSION_NORMAL);
	iscsi_set_header_digest(iscsi, ISCSI_HEADER_DIGEST_NONE);
	if (iscsi_full_connect_sync(iscsi, u->portal, u->lun)) {
		fprintf(stderr, "iscsi_rw: login to %s: %s\n", url, iscsi_get_error(iscsi));
		exit(3);
	}
	*lun = u->lun;
	iscsi_destroy_url(u);
	return iscsi;
}

/* How long a command may wait for its answer, and the longest one did, in seconds. */
static double wait_limit = 1, longest_wait;
/* Why wait_answer gave up, when it was not libiscsi's error. */
static char gave_up[64];

static const char *error_of(struct iscsi_context *iscsi)
{
	return gave_up[0] ? gave_up : iscsi_get_error(iscsi);
}

struct answer {
	int finished, status;
};

static void answered(struct iscsi_context *iscsi, int status, void *task, void *private_data)
{
	struct answer *a = private_data;

	(void)iscsi;
	(void)task;
	a->finished = 1;
	a->status = status;
}

/* Services `iscsi` until the command of `a` has its answer: its status, or -1 when libiscsi
 * failed or `wait_limit` passed without one (see error_of). */
static int wait_answer(struct iscsi_context *iscsi, struct answer *a)
{
	double start = now();

	while (!a->finished) {
		struct pollfd pfd = { .fd = iscsi_get_fd(iscsi), .events = iscsi_which_events(iscsi) };
		int n;

		if (now() - start >= wait_limit) {
			snprintf(gave_up, sizeof(gave_up), "no answer for %.1f s", now() - start);
			return -1;
		}
		if (!pfd.events) {
			poll(NULL, 0, 10);
			continue;
		}
		n = poll(&pfd, 1, 100);
		if (n < 0)
			FAIL("poll: %m");
		/* libiscsi 1.19's iSER transport takes any call without POLLIN as an error. */
		if (n == 0)
			continue;
		if (iscsi_service(iscsi, pfd.revents) < 0)
			return -1;
	}
	if (now() - start > longest_wait)
		longest_wait = now() - start;
	return a->status;
}

static void xfer(struct iscsi_context *iscsi, int lun, int write, uint64_t lba, unsigned char *buf,
		 uint32_t len, uint32_t bs, int code)
{
	struct answer a = { 0, 0 };
	struct scsi_task *t = write ? iscsi_write16_task(iscsi, lun, lba, buf, len, bs, 0, 0, 0, 0, 0,
							 answered, &a)
				    : iscsi_read16_task(iscsi, lun, lba, len, bs, 0, 0, 0, 0, 0, answered, &a);

	if (!t || wait_answer(iscsi, &a) != SCSI_STATUS_GOOD) {
		fprintf(stderr, "iscsi_rw: %s of %u bytes at LBA %llu: %s (status %#x)\n",
			write ? "WRITE16" : "READ16", len, (unsigned long long)lba, error_of(iscsi),
			a.finished ? a.status : 0);
		exit(code);
	}
	if (!write) {
		if (t->datain.size != (int)len)
			FAIL("READ16 at LBA %llu: %d bytes, wanted %u", (unsigned long long)lba,
			     t->datain.size, len);
		memcpy(buf, t->datain.data, len);
	}
	scsi_free_scsi_task(t);
}

int main(int argc, char **argv)
{
	static const uint32_t sizes[] = { 512, 4096, 65536, MAX_XFER, 8192, 1024, 131072, 32768 };
	unsigned char *want, *got;
	struct iscsi_context *iscsi;
	struct scsi_readcapacity16 *rc;
	struct scsi_task *t;
	uint64_t blocks, bytes, seed, done = 0;
	uint32_t bs;
	int lun;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 5 && !strcmp(argv[1], "fill")) {
		file_mode(1, argv[2], strtoull(argv[3], NULL, 0), strtoull(argv[4], NULL, 0));
		return 0;
	}
	if (argc == 4 && !strcmp(argv[1], "verify")) {
		file_mode(0, argv[2], 0, strtoull(argv[3], NULL, 0));
		return 0;
	}
	if (argc != 5 || (strcmp(argv[1], "rw") && strcmp(argv[1], "loop")))
		FAIL("usage: see the comment at the top of iscsi_rw.c");
	if (getenv("ISCSI_RW_WAIT"))
		wait_limit = atof(getenv("ISCSI_RW_WAIT"));
	want = malloc(MAX_XFER);
	got = malloc(MAX_XFER);
	iscsi = login(argv[2], argv[3], &lun);
	struct answer a = { 0, 0 };

	if (!(t = iscsi_readcapacity16_task(iscsi, lun, answered, &a)) ||
	    wait_answer(iscsi, &a) != SCSI_STATUS_GOOD || !(rc = scsi_datain_unmarshall(t)))
		FAIL("READCAPACITY16: %s", error_of(iscsi));
	bs = rc->block_length;
	blocks = rc->returned_lba + 1;
	bytes = blocks * bs;
	scsi_free_scsi_task(t);
	if (bs % 512 || bytes % MAX_XFER)
		FAIL("block size %u, %llu blocks: not what the test made", bs, (unsigned long long)blocks);
	if (!strcmp(argv[1], "loop")) {
		double end = now() + atof(argv[4]);
		uint64_t lba = 0, step = 65536 / bs;

		printf("iscsi_rw: logged in, writing and reading\n");
		for (seed = 1; now() < end; seed++) {
			pattern(seed, lba * bs, want, 65536);
			xfer(iscsi, lun, 1, lba, want, 65536, bs, 2);
			xfer(iscsi, lun, 0, lba, got, 65536, bs, 2);
			if (memcmp(got, want, 65536))
				FAIL("data read back at LBA %llu differs", (unsigned long long)lba);
			lba = (lba + step) % blocks;
			done += 2;
		}
		iscsi_logout_sync(iscsi);
		iscsi_destroy_context(iscsi);
		printf("iscsi_rw: ok, %llu commands, longest wait %.2f s\n", (unsigned long long)done,
		       longest_wait);
		return 0;
	}
	seed = strtoull(argv[4], NULL, 0);
	/* What the test wrote into the backing file, read through the target. */
	for (uint64_t off = 0; off < bytes; off += MAX_XFER) {
		pattern(seed, off, want, MAX_XFER);
		xfer(iscsi, lun, 0, off / bs, got, MAX_XFER, bs, 1);
		if (memcmp(got, want, MAX_XFER))
			FAIL("READ16 at byte %llu: not the backing file's pattern %llu",
			     (unsigned long long)off, (unsigned long long)seed);
		done++;
	}
	/* A new pattern, written in pieces of every size, then read back. */
	for (int pass = 0; pass < 2; pass++) {
		uint64_t off = 0;

		for (unsigned i = 0; off < bytes; i++) {
			uint32_t n = sizes[i % (sizeof(sizes) / sizeof(sizes[0]))];

			if (n > bytes - off)
				n = bytes - off;
			pattern(seed + 1, off, want, n);
			if (pass == 0) {
				xfer(iscsi, lun, 1, off / bs, want, n, bs, 1);
			} else {
				xfer(iscsi, lun, 0, off / bs, got, n, bs, 1);
				if (memcmp(got, want, n))
					FAIL("data read back at byte %llu (%u bytes) differs",
					     (unsigned long long)off, n);
			}
			off += n;
			done++;
		}
	}
	iscsi_logout_sync(iscsi);
	iscsi_destroy_context(iscsi);
	printf("iscsi_rw: ok, %llu bytes checked, %llu commands, longest wait %.2f s\n",
	       (unsigned long long)bytes, (unsigned long long)done, longest_wait);
	return 0;
}
