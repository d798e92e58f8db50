/*
 * Bad input through the C API: each check prints "ok NAME" or "FAIL NAME: why"; the exit
 * status is the number of failures. Built against the system's infiniband/verbs.h and run on
 * srdma's libibverbs.so.1 (tests/bad_input.rs). Expected values are rdma-core's (with the
 * rxe provider) errnos and completion statuses.
 *
 *   bad_input           every check
 *   bad_input fatal     waits for IBV_EVENT_DEVICE_FATAL (run with
 *                       SRDMA_INJECT_DEVICE_FAILURE_MS) and checks that work is flushed
 *                       and later calls fail
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int failures;

#define CHECK(name, cond, ...) do { \
	if (cond) printf("ok %s\n", name); \
	else { failures++; printf("FAIL %s: ", name); printf(__VA_ARGS__); printf("\n"); } \
} while (0)

static struct ibv_context *ctx;
static struct ibv_pd *pd;

static struct ibv_qp *make_qp(struct ibv_cq *cq, struct ibv_srq *srq, int sge)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq, .recv_cq = cq, .srq = srq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = sge,
			 .max_recv_sge = sge },
	};
	return ibv_create_qp(pd, &a);
}

static int to_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			     IBV_QP_ACCESS_FLAGS);
}

/* Connects qp to peer (both on this device) and moves it to RTS, with the local ACK timeout
 * `timeout` (4.096 us << timeout). */
static int connect_with(struct ibv_qp *qp, struct ibv_qp *peer, int timeout)
{
	union ibv_gid gid;
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = peer->qp_num,
		.rq_psn = 100, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1, .grh = { .hop_limit = 64, .sgid_index = 1 } },
	};
	if (ibv_query_gid(ctx, 1, 1, &gid))
		return -1;
	a.ah_attr.grh.dgid = gid;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -1;
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 100;
	a.timeout = timeout;
	a.retry_cnt = 2;
	a.rnr_retry = 2;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* An address vector whose source GID index names an empty entry fails at once with
 * ENODATA, as in the kernel (ibv_modify_qp, ibv_create_ah). (Past the table is EINVAL, but a
 * u8 index cannot reach past rxe's 1024 entries.) */
static void sgid_index_checks(struct ibv_cq *cq)
{
	union ibv_gid gid;
	struct ibv_qp *qp = make_qp(cq, NULL, 1);
	if (!qp || to_init(qp) || ibv_query_gid(ctx, 1, 1, &gid)) {
		CHECK("sgid-setup", 0, "errno %d", errno);
		return;
	}
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = qp->qp_num,
		.rq_psn = 1, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .hop_limit = 64, .dgid = gid, .sgid_index = 5 } },
	};
	int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	int r = ibv_modify_qp(qp, &a, mask);
	CHECK("rtr-empty-sgid", r == ENODATA && qp->state == IBV_QPS_INIT, "returned %d", r);
	a.ah_attr.grh.sgid_index = 5;
	errno = 0;
	CHECK("ah-empty-sgid", ibv_create_ah(pd, &a.ah_attr) == NULL && errno == ENODATA,
	      "errno %d", errno);
	a.ah_attr.grh.sgid_index = 1;
	struct ibv_ah *ah = ibv_create_ah(pd, &a.ah_attr);
	CHECK("ah-sgid-1", ah != NULL, "errno %d", errno);
	if (ah)
		ibv_destroy_ah(ah);
	r = ibv_modify_qp(qp, &a, mask);
	CHECK("rtr-sgid-1", r == 0, "returned %d", r);
	ibv_destroy_qp(qp);
}

static int connect_to(struct ibv_qp *qp, struct ibv_qp *peer)
{
	return connect_with(qp, peer, 10);
}

static int wait_wc(struct ibv_cq *cq, struct ibv_wc *wc)
{
	time_t end = time(NULL) + 10;
	int n;

	while ((n = ibv_poll_cq(cq, 1, wc)) == 0 && time(NULL) < end)
		;
	return n;
}

static int wait_event(enum ibv_event_type type, struct ibv_async_event *ev)
{
	time_t end = time(NULL) + 10;

	fcntl(ctx->async_fd, F_SETFL, fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK);
	while (time(NULL) < end) {
		if (ibv_get_async_event(ctx, ev) == 0) {
			enum ibv_event_type t = ev->event_type;

			ibv_ack_async_event(ev);
			if (t == type)
				return 0;
		} else {
			usleep(1000);
		}
	}
	return -1;
}

/* Takes every queued async event (acknowledging it): whether one of type `type` named `obj`
 * (compared as a pointer, never read: the object may be gone). */
static int event_named(enum ibv_event_type type, const void *obj)
{
	struct ibv_async_event ev;
	int seen = 0;

	fcntl(ctx->async_fd, F_SETFL, fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK);
	while (ibv_get_async_event(ctx, &ev) == 0) {
		if (ev.event_type == type && (const void *)ev.element.qp == obj)
			seen = 1;
		ibv_ack_async_event(&ev);
	}
	return seen;
}

/* A thread that destroys a QP and says when it is done. */
struct destroyer {
	struct ibv_qp *qp;
	int rc;
	volatile int done;
};

static void *destroy_qp_thread(void *arg)
{
	struct destroyer *d = arg;

	d->rc = ibv_destroy_qp(d->qp);
	d->done = 1;
	return NULL;
}

struct cq_destroyer {
	struct ibv_cq *cq;
	int rc;
	volatile int done;
};

static void *destroy_cq_thread(void *arg)
{
	struct cq_destroyer *d = arg;

	d->rc = ibv_destroy_cq(d->cq);
	d->done = 1;
	return NULL;
}

/* Waits up to 5 s for an async event of type `type` naming `obj`, acknowledging every event
 * it takes. */
static int wait_event_named(enum ibv_event_type type, const void *obj)
{
	time_t end = time(NULL) + 5;

	while (time(NULL) < end) {
		if (event_named(type, obj))
			return 1;
		usleep(1000);
	}
	return 0;
}

/* Polls `n` completions of status SUCCESS from `cq` within 10 s. */
static int wait_ok(struct ibv_cq *cq, int n)
{
	struct ibv_wc wc;

	while (n > 0) {
		if (wait_wc(cq, &wc) != 1 || wc.status != IBV_WC_SUCCESS)
			return 0;
		n--;
	}
	return 1;
}

static void fatal_scenario(void)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_qp *qp = make_qp(cq, NULL, 1);
	struct ibv_async_event ev;
	struct ibv_wc wc;
	char buf[64];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 42, .sg_list = &sge, .num_sge = 1 }, *rbad;
	struct ibv_send_wr swr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *sbad;

	CHECK("fatal-setup", cq && qp && mr && !to_init(qp) && !ibv_post_recv(qp, &rwr, &rbad),
	      "setup failed");
	CHECK("fatal-event", wait_event(IBV_EVENT_DEVICE_FATAL, &ev) == 0,
	      "no IBV_EVENT_DEVICE_FATAL within 10 s");
	CHECK("fatal-flush", wait_wc(cq, &wc) == 1 && wc.wr_id == 42 &&
	      wc.status == IBV_WC_WR_FLUSH_ERR, "the posted receive was not flushed");
	CHECK("fatal-post-fails", ibv_post_send(qp, &swr, &sbad) != 0,
	      "ibv_post_send succeeded on a dead device");
	CHECK("fatal-create-fails", ibv_create_cq(ctx, 4, NULL, NULL, 0) == NULL,
	      "ibv_create_cq succeeded on a dead device");
}

int main(int argc, char **argv)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_cq *cq, *small;
	struct ibv_qp *qp, *peer;
	struct ibv_srq *srq;
	struct ibv_mr *mr;
	struct ibv_comp_channel *ch;
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	struct ibv_port_attr pa;
	union ibv_gid gid;
	struct ibv_wc wc;
	struct ibv_async_event ev;
	struct ibv_srq_init_attr si = { .attr = { .max_wr = 8, .max_sge = 1 } };
	static char buf[4096];
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64 };
	struct ibv_send_wr swr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				   .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED }, *sbad;
	struct ibv_recv_wr rwr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1 }, *rbad;
	struct ibv_sge many[64];
	void *cq_ctx;
	struct ibv_cq *ev_cq;
	int i;

	if (!list || !list[0])
		return printf("FAIL no device\n"), 1;
	errno = 0;
	CHECK("open-null", ibv_open_device(NULL) == NULL, "opened a NULL device");
	ctx = ibv_open_device(list[0]);
	pd = ibv_alloc_pd(ctx);
	if (!ctx || !pd)
		return printf("FAIL open/alloc_pd: %s\n", strerror(errno)), 1;
	if (argc > 1 && !strcmp(argv[1], "fatal")) {
		fatal_scenario();
		return failures;
	}
	CHECK("alloc-pd-null", ibv_alloc_pd(NULL) == NULL && errno == EINVAL, "errno %d", errno);
	CHECK("query-port-2", ibv_query_port(ctx, 2, &pa) == EINVAL, "port 2 accepted");
	CHECK("query-gid-past-table", ibv_query_gid(ctx, 1, 1 << 20, &gid) != 0, "returned");
	CHECK("query-gid-empty-slot", ibv_query_gid(ctx, 1, 5, &gid) == 0 && gid.global.interface_id == 0, "not zero");

	/* Memory registration. */
	errno = 0;
	CHECK("reg-mr-null-pd", ibv_reg_mr(NULL, buf, 64, 0) == NULL && errno == EINVAL,
	      "errno %d", errno);
	errno = 0;
	CHECK("reg-mr-remote-write-without-local",
	      ibv_reg_mr(pd, buf, 64, IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EINVAL,
	      "errno %d", errno);
	errno = 0;
	CHECK("reg-mr-odp", ibv_reg_mr(pd, buf, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND)
	      == NULL && errno == EOPNOTSUPP, "errno %d", errno);
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			IBV_ACCESS_REMOTE_READ);
	CHECK("reg-mr-stack-or-static", mr && mr->addr == buf && mr->length == sizeof(buf),
	      "errno %d", errno);
	{
		/* ibv_rereg_mr: refused input leaves the region as it was (keys, rights). */
		uint32_t lkey = mr->lkey, rkey = mr->rkey;
		errno = 0;
		CHECK("rereg-null", ibv_rereg_mr(NULL, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
						 IBV_ACCESS_LOCAL_WRITE) == IBV_REREG_MR_ERR_INPUT &&
		      errno == EINVAL, "errno %d", errno);
		errno = 0;
		CHECK("rereg-unknown-flag", ibv_rereg_mr(mr, 1 << 5, NULL, NULL, 0, 0) ==
		      IBV_REREG_MR_ERR_INPUT && errno == EINVAL, "errno %d", errno);
		errno = 0;
		CHECK("rereg-translation-without-address",
		      ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, 64, 0) ==
		      IBV_REREG_MR_ERR_INPUT && errno == EINVAL, "errno %d", errno);
		errno = 0;
		CHECK("rereg-access-without-flag",
		      ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd, NULL, 0, IBV_ACCESS_LOCAL_WRITE) ==
		      IBV_REREG_MR_ERR_INPUT && errno == EINVAL, "errno %d", errno);
		errno = 0;
		CHECK("rereg-remote-write-without-local",
		      ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
				   IBV_ACCESS_REMOTE_WRITE) == IBV_REREG_MR_ERR_INPUT &&
		      errno == EINVAL, "errno %d", errno);
		errno = 0;
		CHECK("rereg-null-pd", ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, NULL, NULL, 0, 0) ==
		      IBV_REREG_MR_ERR_INPUT && errno == EINVAL, "errno %d", errno);
		CHECK("rereg-refused-keeps-mr", mr->lkey == lkey && mr->rkey == rkey &&
		      mr->addr == buf && mr->pd == pd, "changed");
		CHECK("rereg-same-pd", ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd, NULL, 0, 0) == 0 &&
		      mr->lkey == lkey && mr->rkey == rkey, "errno %d", errno);
	}
	sge.lkey = mr->lkey;

	/* CQs and QPs. */
	errno = 0;
	CHECK("create-cq-0", ibv_create_cq(ctx, 0, NULL, NULL, 0) == NULL && errno == EINVAL,
	      "errno %d", errno);
	errno = 0;
	CHECK("create-cq-huge", ibv_create_cq(ctx, 1 << 30, NULL, NULL, 0) == NULL &&
	      errno == EINVAL, "errno %d", errno);
	/* A completion vector per possible CPU, as rxe; any of them, and none past them. */
	CHECK("comp-vectors", ctx->num_comp_vectors == sysconf(_SC_NPROCESSORS_CONF), "%d vectors",
	      ctx->num_comp_vectors);
	cq = ibv_create_cq(ctx, 4, NULL, NULL, ctx->num_comp_vectors - 1);
	CHECK("create-cq-last-vector", cq != NULL, "errno %d", errno);
	if (cq)
		ibv_destroy_cq(cq);
	errno = 0;
	CHECK("create-cq-bad-vector", ibv_create_cq(ctx, 4, NULL, NULL, ctx->num_comp_vectors) ==
	      NULL && errno == EINVAL, "errno %d", errno);
	errno = 0;
	CHECK("create-cq-negative-vector", ibv_create_cq(ctx, 4, NULL, NULL, -1) == NULL &&
	      errno == EINVAL, "errno %d", errno);
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	sgid_index_checks(cq);
	errno = 0;
	CHECK("create-qp-no-cq", make_qp(NULL, NULL, 1) == NULL && errno == EINVAL,
	      "errno %d", errno);
	errno = 0;
	CHECK("create-qp-too-many-sge", make_qp(cq, NULL, 100000) == NULL && errno == EINVAL,
	      "errno %d", errno);
	{
		struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RAW_PACKET,
					      .cap = { .max_send_wr = 1, .max_send_sge = 1 } };
		errno = 0;
		CHECK("create-qp-raw", ibv_create_qp(pd, &a) == NULL && errno == EOPNOTSUPP,
		      "errno %d", errno);
		/* XRC_SEND is supported (tests/c/xrc_bad_input.c); XRC_RECV needs ibv_create_qp_ex. */
		a.qp_type = IBV_QPT_XRC_RECV;
		errno = 0;
		CHECK("create-qp-xrc-recv", ibv_create_qp(pd, &a) == NULL && errno == EOPNOTSUPP,
		      "errno %d", errno);
	}
	qp = make_qp(cq, NULL, 2);
	peer = make_qp(cq, NULL, 2);
	CHECK("create-qp", qp && peer && qp->state == IBV_QPS_RESET, "errno %d", errno);
	errno = 0;
	CHECK("post-send-in-reset", ibv_post_send(qp, &swr, &sbad) == EINVAL && sbad == &swr,
	      "not refused");
	qa.qp_state = IBV_QPS_RTS;
	CHECK("modify-reset-to-rts", ibv_modify_qp(qp, &qa, IBV_QP_STATE) == EINVAL,
	      "RESET->RTS accepted");
	CHECK("modify-null-attr", ibv_modify_qp(qp, NULL, IBV_QP_STATE) == EINVAL, "accepted");
	CHECK("connect", !to_init(qp) && !to_init(peer) && !connect_to(qp, peer) &&
	      !connect_to(peer, qp), "could not connect two QPs of this device");
	CHECK("query-qp", !ibv_query_qp(qp, &qa, IBV_QP_STATE, &qi) && qa.qp_state == IBV_QPS_RTS &&
	      qi.cap.max_send_sge >= 2, "state %d", qa.qp_state);
	for (i = 0; i < 64; i++)
		many[i] = sge;
	swr.sg_list = many;
	swr.num_sge = 64;
	CHECK("post-send-too-many-sge", ibv_post_send(qp, &swr, &sbad) == EINVAL && sbad == &swr,
	      "64 SGEs accepted on a 2-SGE QP");
	swr.sg_list = &sge;
	swr.num_sge = 1;
	swr.opcode = 77;
	CHECK("post-send-bad-opcode", ibv_post_send(qp, &swr, &sbad) == EINVAL, "accepted");

	/* Data path errors come back as completions. */
	swr.opcode = IBV_WR_RDMA_WRITE;
	swr.wr.rdma.remote_addr = (uintptr_t)buf;
	swr.wr.rdma.rkey = mr->rkey ^ 0x5500;
	CHECK("write-bad-rkey-posts", ibv_post_send(qp, &swr, &sbad) == 0, "post failed");
	CHECK("write-bad-rkey-completes", wait_wc(cq, &wc) == 1 &&
	      wc.status == IBV_WC_REM_ACCESS_ERR, "status %s", ibv_wc_status_str(wc.status));
	CHECK("qp-fatal-event", wait_event(IBV_EVENT_QP_FATAL, &ev) == 0, "no QP_FATAL");
	CHECK("qp-in-err", !ibv_query_qp(qp, &qa, IBV_QP_STATE, &qi) && qa.qp_state == IBV_QPS_ERR,
	      "state %d", qa.qp_state);

	{
		/* A fresh pair for the local key check. */
		struct ibv_qp *a = make_qp(cq, NULL, 1), *b = make_qp(cq, NULL, 1);

		CHECK("pair2", a && b && !to_init(a) && !to_init(b) && !connect_to(a, b) &&
		      !connect_to(b, a), "setup");
		sge.lkey = mr->lkey ^ 0x7700;
		swr.wr.rdma.rkey = mr->rkey;
		CHECK("write-bad-lkey-posts", ibv_post_send(a, &swr, &sbad) == 0, "post failed");
		CHECK("write-bad-lkey-completes", wait_wc(cq, &wc) == 1 &&
		      wc.status == IBV_WC_LOC_PROT_ERR, "status %s", ibv_wc_status_str(wc.status));
		sge.lkey = mr->lkey;
		ibv_destroy_qp(a);
		ibv_destroy_qp(b);
	}

	/* SRQ. */
	srq = ibv_create_srq(pd, &si);
	{
		struct ibv_qp *s = make_qp(cq, srq, 1);

		CHECK("srq-qp", srq && s, "errno %d", errno);
		CHECK("post-recv-on-srq-qp", s && to_init(s) == 0 &&
		      ibv_post_recv(s, &rwr, &rbad) == EINVAL, "accepted");
		CHECK("destroy-srq-in-use", ibv_destroy_srq(srq) == EBUSY, "not EBUSY");
		ibv_destroy_qp(s);
		CHECK("destroy-srq", ibv_destroy_srq(srq) == 0, "failed");
	}

	/* As rdma-core with a kernel provider: destroying a QP drops its async events not taken
	 * yet, and waits until those taken are acknowledged. An SRQ's QP moved to ERR reports
	 * IBV_EVENT_QP_LAST_WQE_REACHED (queued before ibv_modify_qp returns). */
	srq = ibv_create_srq(pd, &si);
	{
		struct ibv_qp *s = make_qp(cq, srq, 1);
		struct ibv_qp *gone = s;
		struct destroyer d = { 0 };
		pthread_t t;

		event_named(IBV_EVENT_QP_LAST_WQE_REACHED, NULL); /* what came before */
		qa.qp_state = IBV_QPS_ERR;
		CHECK("srq-qp-to-err", s && to_init(s) == 0 && ibv_modify_qp(s, &qa, IBV_QP_STATE) == 0,
		      "errno %d", errno);
		ibv_destroy_qp(s);
		CHECK("destroy-qp-drops-its-events",
		      !event_named(IBV_EVENT_QP_LAST_WQE_REACHED, gone),
		      "an event named a destroyed QP");

		d.qp = make_qp(cq, srq, 1);
		CHECK("last-wqe-reached", d.qp && to_init(d.qp) == 0 &&
		      ibv_modify_qp(d.qp, &qa, IBV_QP_STATE) == 0 &&
		      ibv_get_async_event(ctx, &ev) == 0 &&
		      ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED && ev.element.qp == d.qp,
		      "no IBV_EVENT_QP_LAST_WQE_REACHED for the QP");
		pthread_create(&t, NULL, destroy_qp_thread, &d);
		usleep(200 * 1000);
		CHECK("destroy-qp-waits-for-ack", !d.done, "returned with an event not acknowledged");
		ibv_ack_async_event(&ev);
		pthread_join(t, NULL);
		CHECK("destroy-qp-after-ack", d.done && d.rc == 0, "rc %d", d.rc);
		CHECK("destroy-srq-again", ibv_destroy_srq(srq) == 0, "failed");
	}

	/* The SRQ limit, as rxe: armed by ibv_modify_srq, one IBV_EVENT_SRQ_LIMIT_REACHED when a
	 * receive leaves fewer WQEs posted than the limit, then disarmed (ibv_query_srq says 0). */
	srq = ibv_create_srq(pd, &si);
	{
		struct ibv_qp *s = make_qp(cq, srq, 1), *src = make_qp(cq, NULL, 1);
		struct ibv_srq_attr sa = { .srq_limit = 100 };
		struct ibv_send_wr send = { .wr_id = 7, .sg_list = &sge, .num_sge = 1,
					    .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };

		while (ibv_poll_cq(cq, 1, &wc) > 0)
			;
		event_named(IBV_EVENT_SRQ_LIMIT_REACHED, NULL);
		CHECK("srq-limit-setup", srq && s && src && !to_init(s) && !to_init(src) &&
		      !connect_to(s, src) && !connect_to(src, s), "setup");
		for (i = 0; i < 4; i++)
			ibv_post_srq_recv(srq, &rwr, &rbad);
		CHECK("srq-limit-above-size", ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT) == EINVAL,
		      "a limit of 100 on an SRQ of 8 accepted");
		sa.srq_limit = 3;
		CHECK("srq-limit-arm", ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT) == 0 &&
		      ibv_query_srq(srq, &sa) == 0 && sa.srq_limit == 3, "limit %u", sa.srq_limit);
		CHECK("srq-limit-first-send", ibv_post_send(src, &send, &sbad) == 0 &&
		      wait_ok(cq, 2), "send/receive failed");
		CHECK("srq-limit-not-yet", !event_named(IBV_EVENT_SRQ_LIMIT_REACHED, srq),
		      "raised with 3 WQEs posted and a limit of 3");
		CHECK("srq-limit-second-send", ibv_post_send(src, &send, &sbad) == 0 &&
		      wait_ok(cq, 2), "send/receive failed");
		CHECK("srq-limit-reached", wait_event_named(IBV_EVENT_SRQ_LIMIT_REACHED, srq),
		      "no IBV_EVENT_SRQ_LIMIT_REACHED naming the SRQ with 2 WQEs left");
		CHECK("srq-limit-disarmed", ibv_query_srq(srq, &sa) == 0 && sa.srq_limit == 0,
		      "limit %u after the event", sa.srq_limit);
		CHECK("srq-limit-once", ibv_post_send(src, &send, &sbad) == 0 && wait_ok(cq, 2) &&
		      !event_named(IBV_EVENT_SRQ_LIMIT_REACHED, srq), "raised again while disarmed");
		ibv_destroy_qp(s);
		ibv_destroy_qp(src);
		CHECK("srq-limit-destroy", ibv_destroy_srq(srq) == 0, "failed");
	}

	/* SQD, as rxe: RTS->SQD lets the messages in progress finish and starts no new one;
	 * ibv_query_qp says sq_draining until they are done, a move out of SQD but to ERR is
	 * refused meanwhile, and IBV_EVENT_SQ_DRAINED tells when it ends. The peer stays in INIT
	 * (it drops the WRITE) until the drain has been seen; the WRITE's resend, one ACK timeout
	 * (timeout 18, ~1 s) later, then completes it. */
	{
		struct ibv_qp *a = make_qp(cq, NULL, 1), *b = make_qp(cq, NULL, 1);
		struct ibv_send_wr w = { .wr_id = 9, .sg_list = &sge, .num_sge = 1,
					 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED };

		while (ibv_poll_cq(cq, 1, &wc) > 0)
			;
		event_named(IBV_EVENT_SQ_DRAINED, NULL);
		w.wr.rdma.remote_addr = (uintptr_t)buf;
		w.wr.rdma.rkey = mr->rkey;
		CHECK("sqd-setup", a && b && !to_init(a) && !to_init(b) && !connect_with(a, b, 18) &&
		      !ibv_post_send(a, &w, &sbad), "setup, errno %d", errno);
		qa.qp_state = IBV_QPS_SQD;
		qa.en_sqd_async_notify = 1;
		CHECK("sqd-enter", !ibv_modify_qp(a, &qa, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY),
		      "errno %d", errno);
		CHECK("sqd-draining", !ibv_query_qp(a, &qa, IBV_QP_STATE, &qi) &&
		      qa.qp_state == IBV_QPS_SQD && qa.sq_draining == 1,
		      "state %d sq_draining %d", qa.qp_state, qa.sq_draining);
		qa.qp_state = IBV_QPS_RTS;
		CHECK("sqd-to-rts-while-draining", ibv_modify_qp(a, &qa, IBV_QP_STATE) == EINVAL,
		      "accepted with a WRITE in flight");
		CHECK("sqd-no-event-while-draining", !event_named(IBV_EVENT_SQ_DRAINED, a),
		      "drained with a WRITE unacknowledged");
		CHECK("sqd-peer-up", !connect_to(b, a), "errno %d", errno);
		CHECK("sqd-drained-event", wait_event_named(IBV_EVENT_SQ_DRAINED, a),
		      "no IBV_EVENT_SQ_DRAINED naming the QP");
		CHECK("sqd-write-completed", wait_wc(cq, &wc) == 1 && wc.wr_id == 9 &&
		      wc.status == IBV_WC_SUCCESS, "status %s", ibv_wc_status_str(wc.status));
		CHECK("sqd-drained", !ibv_query_qp(a, &qa, IBV_QP_STATE, &qi) && qa.sq_draining == 0,
		      "sq_draining %d", qa.sq_draining);
		qa.qp_state = IBV_QPS_RTS;
		CHECK("sqd-to-rts-after-drain", !ibv_modify_qp(a, &qa, IBV_QP_STATE), "errno %d", errno);
		/* Nothing in flight: drained at once, back to RTS straight away. */
		qa.qp_state = IBV_QPS_SQD;
		CHECK("sqd-idle-round-trip", !ibv_modify_qp(a, &qa, IBV_QP_STATE) &&
		      wait_event_named(IBV_EVENT_SQ_DRAINED, a) &&
		      !ibv_modify_qp(a, &(struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS }, IBV_QP_STATE),
		      "errno %d", errno);
		ibv_destroy_qp(a);
		ibv_destroy_qp(b);
	}

	/* As rdma-core: ibv_destroy_cq waits until the completion events ibv_get_cq_event gave
	 * out are acknowledged. */
	{
		struct ibv_comp_channel *c2 = ibv_create_comp_channel(ctx);
		struct ibv_cq *ecq = c2 ? ibv_create_cq(ctx, 8, NULL, c2, 0) : NULL;
		struct ibv_qp *a = ecq ? make_qp(ecq, NULL, 1) : NULL;
		struct cq_destroyer d = { .cq = ecq };
		time_t end = time(NULL) + 10;
		int got = -1;
		pthread_t t;

		qa.qp_state = IBV_QPS_ERR;
		CHECK("cq-event-setup", a && !to_init(a) && !ibv_req_notify_cq(ecq, 0) &&
		      !ibv_post_recv(a, &rwr, &rbad) && !ibv_modify_qp(a, &qa, IBV_QP_STATE),
		      "setup");
		fcntl(c2->fd, F_SETFL, fcntl(c2->fd, F_GETFL) | O_NONBLOCK);
		while (time(NULL) < end && (got = ibv_get_cq_event(c2, &ev_cq, &cq_ctx)) != 0)
			usleep(1000);
		CHECK("cq-event-of-flush", got == 0 && ev_cq == ecq, "no completion event");
		while (ibv_poll_cq(ecq, 1, &wc) > 0)
			;
		ibv_destroy_qp(a);
		pthread_create(&t, NULL, destroy_cq_thread, &d);
		usleep(200 * 1000);
		CHECK("destroy-cq-waits-for-ack", !d.done, "returned with an event not acknowledged");
		ibv_ack_cq_events(ecq, 1);
		pthread_join(t, NULL);
		CHECK("destroy-cq-after-ack", d.done && d.rc == 0, "rc %d", d.rc);
		CHECK("destroy-channel-after-cq", ibv_destroy_comp_channel(c2) == 0, "failed");
	}

	/* Completion channels. */
	ch = ibv_create_comp_channel(ctx);
	small = ibv_create_cq(ctx, 2, (void *)0x1234, ch, 0);
	CHECK("channel", ch && small && small->channel == ch, "errno %d", errno);
	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
	errno = 0;
	CHECK("get-cq-event-nonblocking", ibv_get_cq_event(ch, &ev_cq, &cq_ctx) == -1 &&
	      errno == EAGAIN, "errno %d", errno);
	CHECK("destroy-channel-in-use", ibv_destroy_comp_channel(ch) == EBUSY, "not EBUSY");

	/* A CQ overrun: IBV_EVENT_CQ_ERR and its QP in ERR. */
	{
		struct ibv_qp *a = make_qp(small, NULL, 1);

		CHECK("overrun-setup", a && !to_init(a), "setup");
		for (i = 0; i < 4; i++)
			ibv_post_recv(a, &rwr, &rbad);
		ibv_req_notify_cq(small, 0);
		qa.qp_state = IBV_QPS_ERR;
		ibv_modify_qp(a, &qa, IBV_QP_STATE);
		CHECK("cq-err-event", wait_event(IBV_EVENT_CQ_ERR, &ev) == 0, "no CQ_ERR");
		CHECK("cq-event-after-arm", ibv_get_cq_event(ch, &ev_cq, &cq_ctx) == 0 &&
		      ev_cq == small && cq_ctx == (void *)0x1234, "no completion event");
		ibv_ack_cq_events(small, 1);
		CHECK("destroy-cq-in-use", ibv_destroy_cq(small) == EBUSY, "not EBUSY");
		ibv_destroy_qp(a);
	}
	CHECK("destroy-cq", ibv_destroy_cq(small) == 0, "failed");
	CHECK("destroy-channel", ibv_destroy_comp_channel(ch) == 0, "failed");

	/* Teardown in the wrong order, and twice. */
	CHECK("dealloc-pd-in-use", ibv_dealloc_pd(pd) == EBUSY, "not EBUSY");
	CHECK("destroy-qp", ibv_destroy_qp(qp) == 0, "failed");
	CHECK("destroy-qp-twice", ibv_destroy_qp(qp) == EINVAL, "not EINVAL");
	CHECK("dereg-mr", ibv_dereg_mr(mr) == 0, "failed");
	CHECK("dereg-mr-twice", ibv_dereg_mr(mr) == EINVAL, "not EINVAL");
	ibv_destroy_qp(peer);
	CHECK("dealloc-pd", ibv_dealloc_pd(pd) == 0, "failed");
	CHECK("dealloc-pd-twice", ibv_dealloc_pd(pd) == EINVAL, "not EINVAL");
	CHECK("destroy-cq-last", ibv_destroy_cq(cq) == 0, "failed");
	CHECK("close", ibv_close_device(ctx) == 0, "failed");
	CHECK("close-twice", ibv_close_device(ctx) == EINVAL, "not EINVAL");
	ibv_free_device_list(list);
	printf("%d failures\n", failures);
	return failures;
}
