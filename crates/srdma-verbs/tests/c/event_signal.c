/* ibv_get_cq_event and rdma_get_cm_event and signals, as on a kernel device, where each is a
 * read(2) or write(2) of a character device: a signal whose handler was installed without
 * SA_RESTART ends the wait with -1 and EINTR (qperf's interval timer ends its event-mode tests
 * so); with SA_RESTART the wait goes on until the event arrives (a UD SEND of the QP to itself,
 * rdma_resolve_addr's ADDR_RESOLVED, each started by a second thread).
 *
 * Usage: event_signal   (the first device, GID index 1; resolves 127.0.0.1)
 * Prints "event_signal: ok" and exits 0 on success. */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define FAIL(...) do { fprintf(stderr, "event_signal: " __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)
#define QKEY 0x11111111

static volatile sig_atomic_t alarms;
static struct ibv_qp *qp;
static struct ibv_ah *ah;
static struct ibv_mr *mr;
static char buf[2][128]; /* [0] receive (GRH + payload), [1] send */

static void on_alarm(int sig)
{
	(void)sig;
	alarms++;
}

static void handle(int flags)
{
	struct sigaction act;

	memset(&act, 0, sizeof(act));
	act.sa_handler = on_alarm;
	act.sa_flags = flags;
	if (sigaction(SIGALRM, &act, NULL))
		FAIL("sigaction: %m");
}

/* One SIGALRM after ms milliseconds. */
static void alarm_in(int ms)
{
	struct itimerval t = { .it_value = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 } };

	if (setitimer(ITIMER_REAL, &t, NULL))
		FAIL("setitimer: %m");
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *send_later(void *arg)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf[1], .length = 16, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;

	(void)arg;
	usleep(400 * 1000);
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = qp->qp_num;
	wr.wr.ud.remote_qkey = QKEY;
	if (ibv_post_send(qp, &wr, &bad))
		FAIL("ibv_post_send: %m");
	return NULL;
}

static struct rdma_cm_id *cm_id;

static void *resolve_later(void *arg)
{
	struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(7471) };

	(void)arg;
	usleep(400 * 1000);
	dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (rdma_resolve_addr(cm_id, NULL, (struct sockaddr *)&dst, 2000))
		FAIL("rdma_resolve_addr: %m");
	return NULL;
}

/* rdma_get_cm_event: EINTR without SA_RESTART; with it, the wait lasts until the event. */
static void cm_event(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_event *ev;
	pthread_t t;
	double start;
	int r;

	if (!ch || rdma_create_id(ch, &cm_id, NULL, RDMA_PS_TCP))
		FAIL("rdma_create_event_channel/rdma_create_id: %m");
	handle(0);
	alarms = 0;
	alarm_in(200);
	errno = 0;
	r = rdma_get_cm_event(ch, &ev);
	if (r != -1 || errno != EINTR || alarms != 1)
		FAIL("without SA_RESTART: rdma_get_cm_event returned %d, errno %d (%s), %d alarms; "
		     "want -1, EINTR", r, errno, strerror(errno), (int)alarms);

	handle(SA_RESTART);
	if (pthread_create(&t, NULL, resolve_later, NULL))
		FAIL("pthread_create");
	alarm_in(100);
	start = now();
	if (rdma_get_cm_event(ch, &ev))
		FAIL("with SA_RESTART: rdma_get_cm_event: %m");
	if (ev->event != RDMA_CM_EVENT_ADDR_RESOLVED || alarms != 2 || now() - start < 0.3)
		FAIL("with SA_RESTART: %s after %.3f s, %d alarms", rdma_event_str(ev->event),
		     now() - start, (int)alarms);
	rdma_ack_cm_event(ev);
	pthread_join(t, NULL);
	rdma_destroy_id(cm_id);
	rdma_destroy_event_channel(ch);
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq, *ev_cq;
	struct ibv_pd *pd;
	void *ev_ctx;
	union ibv_gid gid;
	pthread_t t;
	double start;
	int r;

	if (!list || !list[0])
		FAIL("no device");
	ctx = ibv_open_device(list[0]);
	if (!ctx)
		FAIL("ibv_open_device: %m");
	if (ibv_query_gid(ctx, 1, 1, &gid))
		FAIL("ibv_query_gid: %m");
	pd = ibv_alloc_pd(ctx);
	ch = ibv_create_comp_channel(ctx);
	cq = ch ? ibv_create_cq(ctx, 8, NULL, ch, 0) : NULL;
	mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!pd || !cq || !mr)
		FAIL("setting up: %m");
	{
		struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
					       .cap = { .max_send_wr = 2, .max_recv_wr = 2,
							.max_send_sge = 1, .max_recv_sge = 1 } };
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };
		struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1,
					  .grh = { .dgid = gid, .sgid_index = 1, .hop_limit = 64 } };
		struct ibv_sge sge = { .addr = (uintptr_t)buf[0], .length = 128, .lkey = mr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;

		qp = ibv_create_qp(pd, &ia);
		if (!qp)
			FAIL("ibv_create_qp: %m");
		if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
			FAIL("INIT: %m");
		a.qp_state = IBV_QPS_RTR;
		if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
			FAIL("RTR: %m");
		a.qp_state = IBV_QPS_RTS;
		a.sq_psn = 1;
		if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
			FAIL("RTS: %m");
		ah = ibv_create_ah(pd, &aa);
		if (!ah)
			FAIL("ibv_create_ah: %m");
		if (ibv_post_recv(qp, &rwr, &bad))
			FAIL("ibv_post_recv: %m");
	}
	if (ibv_req_notify_cq(cq, 0))
		FAIL("ibv_req_notify_cq: %m");

	/* Without SA_RESTART: the wait ends with EINTR. */
	handle(0);
	alarm_in(200);
	errno = 0;
	start = now();
	r = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
	if (r != -1 || errno != EINTR)
		FAIL("without SA_RESTART: ibv_get_cq_event returned %d, errno %d (%s), want -1, EINTR",
		     r, errno, strerror(errno));
	if (alarms != 1 || now() - start > 5)
		FAIL("without SA_RESTART: %d alarms, %.1f s", (int)alarms, now() - start);

	/* With SA_RESTART: the alarm at 100 ms does not end the wait; the completion at 400 ms
	 * does. */
	handle(SA_RESTART);
	if (pthread_create(&t, NULL, send_later, NULL))
		FAIL("pthread_create");
	alarm_in(100);
	start = now();
	r = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
	if (r != 0)
		FAIL("with SA_RESTART: ibv_get_cq_event: %m");
	if (ev_cq != cq || alarms != 2 || now() - start < 0.3)
		FAIL("with SA_RESTART: event after %.3f s, %d alarms", now() - start, (int)alarms);
	pthread_join(t, NULL);
	ibv_ack_cq_events(cq, 1);

	ibv_destroy_qp(qp);
	ibv_destroy_ah(ah);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_destroy_comp_channel(ch);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	cm_event();
	printf("event_signal: ok\n");
	return 0;
}
