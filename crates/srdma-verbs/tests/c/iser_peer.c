/* A misbehaving iSER peer, for checking that the other end (tgtd's iser driver, libiscsi's
 * iSER initiator) gets an error and goes on, rather than crashing or hanging.
 *
 * Usage:
 *   iser_peer initiator ADDR PORT KIND   connect to a target at ADDR:PORT, then
 *       drop     disconnect as soon as the connection is up, before any login
 *       garbage  send 300 bytes of garbage as the first message, then disconnect
 *       short    send a 10-byte message (shorter than an iSER header), then disconnect
 *       vanish   _exit without disconnecting (the target finds out by its own means)
 *       exit     exit(0) without disconnecting (the library's atexit handler sends a DREQ,
 *                as the kernel does for a process's rdma_cm ids)
 *   iser_peer target ADDR PORT KIND      listen at ADDR:PORT for one initiator, then
 *       reject   reject its connection request
 *       drop     accept, then disconnect at once
 *       garbage  accept, answer its first message with 300 bytes of garbage, wait 3 s
 *       linger   accept, then wait (at most 5 s) for the initiator to disconnect
 * Prints "iser_peer: done" and exits 0 when it did what it was told. */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FAIL(...) do { fprintf(stderr, "iser_peer: " __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)

static struct rdma_event_channel *ch;
static struct ibv_mr *mr;
static struct ibv_cq *cq;
static char buf[2][8192];

static struct rdma_cm_event *next_event(void)
{
	struct rdma_cm_event *ev;

	if (rdma_get_cm_event(ch, &ev))
		FAIL("rdma_get_cm_event: %m");
	return ev;
}

static struct rdma_cm_event *expect(enum rdma_cm_event_type t)
{
	struct rdma_cm_event *ev = next_event();

	if (ev->event != t)
		FAIL("got %s (status %d), wanted %s", rdma_event_str(ev->event), ev->status,
		     rdma_event_str(t));
	return ev;
}

static void make_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr a = {
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
	};
	struct ibv_sge sge;
	struct ibv_recv_wr wr = { .sg_list = &sge, .num_sge = 1 }, *bad;
	if (!(cq = ibv_create_cq(id->verbs, 16, NULL, NULL, 0)))
		FAIL("ibv_create_cq: %m");
	a.send_cq = a.recv_cq = cq;
	if (rdma_create_qp(id, NULL, &a))
		FAIL("rdma_create_qp: %m");
	if (!(mr = ibv_reg_mr(id->pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE)))
		FAIL("ibv_reg_mr: %m");
	sge = (struct ibv_sge){ .addr = (uintptr_t)buf[0], .length = sizeof(buf[0]), .lkey = mr->lkey };
	if (ibv_post_recv(id->qp, &wr, &bad))
		FAIL("ibv_post_recv: %m");
}

/* Sends `len` bytes of garbage and waits (up to 2 s) for the send's completion. */
static void send_garbage(struct rdma_cm_id *id, int len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf[1], .length = len, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND }, *bad;
	struct ibv_wc wc;
	time_t until = time(NULL) + 2;

	for (int i = 0; i < len; i++)
		buf[1][i] = (char)(rand() | 0x80);
	if (ibv_post_send(id->qp, &wr, &bad))
		FAIL("ibv_post_send: %m");
	while (time(NULL) <= until) {
		int n = ibv_poll_cq(cq, 1, &wc);

		if (n > 0 && wc.opcode == IBV_WC_SEND) {
			printf("iser_peer: garbage sent: %s\n", ibv_wc_status_str(wc.status));
			return;
		}
		usleep(1000);
	}
	printf("iser_peer: no completion for the garbage\n");
}

/* Waits up to `ms` for the peer's first message. */
static int wait_message(struct rdma_cm_id *id, int ms)
{
	struct ibv_wc wc;

	for (int i = 0; i < ms; i++) {
		int n = ibv_poll_cq(cq, 1, &wc);

		if (n > 0)
			return wc.status == IBV_WC_SUCCESS;
		usleep(1000);
	}
	return 0;
}

static void initiator(struct sockaddr_in *sin, const char *kind)
{
	/* The iSER CM header (RFC 7145): flags, no zero-based VA, no send with invalidate. */
	unsigned char hdr[4] = { 0xc0, 0, 0, 0 };
	struct rdma_conn_param p = { .responder_resources = 4, .initiator_depth = 4,
				     .retry_count = 7, .rnr_retry_count = 6,
				     .private_data = hdr, .private_data_len = sizeof(hdr) };
	struct rdma_cm_id *id;
	struct rdma_cm_event *ev;

	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(id, NULL, (struct sockaddr *)sin, 2000))
		FAIL("rdma_resolve_addr: %m");
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(id, 2000))
		FAIL("rdma_resolve_route: %m");
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_ROUTE_RESOLVED));
	make_qp(id);
	if (rdma_connect(id, &p))
		FAIL("rdma_connect: %m");
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_ESTABLISHED));
	printf("iser_peer: connected\n");
	if (!strcmp(kind, "vanish")) {
		printf("iser_peer: done\n");
		_exit(0);
	}
	if (!strcmp(kind, "exit")) {
		printf("iser_peer: done\n");
		exit(0);
	}
	if (!strcmp(kind, "garbage"))
		send_garbage(id, 300);
	else if (!strcmp(kind, "short"))
		send_garbage(id, 10);
	else if (strcmp(kind, "drop"))
		FAIL("unknown kind %s", kind);
	usleep(200000);
	rdma_disconnect(id);
	/* DISCONNECTED, unless the target went first (then it was already reported). */
	ev = next_event();
	printf("iser_peer: %s\n", rdma_event_str(ev->event));
	rdma_ack_cm_event(ev);
}

static void target(struct sockaddr_in *sin, const char *kind)
{
	struct rdma_cm_id *listener, *id;
	struct rdma_cm_event *ev;
	struct rdma_conn_param p = { .responder_resources = 4, .initiator_depth = 4 };

	if (rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(listener, (struct sockaddr *)sin) || rdma_listen(listener, 4))
		FAIL("listen: %m");
	printf("iser_peer: listening\n");
	ev = expect(RDMA_CM_EVENT_CONNECT_REQUEST);
	id = ev->id;
	rdma_ack_cm_event(ev);
	if (!strcmp(kind, "reject")) {
		if (rdma_reject(id, NULL, 0))
			FAIL("rdma_reject: %m");
		printf("iser_peer: rejected\n");
		usleep(500000);
		printf("iser_peer: done\n");
		return;
	}
	make_qp(id);
	if (rdma_accept(id, &p))
		FAIL("rdma_accept: %m");
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_ESTABLISHED));
	if (!strcmp(kind, "drop")) {
		rdma_disconnect(id);
	} else if (!strcmp(kind, "linger")) {
		struct pollfd p = { .fd = ch->fd, .events = POLLIN };

		if (poll(&p, 1, 5000) != 1)
			FAIL("the initiator's connection is still up after 5 s");
		ev = next_event();
		printf("iser_peer: %s\n", rdma_event_str(ev->event));
		if (ev->event != RDMA_CM_EVENT_DISCONNECTED)
			FAIL("wanted RDMA_CM_EVENT_DISCONNECTED");
		rdma_ack_cm_event(ev);
	} else if (!strcmp(kind, "garbage")) {
		if (wait_message(id, 3000))
			send_garbage(id, 300);
		sleep(3);
	} else {
		FAIL("unknown kind %s", kind);
	}
	usleep(300000);
}

int main(int argc, char **argv)
{
	struct sockaddr_in sin = { .sin_family = AF_INET };

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 5)
		FAIL("usage: iser_peer initiator|target ADDR PORT KIND");
	srand(getpid());
	if (inet_pton(AF_INET, argv[2], &sin.sin_addr) != 1)
		FAIL("bad address %s", argv[2]);
	sin.sin_port = htons(atoi(argv[3]));
	if (!(ch = rdma_create_event_channel()))
		FAIL("rdma_create_event_channel: %m");
	if (!strcmp(argv[1], "initiator"))
		initiator(&sin, argv[4]);
	else if (!strcmp(argv[1], "target"))
		target(&sin, argv[4]);
	else
		FAIL("usage: iser_peer initiator|target ADDR PORT KIND");
	printf("iser_peer: done\n");
	return 0;
}
