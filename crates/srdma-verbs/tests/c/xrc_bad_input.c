/*
 * XRC and ATOMIC WRITE through the C API on one device: what works, and that bad input gets
 * an errno or an error completion (never a crash or a hang). An XRC initiator and target
 * of the same context talk to each other over loopback.
 * Prints "ok NAME" / "FAIL NAME: why"; exit status = failures.
 */
#include <errno.h>
#include <fcntl.h>
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

static int to_rts(struct ibv_qp *qp, uint32_t dest, int target)
{
	union ibv_gid gid;
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC };

	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return -1;
	if (ibv_query_gid(ctx, 1, 1, &gid))
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.rq_psn = 7;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.dgid = gid;
	/* The kernel's XRC rules: an initiator's RTR needs no responder attributes, a
	 * target's RTS no requester ones. */
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN |
			  (target ? IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER : 0)))
		return -2;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 7;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 4;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
			  (target ? 0 : IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC)))
		return -3;
	return 0;
}

static int wait_wc(struct ibv_cq *cq, struct ibv_wc *wc)
{
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n)
			return n;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 10)
			return 0;
	}
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1) {
		printf("FAIL no device\n");
		return 1;
	}
	ctx = ibv_open_device(list[0]);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_cq *srq_cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);

	/* ibv_open_xrcd */
	struct ibv_xrcd_init_attr xa = { 0 };
	errno = 0;
	CHECK("open_xrcd no mask", !ibv_open_xrcd(ctx, &xa) && errno == EINVAL, "errno %d", errno);
	xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
	xa.fd = -1;
	xa.oflags = 0;
	errno = 0;
	CHECK("open_xrcd fd -1 without O_CREAT", !ibv_open_xrcd(ctx, &xa) && errno == EINVAL,
	      "errno %d", errno);
	xa.fd = 12345;
	xa.oflags = O_CREAT;
	errno = 0;
	CHECK("open_xrcd bad fd", !ibv_open_xrcd(ctx, &xa) && errno == EBADF, "errno %d", errno);
	char path[] = "/tmp/srdma-xrcd-XXXXXX";
	int fd = mkstemp(path);
	xa.fd = fd;
	xa.oflags = 0;
	errno = 0;
	CHECK("open_xrcd new file without O_CREAT", !ibv_open_xrcd(ctx, &xa) && errno == ENOENT,
	      "errno %d", errno);
	xa.oflags = O_CREAT;
	struct ibv_xrcd *xrcd = ibv_open_xrcd(ctx, &xa);
	CHECK("open_xrcd file", xrcd != NULL, "errno %d", errno);
	struct ibv_xrcd *again = ibv_open_xrcd(ctx, &xa);
	CHECK("open_xrcd same file again", again != NULL, "errno %d", errno);
	xa.oflags = O_CREAT | O_EXCL;
	errno = 0;
	CHECK("open_xrcd O_EXCL on an open domain", !ibv_open_xrcd(ctx, &xa) && errno == EEXIST,
	      "errno %d", errno);
	CHECK("close_xrcd second handle", ibv_close_xrcd(again) == 0, "-");

	/* ibv_create_srq_ex */
	struct ibv_srq_init_attr_ex sa = { 0 };
	sa.attr.max_wr = 16;
	sa.attr.max_sge = 1;
	sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD;
	sa.srq_type = IBV_SRQT_XRC;
	sa.pd = pd;
	sa.xrcd = xrcd;
	errno = 0;
	CHECK("xrc srq without cq", !ibv_create_srq_ex(ctx, &sa) && errno == EINVAL, "errno %d", errno);
	sa.comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
	sa.cq = srq_cq;
	sa.xrcd = NULL;
	errno = 0;
	CHECK("xrc srq NULL xrcd", !ibv_create_srq_ex(ctx, &sa) && errno == EINVAL, "errno %d", errno);
	sa.srq_type = IBV_SRQT_TM;
	sa.xrcd = xrcd;
	errno = 0;
	CHECK("tm srq", !ibv_create_srq_ex(ctx, &sa) && errno == EOPNOTSUPP, "errno %d", errno);
	sa.srq_type = IBV_SRQT_XRC;
	struct ibv_srq *srq = ibv_create_srq_ex(ctx, &sa);
	CHECK("xrc srq", srq != NULL, "errno %d", errno);
	uint32_t srqn = 0;
	CHECK("get_srq_num", srq && ibv_get_srq_num(srq, &srqn) == 0 && srqn != 0, "srqn %u", srqn);

	/* XRC QPs */
	struct ibv_qp_init_attr_ex qa = { 0 };
	qa.qp_type = IBV_QPT_XRC_RECV;
	qa.comp_mask = IBV_QP_INIT_ATTR_XRCD;
	errno = 0;
	CHECK("xrc_recv NULL xrcd", !ibv_create_qp_ex(ctx, &qa) && errno == EINVAL, "errno %d", errno);
	qa.xrcd = xrcd;
	struct ibv_qp *tgt = ibv_create_qp_ex(ctx, &qa);
	CHECK("xrc_recv", tgt != NULL && tgt->qp_type == IBV_QPT_XRC_RECV, "errno %d", errno);

	memset(&qa, 0, sizeof(qa));
	qa.qp_type = IBV_QPT_XRC_SEND;
	qa.send_cq = cq;
	qa.cap.max_send_wr = 16;
	qa.cap.max_send_sge = 1;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qa.pd = pd;
	qa.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_ATOMIC_WRITE;
	errno = 0;
	CHECK("xrc_send with atomic write ops", !ibv_create_qp_ex(ctx, &qa) && errno == EOPNOTSUPP,
	      "errno %d", errno);
	qa.send_ops_flags = IBV_QP_EX_WITH_SEND;
	struct ibv_qp *ini = ibv_create_qp_ex(ctx, &qa);
	CHECK("xrc_send", ini != NULL && ini->qp_type == IBV_QPT_XRC_SEND, "errno %d", errno);
	if (!srq || !tgt || !ini) {
		printf("%d failures\n", failures);
		return failures;
	}
	int r1 = to_rts(tgt, ini->qp_num, 1), r2 = to_rts(ini, tgt->qp_num, 0);
	CHECK("xrc qps to rts", r1 == 0 && r2 == 0, "%d %d", r1, r2);

	char *buf = calloc(1, 4096);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE |
				       IBV_ACCESS_REMOTE_WRITE);
	strcpy(buf, "hello xrc");
	struct ibv_sge rsge = { (uintptr_t)(buf + 2048), 1024, mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 9, .sg_list = &rsge, .num_sge = 1 }, *bad_r;
	CHECK("post_srq_recv", ibv_post_srq_recv(srq, &rwr, &bad_r) == 0, "-");
	CHECK("post_recv on xrc_recv", ibv_post_recv(tgt, &rwr, &bad_r) != 0, "-");

	struct ibv_sge sge = { (uintptr_t)buf, 10, mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;
	CHECK("post_send on xrc_recv", ibv_post_send(tgt, &wr, &bad) != 0, "-");
	wr.qp_type.xrc.remote_srqn = srqn;
	CHECK("xrc post_send", ibv_post_send(ini, &wr, &bad) == 0, "-");
	struct ibv_wc wc;
	int got = wait_wc(cq, &wc);
	CHECK("xrc send completes", got == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 1,
	      "got %d status %d", got, wc.status);
	got = wait_wc(srq_cq, &wc);
	CHECK("xrc recv on the srq's cq", got == 1 && wc.status == IBV_WC_SUCCESS &&
	      wc.wr_id == 9 && wc.byte_len == 10 && wc.qp_num == tgt->qp_num &&
	      !strcmp(buf + 2048, "hello xrc"),
	      "got %d status %d id %lu len %u", got, wc.status, (unsigned long)wc.wr_id, wc.byte_len);

	/* The ibv_wr_* API: ATOMIC WRITE has no XRC opcode (refused even when called without
	 * having been asked for); a NULL payload is refused. */
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(ini);
	uint64_t v = 1;
	ibv_wr_start(qx);
	qx->wr_id = 2;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_write(qx, mr->rkey, (uintptr_t)buf, &v);
	ibv_wr_set_xrc_srqn(qx, srqn);
	CHECK("atomic write over xrc refused", ibv_wr_complete(qx) != 0, "-");
	ibv_wr_start(qx);
	ibv_wr_atomic_write(qx, mr->rkey, (uintptr_t)buf, NULL);
	ibv_wr_set_xrc_srqn(qx, srqn);
	CHECK("atomic write NULL data refused", ibv_wr_complete(qx) != 0, "-");

	/* A request naming no SRQ of the target's domain: an error completion, no hang. */
	ibv_wr_start(qx);
	qx->wr_id = 3;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qx);
	ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)buf, 4);
	ibv_wr_set_xrc_srqn(qx, srqn + 1000);
	CHECK("send to a bogus srq posted", ibv_wr_complete(qx) == 0, "-");
	got = wait_wc(cq, &wc);
	CHECK("send to a bogus srq fails", got == 1 && wc.wr_id == 3 &&
	      wc.status == IBV_WC_REM_INV_REQ_ERR, "got %d status %d", got, wc.status);

	CHECK("destroy xrc_send", ibv_destroy_qp(ini) == 0, "-");
	CHECK("destroy xrc_recv", ibv_destroy_qp(tgt) == 0, "-");
	CHECK("destroy xrc srq", ibv_destroy_srq(srq) == 0, "-");
	CHECK("close_xrcd", ibv_close_xrcd(xrcd) == 0, "-");
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_destroy_cq(srq_cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	close(fd);
	unlink(path);
	printf("%d failures\n", failures);
	return failures;
}
