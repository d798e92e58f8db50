/* A listener destroyed and created again on the same port: a REQ that arrives in between
 * waits for the new listener instead of being rejected (perftest -R relies on this timing),
 * and a REQ to a port nobody listens on again is rejected with "invalid service ID" (8)
 * once the old listener's grace has passed.
 *
 * Usage: relisten ADDRESS. Prints "relisten: ok" and exits 0 on success. */
#include <arpa/inet.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FAIL(...) do { fprintf(stderr, "relisten: " __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* The next event on ch within ms milliseconds (acknowledged; its type and status copied), or -1. */
static int next_event(struct rdma_event_channel *ch, int ms, int *status, struct rdma_cm_id **id)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;
	int type;

	if (poll(&p, 1, ms) <= 0)
		return -1;
	if (rdma_get_cm_event(ch, &ev))
		FAIL("rdma_get_cm_event: %m");
	type = ev->event;
	if (status)
		*status = ev->status;
	if (id)
		*id = ev->id;
	rdma_ack_cm_event(ev);
	return type;
}

static struct rdma_cm_id *listen_on(struct rdma_event_channel *ch, struct sockaddr_in *a)
{
	struct rdma_cm_id *l;

	if (rdma_create_id(ch, &l, NULL, RDMA_PS_TCP))
		FAIL("rdma_create_id: %m");
	if (rdma_bind_addr(l, (struct sockaddr *)a))
		FAIL("rdma_bind_addr: %m");
	if (rdma_listen(l, 4))
		FAIL("rdma_listen: %m");
	return l;
}

/* An RC id connecting to a (REQ sent when this returns). */
static struct rdma_cm_id *connect_to(struct rdma_event_channel *ch, struct sockaddr_in *a)
{
	struct rdma_cm_id *c;
	struct ibv_qp_init_attr qa = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct rdma_conn_param cp = { .retry_count = 7, .rnr_retry_count = 7 };
	int type, status = 0;

	if (rdma_create_id(ch, &c, NULL, RDMA_PS_TCP))
		FAIL("rdma_create_id: %m");
	if (rdma_resolve_addr(c, NULL, (struct sockaddr *)a, 2000))
		FAIL("rdma_resolve_addr: %m");
	if ((type = next_event(ch, 2000, &status, NULL)) != RDMA_CM_EVENT_ADDR_RESOLVED)
		FAIL("no ADDR_RESOLVED but %s (status %d)", type < 0 ? "nothing" : rdma_event_str(type), status);
	if (rdma_resolve_route(c, 2000))
		FAIL("rdma_resolve_route: %m");
	if ((type = next_event(ch, 2000, &status, NULL)) != RDMA_CM_EVENT_ROUTE_RESOLVED)
		FAIL("no ROUTE_RESOLVED but %s (status %d)", type < 0 ? "nothing" : rdma_event_str(type), status);
	if (rdma_create_qp(c, NULL, &qa))
		FAIL("rdma_create_qp: %m");
	if (rdma_connect(c, &cp))
		FAIL("rdma_connect: %m");
	return c;
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *sch = rdma_create_event_channel();
	struct rdma_event_channel *cch = rdma_create_event_channel();
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(18911) };
	struct rdma_cm_id *l, *c, *req = NULL;
	struct ibv_qp_init_attr qa = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct rdma_conn_param cp = { .retry_count = 7, .rnr_retry_count = 7 };
	int type, status = 0;
	double t0;

	if (argc != 2 || inet_pton(AF_INET, argv[1], &a.sin_addr) != 1)
		FAIL("usage: relisten IPV4-ADDRESS");
	if (!sch || !cch)
		FAIL("rdma_create_event_channel: %m");

	/* 1. Listen, stop listening, connect, listen again: the REQ waits for the new listener. */
	l = listen_on(sch, &a);
	if (rdma_destroy_id(l))
		FAIL("rdma_destroy_id(listener): %m");
	c = connect_to(cch, &a);
	type = next_event(cch, 300, &status, NULL);
	if (type != -1)
		FAIL("the REQ to a port listened on again soon got %s (status %d) before the new listener",
		     rdma_event_str(type), status);
	l = listen_on(sch, &a);
	if (next_event(sch, 3000, NULL, &req) != RDMA_CM_EVENT_CONNECT_REQUEST)
		FAIL("the new listener got no CONNECT_REQUEST");
	if (rdma_create_qp(req, NULL, &qa))
		FAIL("rdma_create_qp (passive): %m");
	if (rdma_accept(req, &cp))
		FAIL("rdma_accept: %m");
	if ((type = next_event(cch, 3000, &status, NULL)) != RDMA_CM_EVENT_ESTABLISHED)
		FAIL("client: %s (status %d), not ESTABLISHED", type < 0 ? "nothing" : rdma_event_str(type), status);
	if ((type = next_event(sch, 3000, NULL, NULL)) != RDMA_CM_EVENT_ESTABLISHED)
		FAIL("server: %s, not ESTABLISHED", type < 0 ? "nothing" : rdma_event_str(type));
	rdma_disconnect(c);
	rdma_destroy_qp(c);
	rdma_destroy_id(c);
	rdma_destroy_qp(req);
	rdma_destroy_id(req);
	rdma_destroy_id(l);
	printf("relisten: a REQ between two listeners reached the second\n");

	/* 2. A port nobody listens on again: rejected with 8 (invalid service ID), after the grace. */
	a.sin_port = htons(18912);
	l = listen_on(sch, &a);
	if (rdma_destroy_id(l))
		FAIL("rdma_destroy_id(listener): %m");
	t0 = now();
	c = connect_to(cch, &a);
	do
		type = next_event(cch, 6000, &status, NULL);
	while (type == RDMA_CM_EVENT_DISCONNECTED);
	if (type != RDMA_CM_EVENT_REJECTED || status != 8)
		FAIL("a REQ to a closed port got %s (status %d), not REJECTED 8",
		     type < 0 ? "nothing" : rdma_event_str(type), status);
	printf("relisten: a REQ to a closed port was rejected (8) after %.2f s\n", now() - t0);
	rdma_destroy_qp(c);
	rdma_destroy_id(c);
	rdma_destroy_event_channel(sch);
	rdma_destroy_event_channel(cch);
	printf("relisten: ok\n");
	return 0;
}
