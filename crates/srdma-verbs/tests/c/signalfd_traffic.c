/* A program that owns its signals, as tgtd and many daemons do: once its RDMA connection is up
 * (so the provider has started whatever threads it starts), the main thread blocks SIGUSR2 and
 * SIGRTMIN and reads them through a signalfd, while RDMA WRITEs and READs (data checked) run
 * on a thread of its own and two more threads signal the process: kill(getpid(), SIGUSR2) and
 * sigqueue(getpid(), SIGRTMIN, i). On a kernel provider, which starts no thread, every signal
 * reaches the signalfd; a provider thread that leaves them unblocked gets them instead (SIGUSR2's
 * default action ends the process). Also checks, from /proc, that every other thread blocks
 * both signals but not SIGSEGV (a crash still crashes), and that fork and exec work meanwhile
 * (the child has the forking thread's mask and runs /bin/sh).
 *
 * Usage: signalfd_traffic [PORT]   (server and client in this process on 127.0.0.1)
 * Prints "signalfd_traffic: ok" and exits 0 on success. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FAIL(...) do { fprintf(stderr, "signalfd_traffic: " __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)
#define SIZE 4096
#define KILLS 100
#define QUEUED 100

static struct rdma_cm_id *client, *server;
static struct ibv_mr *cmr, *smr;
static char cbuf[2][SIZE], sbuf[SIZE];
static atomic_int stop, usr2_seen, writes;

static struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type t)
{
	struct rdma_cm_event *ev;

	if (rdma_get_cm_event(ch, &ev))
		FAIL("rdma_get_cm_event: %m");
	if (ev->event != t)
		FAIL("got %s (status %d), wanted %s", rdma_event_str(ev->event), ev->status,
		     rdma_event_str(t));
	return ev;
}

static void make_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr a = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
	};
	struct ibv_cq *cq = ibv_create_cq(id->verbs, 8, NULL, NULL, 0);

	if (!cq)
		FAIL("ibv_create_cq: %m");
	a.send_cq = a.recv_cq = cq;
	if (rdma_create_qp(id, NULL, &a))
		FAIL("rdma_create_qp: %m");
}

/* Client and server in this process, connected over rdma_cm on 127.0.0.1:port. */
static void connect_both(int port)
{
	struct rdma_event_channel *cch = rdma_create_event_channel(), *sch = rdma_create_event_channel();
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(port) };
	struct rdma_conn_param p = { .responder_resources = 1, .initiator_depth = 1, .retry_count = 7 };
	struct rdma_cm_id *listener;
	struct rdma_cm_event *ev;

	if (!cch || !sch)
		FAIL("rdma_create_event_channel: %m");
	inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
	if (rdma_create_id(sch, &listener, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(listener, (struct sockaddr *)&sin) || rdma_listen(listener, 1))
		FAIL("listen: %m");
	if (rdma_create_id(cch, &client, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(client, NULL, (struct sockaddr *)&sin, 2000))
		FAIL("rdma_resolve_addr: %m");
	rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(client, 2000))
		FAIL("rdma_resolve_route: %m");
	rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	make_qp(client);
	if (rdma_connect(client, &p))
		FAIL("rdma_connect: %m");
	ev = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
	server = ev->id;
	rdma_ack_cm_event(ev);
	make_qp(server);
	if (rdma_accept(server, &p))
		FAIL("rdma_accept: %m");
	rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ESTABLISHED));
	rdma_ack_cm_event(expect(sch, RDMA_CM_EVENT_ESTABLISHED));
	cmr = ibv_reg_mr(client->pd, cbuf, sizeof(cbuf), IBV_ACCESS_LOCAL_WRITE);
	smr = ibv_reg_mr(server->pd, sbuf, sizeof(sbuf),
			 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!cmr || !smr)
		FAIL("ibv_reg_mr: %m");
}

/* One RDMA operation of the client on the server's buffer, waited for. */
static void rdma_op(enum ibv_wr_opcode op, char *local)
{
	struct ibv_sge sge = { .addr = (uintptr_t)local, .length = SIZE, .lkey = cmr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .wr.rdma = { .remote_addr = (uintptr_t)sbuf, .rkey = smr->rkey } }, *bad;
	struct ibv_wc wc;
	time_t until = time(NULL) + 10;
	int n;

	if (ibv_post_send(client->qp, &wr, &bad))
		FAIL("ibv_post_send: %m");
	while ((n = ibv_poll_cq(client->qp->send_cq, 1, &wc)) == 0)
		if (time(NULL) > until)
			FAIL("no completion in 10 s");
	if (n < 0 || wc.status != IBV_WC_SUCCESS)
		FAIL("completion: %s", n < 0 ? "poll failed" : ibv_wc_status_str(wc.status));
}

/* WRITEs a pattern into the server's buffer and READs it back, until told to stop. */
static void *traffic(void *arg)
{
	(void)arg;
	for (int i = 0; !atomic_load(&stop); i++) {
		memset(cbuf[0], 'a' + i % 26, SIZE);
		rdma_op(IBV_WR_RDMA_WRITE, cbuf[0]);
		if (memcmp(sbuf, cbuf[0], SIZE))
			FAIL("WRITE %d: the server's buffer differs", i);
		rdma_op(IBV_WR_RDMA_READ, cbuf[1]);
		if (memcmp(cbuf[1], cbuf[0], SIZE))
			FAIL("READ %d: the data read back differs", i);
		atomic_fetch_add(&writes, 1);
	}
	return NULL;
}

/* kill(getpid(), SIGUSR2), each time once the previous one was read. */
static void *killer(void *arg)
{
	(void)arg;
	for (int i = 0; i < KILLS; i++) {
		if (kill(getpid(), SIGUSR2))
			FAIL("kill: %m");
		while (atomic_load(&usr2_seen) <= i)
			usleep(200);
	}
	return NULL;
}

/* sigqueue(getpid(), SIGRTMIN, i): real-time signals queue, so every value must arrive. */
static void *queuer(void *arg)
{
	(void)arg;
	for (int i = 0; i < QUEUED; i++) {
		union sigval v = { .sival_int = i };

		while (sigqueue(getpid(), SIGRTMIN, v)) {
			if (errno != EAGAIN)
				FAIL("sigqueue: %m");
			usleep(1000);
		}
		if (i % 10 == 0)
			usleep(500);
	}
	return NULL;
}

/* Bit `sig` of a /proc mask in hex. */
static int in_mask(const char *hex, int sig)
{
	unsigned long long m = strtoull(hex, NULL, 16);

	return (m >> (sig - 1)) & 1;
}

/* Every thread of the process but this one blocks SIGUSR2 and SIGRTMIN and not SIGSEGV;
 * returns how many threads there are. */
static int check_masks(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;

	if (!d)
		FAIL("/proc/self/task: %m");
	while ((e = readdir(d))) {
		char path[300], line[256], comm[64] = "?";
		FILE *f;

		if (e->d_name[0] == '.' || atoi(e->d_name) == gettid())
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/status", e->d_name);
		if (!(f = fopen(path, "r")))
			continue; /* gone meanwhile */
		n++;
		while (fgets(line, sizeof(line), f)) {
			if (!strncmp(line, "Name:", 5))
				sscanf(line + 5, "%63s", comm);
			if (strncmp(line, "SigBlk:", 7))
				continue;
			if (!in_mask(line + 7, SIGUSR2) || !in_mask(line + 7, SIGRTMIN))
				FAIL("thread %s (%s) leaves SIGUSR2 or SIGRTMIN unblocked: %s", e->d_name, comm,
				     line);
			if (in_mask(line + 7, SIGSEGV))
				FAIL("thread %s (%s) blocks SIGSEGV: %s", e->d_name, comm, line);
		}
		fclose(f);
	}
	closedir(d);
	return n;
}

/* fork and exec while everything runs: the child has this thread's mask and runs a shell. */
static void fork_exec(const sigset_t *want)
{
	pid_t pid = fork();
	int st;

	if (pid < 0)
		FAIL("fork: %m");
	if (pid == 0) {
		sigset_t cur;

		pthread_sigmask(SIG_SETMASK, NULL, &cur);
		if (sigismember(&cur, SIGUSR2) != sigismember(want, SIGUSR2) || sigismember(&cur, SIGTERM))
			_exit(3);
		execl("/bin/sh", "sh", "-c", "exit 7", (char *)NULL);
		_exit(4);
	}
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 7)
		FAIL("fork and exec: the child ended with status %#x", st);
}

int main(int argc, char **argv)
{
	int port = argc > 1 ? atoi(argv[1]) : 7399, usr2 = 0, queued = 0, threads, fd, forked = 0;
	pthread_t t[3];
	sigset_t set;
	struct pollfd pfd;

	setvbuf(stdout, NULL, _IOLBF, 0);
	connect_both(port);
	/* The provider's threads exist now; from here on the program owns these signals. */
	sigemptyset(&set);
	sigaddset(&set, SIGUSR2);
	sigaddset(&set, SIGRTMIN);
	if (pthread_sigmask(SIG_BLOCK, &set, NULL))
		FAIL("pthread_sigmask");
	if ((fd = signalfd(-1, &set, SFD_CLOEXEC)) < 0)
		FAIL("signalfd: %m");
	if (pthread_create(&t[0], NULL, traffic, NULL))
		FAIL("pthread_create");
	while (atomic_load(&writes) < 10)
		usleep(1000);
	threads = check_masks();
	if (pthread_create(&t[1], NULL, killer, NULL) || pthread_create(&t[2], NULL, queuer, NULL))
		FAIL("pthread_create");
	pfd.fd = fd;
	pfd.events = POLLIN;
	while (usr2 < KILLS || queued < QUEUED) {
		struct signalfd_siginfo si;
		int r = poll(&pfd, 1, 10000);

		if (r == 0)
			FAIL("no signal in 10 s (SIGUSR2 %d of %d, SIGRTMIN %d of %d)", usr2, KILLS, queued,
			     QUEUED);
		if (r < 0 || read(fd, &si, sizeof(si)) != sizeof(si))
			FAIL("signalfd read: %m");
		if ((int)si.ssi_signo == SIGUSR2) {
			atomic_store(&usr2_seen, ++usr2);
		} else if ((int)si.ssi_signo == SIGRTMIN) {
			if ((int)si.ssi_int != queued)
				FAIL("SIGRTMIN value %d, expected %d", si.ssi_int, queued);
			queued++;
		} else {
			FAIL("unexpected signal %u", si.ssi_signo);
		}
		if (si.ssi_pid != (unsigned)getpid())
			FAIL("signal %u from pid %u", si.ssi_signo, si.ssi_pid);
		if (!forked && usr2 >= KILLS / 2 && queued >= QUEUED / 2) {
			fork_exec(&set);
			forked = 1;
		}
	}
	pthread_join(t[1], NULL);
	pthread_join(t[2], NULL);
	atomic_store(&stop, 1);
	pthread_join(t[0], NULL);
	check_masks();
	fork_exec(&set);
	printf("signalfd_traffic: %d SIGUSR2, %d SIGRTMIN read through the signalfd, %d WRITE+READ "
	       "pairs checked, %d other threads\n", usr2, queued, atomic_load(&writes), threads);
	rdma_disconnect(client);
	printf("signalfd_traffic: ok\n");
	return 0;
}
