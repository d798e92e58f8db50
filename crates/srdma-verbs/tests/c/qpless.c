/* Connecting ids that have no QP, as UCX and other libraries do: each side creates its own RC
 * QP with ibv_create_qp, names it in conn_param->qp_num and moves it through INIT, RTR and RTS
 * with rdma_init_qp_attr; the active side gets RDMA_CM_EVENT_CONNECT_RESPONSE and completes
 * the connection with rdma_establish, the passive side gets ESTABLISHED. A SEND each way then
 * proves the QPs were connected to each other, and a disconnect ends it.
 *
 * Usage: qpless both ADDRESS          (server thread and client in one process)
 *        qpless server ADDRESS PORT   (one connection, then exit)
 *        qpless client ADDRESS PORT
 * Prints "qpless: ok" and exits 0 on success. */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FAIL(...) do { fprintf(stderr, "qpless: " __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)

struct side {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char buf[2][64]; /* [0] receive, [1] send */
};

/* The next event on ch (within 20 s) of type want, with its connection private data copied
 * into data (up to len bytes) and its QP number into qpn; fails on any other event. */
static struct rdma_cm_id *expect(struct rdma_event_channel *ch, int want, char *data, int len,
				 uint32_t *qpn)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id;

	if (poll(&p, 1, 20000) <= 0)
		FAIL("no event (waiting for %s)", rdma_event_str(want));
	if (rdma_get_cm_event(ch, &ev))
		FAIL("rdma_get_cm_event: %m");
	if (ev->event != want)
		FAIL("got %s (status %d), not %s", rdma_event_str(ev->event), ev->status,
		     rdma_event_str(want));
	id = ev->id;
	if (data && ev->param.conn.private_data) {
		int n = ev->param.conn.private_data_len < len ? ev->param.conn.private_data_len : len;
		memcpy(data, ev->param.conn.private_data, n);
	}
	if (qpn)
		*qpn = ev->param.conn.qp_num;
	rdma_ack_cm_event(ev);
	return id;
}

static void make_qp(struct rdma_cm_id *id, struct side *s)
{
	struct ibv_qp_init_attr init = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};

	s->pd = ibv_alloc_pd(id->verbs);
	s->cq = s->pd ? ibv_create_cq(id->verbs, 8, NULL, NULL, 0) : NULL;
	if (!s->cq)
		FAIL("pd/cq: %m");
	init.send_cq = init.recv_cq = s->cq;
	s->qp = ibv_create_qp(s->pd, &init);
	s->mr = s->qp ? ibv_reg_mr(s->pd, s->buf, sizeof(s->buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!s->mr)
		FAIL("qp/mr: %m");
}

/* rdma_init_qp_attr for state, then ibv_modify_qp with what it gave. */
static struct ibv_qp_attr move_qp(struct rdma_cm_id *id, struct side *s, enum ibv_qp_state state)
{
	struct ibv_qp_attr a = { .qp_state = state };
	int mask;

	if (rdma_init_qp_attr(id, &a, &mask))
		FAIL("rdma_init_qp_attr(%d): %m", state);
	if (ibv_modify_qp(s->qp, &a, mask))
		FAIL("ibv_modify_qp(%d): %m", state);
	return a;
}

static void post_recv(struct side *s)
{
	struct ibv_sge sge = { (uintptr_t)s->buf[0], sizeof(s->buf[0]), s->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;

	if (ibv_post_recv(s->qp, &wr, &bad))
		FAIL("ibv_post_recv: %m");
}

static void send_text(struct side *s, const char *text)
{
	struct ibv_sge sge = { (uintptr_t)s->buf[1], strlen(text) + 1, s->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;

	strcpy(s->buf[1], text);
	if (ibv_post_send(s->qp, &wr, &bad))
		FAIL("ibv_post_send: %m");
}

/* Polls until the completions of the wr_ids in `want` (a bit per wr_id: 1 << id) have all
 * arrived, in any order (a reply's receive may complete before the ACK of the request
 * completes its send), within 30 s; fails on an error status. */
static void wait_wcs(struct side *s, unsigned want)
{
	struct timespec start, now;
	unsigned seen = 0;
	struct ibv_wc wc;

	clock_gettime(CLOCK_MONOTONIC, &start);
	while ((seen & want) != want) {
		int n = ibv_poll_cq(s->cq, 1, &wc);
		if (n < 0)
			FAIL("ibv_poll_cq");
		if (n == 0) {
			clock_gettime(CLOCK_MONOTONIC, &now);
			if (now.tv_sec - start.tv_sec > 30)
				FAIL("completions %#x of %#x after 30 s", seen, want);
			usleep(10);
			continue;
		}
		if (wc.status != IBV_WC_SUCCESS)
			FAIL("completion %llu: %s", (unsigned long long)wc.wr_id,
			     ibv_wc_status_str(wc.status));
		seen |= 1u << wc.wr_id;
	}
}

static void teardown(struct rdma_cm_id *id, struct side *s)
{
	ibv_destroy_qp(s->qp);
	ibv_dereg_mr(s->mr);
	ibv_destroy_cq(s->cq);
	ibv_dealloc_pd(s->pd);
	rdma_destroy_id(id);
}

struct server_args {
	const char *addr;
	int port; /* 0: any; the port listened on is written here */
	pthread_mutex_t m;
	pthread_cond_t c;
};

static void *server(void *arg)
{
	struct server_args *sa = arg;
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *l, *id;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(sa->port) };
	struct rdma_conn_param p = { .responder_resources = 1, .initiator_depth = 1,
				     .private_data_len = 8 };
	struct ibv_qp_attr rtr, rts;
	struct side s = { 0 };
	uint32_t peer_qpn;
	char got[16] = "";
	int mask;

	if (!ch || rdma_create_id(ch, &l, NULL, RDMA_PS_TCP))
		FAIL("server id: %m");
	inet_pton(AF_INET, sa->addr, &a.sin_addr);
	if (rdma_bind_addr(l, (struct sockaddr *)&a) || rdma_listen(l, 4))
		FAIL("server listen: %m");
	pthread_mutex_lock(&sa->m);
	sa->port = ntohs(rdma_get_src_port(l));
	pthread_cond_signal(&sa->c);
	pthread_mutex_unlock(&sa->m);
	printf("qpless: server listening on port %d\n", sa->port);
	fflush(stdout);

	id = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST, got, sizeof(got) - 1, &peer_qpn);
	if (strcmp(got, "client"))
		FAIL("REQ private data \"%s\"", got);
	make_qp(id, &s);
	move_qp(id, &s, IBV_QPS_INIT);
	post_recv(&s);
	rtr = move_qp(id, &s, IBV_QPS_RTR);
	if (rtr.dest_qp_num != peer_qpn)
		FAIL("RTR attributes name QP %u, the REQ %u", rtr.dest_qp_num, peer_qpn);
	/* No QP on the id: the REP names ours. */
	p.qp_num = s.qp->qp_num;
	snprintf(s.buf[1], 8, "%06u", s.qp->qp_num & 0xFFFF);
	p.private_data = s.buf[1];
	if (rdma_accept(id, &p))
		FAIL("rdma_accept: %m");
	expect(ch, RDMA_CM_EVENT_ESTABLISHED, NULL, 0, NULL);
	rts = move_qp(id, &s, IBV_QPS_RTS);
	(void)rts;
	/* rdma_establish is the active side's. */
	if (rdma_establish(id) == 0 || errno != EINVAL)
		FAIL("rdma_establish on the passive side did not fail with EINVAL");
	wait_wcs(&s, 1 << 1);
	if (strcmp(s.buf[0], "ping"))
		FAIL("server received \"%s\"", s.buf[0]);
	send_text(&s, "pong");
	wait_wcs(&s, 1 << 2);
	expect(ch, RDMA_CM_EVENT_DISCONNECTED, NULL, 0, NULL);
	(void)mask;
	teardown(id, &s);
	rdma_destroy_id(l);
	rdma_destroy_event_channel(ch);
	return NULL;
}

static void client(const char *addr, int port)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	struct rdma_conn_param p = { .responder_resources = 1, .initiator_depth = 1,
				     .retry_count = 7, .rnr_retry_count = 7,
				     .private_data = "client", .private_data_len = 7 };
	struct ibv_qp_attr x = { .qp_state = IBV_QPS_RTR }, rtr, rts;
	struct side s = { 0 };
	char got[16] = "", want[16];
	uint32_t peer_qpn;
	int mask;

	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		FAIL("client id: %m");
	inet_pton(AF_INET, addr, &a.sin_addr);
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&a, 2000))
		FAIL("rdma_resolve_addr: %m");
	expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, NULL, 0, NULL);
	if (rdma_resolve_route(id, 2000))
		FAIL("rdma_resolve_route: %m");
	expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL, 0, NULL);
	make_qp(id, &s);
	move_qp(id, &s, IBV_QPS_INIT);
	post_recv(&s);
	/* Nothing is known of the peer yet: srdma fails with EINVAL, kernel rdma_cm gives the
	 * INIT attributes again (not checked, printed). */
	printf("qpless: rdma_init_qp_attr(RTR) before the REP: %d\n", rdma_init_qp_attr(id, &x, &mask));
	if (rdma_establish(id) == 0 || errno != EINVAL)
		FAIL("rdma_establish before the REP did not fail with EINVAL");
	p.qp_num = s.qp->qp_num;
	if (rdma_connect(id, &p))
		FAIL("rdma_connect: %m");
	expect(ch, RDMA_CM_EVENT_CONNECT_RESPONSE, got, sizeof(got) - 1, &peer_qpn);
	snprintf(want, sizeof(want), "%06u", peer_qpn & 0xFFFF);
	if (strncmp(got, want, 6))
		FAIL("REP private data \"%s\", QP %u", got, peer_qpn);
	rtr = move_qp(id, &s, IBV_QPS_RTR);
	rts = move_qp(id, &s, IBV_QPS_RTS);
	if (rtr.dest_qp_num != peer_qpn || rts.qp_state != IBV_QPS_RTS)
		FAIL("attributes: RTR names QP %u, the REP %u", rtr.dest_qp_num, peer_qpn);
	if (rdma_establish(id))
		FAIL("rdma_establish: %m");
	send_text(&s, "ping");
	wait_wcs(&s, 1 << 1 | 1 << 2);
	if (strcmp(s.buf[0], "pong"))
		FAIL("client received \"%s\"", s.buf[0]);
	if (rdma_disconnect(id))
		FAIL("rdma_disconnect: %m");
	expect(ch, RDMA_CM_EVENT_DISCONNECTED, NULL, 0, NULL);
	teardown(id, &s);
	rdma_destroy_event_channel(ch);
}

int main(int argc, char **argv)
{
	struct server_args sa = { .m = PTHREAD_MUTEX_INITIALIZER, .c = PTHREAD_COND_INITIALIZER };
	pthread_t t;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 3 && !strcmp(argv[1], "both")) {
		sa.addr = argv[2];
		pthread_mutex_lock(&sa.m);
		if (pthread_create(&t, NULL, server, &sa))
			FAIL("pthread_create");
		while (sa.port == 0)
			pthread_cond_wait(&sa.c, &sa.m);
		pthread_mutex_unlock(&sa.m);
		client(argv[2], sa.port);
		pthread_join(t, NULL);
	} else if (argc == 4 && !strcmp(argv[1], "server")) {
		sa.addr = argv[2];
		sa.port = atoi(argv[3]);
		server(&sa);
	} else if (argc == 4 && !strcmp(argv[1], "client")) {
		client(argv[2], atoi(argv[3]));
	} else {
		fprintf(stderr, "usage: qpless both ADDRESS | server ADDRESS PORT | client ADDRESS PORT\n");
		return 2;
	}
	printf("qpless: ok\n");
	return 0;
}
