/*
 * The extended verbs a modern program (UCX, libfabric, rdma-core's -N/-t examples) uses:
 * ibv_create_cq_ex with the ibv_start_poll/ibv_next_poll/ibv_wc_read_* API, and
 * ibv_create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS and the ibv_wr_* API. Two RC QPs of
 * one device talk to each other. Prints "ok NAME" / "FAIL NAME: why"; exit status = failures.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static int failures;

#define CHECK(name, cond, ...) do { \
	if (cond) printf("ok %s\n", name); \
	else { failures++; printf("FAIL %s: ", name); printf(__VA_ARGS__); printf("\n"); } \
} while (0)

static struct ibv_context *ctx;

static int connect_to(struct ibv_qp *qp, struct ibv_qp *peer)
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
	a.dest_qp_num = peer->qp_num;
	a.rq_psn = 7;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.dgid = gid;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -1;
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 7;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 4;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* Polls cq with the extended API until `want` completions arrived (10 s at most). */
static int poll_ex(struct ibv_cq_ex *cq, int want, uint64_t *ids, enum ibv_wc_opcode *ops,
		   uint32_t *lens, uint32_t *imms, unsigned *flags)
{
	struct ibv_poll_cq_attr attr = {};
	time_t end = time(NULL) + 10;
	int n = 0, rc;

	while (n < want && time(NULL) < end) {
		rc = ibv_start_poll(cq, &attr);
		if (rc == ENOENT)
			continue;
		if (rc)
			return -rc;
		do {
			if (cq->status != IBV_WC_SUCCESS) {
				printf("  completion %llu: %s\n", (unsigned long long)cq->wr_id,
				       ibv_wc_status_str(cq->status));
				ibv_end_poll(cq);
				return -1;
			}
			ids[n] = cq->wr_id;
			ops[n] = ibv_wc_read_opcode(cq);
			lens[n] = ibv_wc_read_byte_len(cq);
			flags[n] = ibv_wc_read_wc_flags(cq);
			imms[n] = (flags[n] & IBV_WC_WITH_IMM) ? ntohl(ibv_wc_read_imm_data(cq)) : 0;
			n++;
		} while (n < want && ibv_next_poll(cq) == 0);
		ibv_end_poll(cq);
	}
	return n;
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	static char src[4096], dst[4096], rbuf[4096];
	static uint64_t counter = 40, fetched;
	struct ibv_pd *pd;
	struct ibv_mr *smr, *dmr, *rmr, *cmr, *fmr;
	struct ibv_cq_init_attr_ex cqa = { .cqe = 64, .wc_flags = IBV_WC_STANDARD_FLAGS };
	struct ibv_cq_ex *cq;
	struct ibv_qp_init_attr_ex qa = {
		.qp_type = IBV_QPT_RC, .cap = { .max_send_wr = 16, .max_recv_wr = 16,
						.max_send_sge = 1, .max_recv_sge = 1,
						.max_inline_data = 64 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND_WITH_IMM |
				  IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_RDMA_READ,
	};
	struct ibv_qp *a, *b, *legacy;
	struct ibv_qp_ex *x;
	struct ibv_qp_init_attr li;
	struct ibv_sge sge;
	struct ibv_recv_wr rwr = { .wr_id = 100, .sg_list = &sge, .num_sge = 1 }, *rbad;
	uint64_t ids[8];
	enum ibv_wc_opcode ops[8];
	uint32_t lens[8], imms[8];
	unsigned flags[8];
	int i, n;

	if (!list || !list[0] || !(ctx = ibv_open_device(list[0])) || !(pd = ibv_alloc_pd(ctx)))
		return printf("FAIL setup\n"), 1;
	for (i = 0; i < (int)sizeof(src); i++)
		src[i] = (char)(i * 3 + 1);
	smr = ibv_reg_mr(pd, src, sizeof(src), IBV_ACCESS_LOCAL_WRITE);
	dmr = ibv_reg_mr(pd, dst, sizeof(dst), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			 IBV_ACCESS_REMOTE_READ);
	rmr = ibv_reg_mr(pd, rbuf, sizeof(rbuf), IBV_ACCESS_LOCAL_WRITE);
	cmr = ibv_reg_mr(pd, &counter, 8, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
	fmr = ibv_reg_mr(pd, &fetched, 8, IBV_ACCESS_LOCAL_WRITE);

	cqa.wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
	errno = 0;
	CHECK("cq-ex-timestamps-unsupported", ibv_create_cq_ex(ctx, &cqa) == NULL &&
	      errno == EOPNOTSUPP, "errno %d", errno);
	cqa.wc_flags = IBV_WC_STANDARD_FLAGS;
	cq = ibv_create_cq_ex(ctx, &cqa);
	CHECK("create-cq-ex", cq != NULL, "errno %d", errno);
	if (!cq)
		return failures;
	qa.pd = pd;
	qa.send_cq = qa.recv_cq = ibv_cq_ex_to_cq(cq);
	a = ibv_create_qp_ex(ctx, &qa);
	b = ibv_create_qp_ex(ctx, &qa);
	CHECK("create-qp-ex", a && b, "errno %d", errno);
	if (!a || !b)
		return failures;
	li = (struct ibv_qp_init_attr){ .send_cq = qa.send_cq, .recv_cq = qa.send_cq,
					.qp_type = IBV_QPT_RC, .cap = { 1, 1, 1, 1, 0 } };
	legacy = ibv_create_qp(pd, &li);
	CHECK("legacy-qp-has-no-qp-ex", legacy && ibv_qp_to_qp_ex(legacy) == NULL, "got one");
	CHECK("connect", !connect_to(a, b) && !connect_to(b, a), "errno %d", errno);

	sge = (struct ibv_sge){ .addr = (uintptr_t)rbuf, .length = sizeof(rbuf), .lkey = rmr->lkey };
	CHECK("post-recv", !ibv_post_recv(b, &rwr, &rbad), "failed");
	x = ibv_qp_to_qp_ex(a);
	CHECK("qp-to-qp-ex", x != NULL, "NULL");
	ibv_wr_start(x);
	x->wr_id = 1;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(x, dmr->rkey, (uintptr_t)dst);
	ibv_wr_set_sge(x, smr->lkey, (uintptr_t)src, sizeof(src));
	x->wr_id = 2;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(x, htonl(0xabcd));
	ibv_wr_set_inline_data(x, "inline hello", 12);
	x->wr_id = 3;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_fetch_add(x, cmr->rkey, (uintptr_t)&counter, 2);
	ibv_wr_set_sge(x, fmr->lkey, (uintptr_t)&fetched, 8);
	CHECK("wr-complete", ibv_wr_complete(x) == 0, "failed");

	n = poll_ex(cq, 4, ids, ops, lens, imms, flags);
	CHECK("four-completions", n == 4, "got %d", n);
	for (i = 0; i < n; i++) {
		if (ids[i] == 100)
			CHECK("recv-with-imm", ops[i] == IBV_WC_RECV && lens[i] == 12 &&
			      imms[i] == 0xabcd && (flags[i] & IBV_WC_WITH_IMM),
			      "op %d len %u imm %#x", ops[i], lens[i], imms[i]);
		else if (ids[i] == 1)
			CHECK("write-completion", ops[i] == IBV_WC_RDMA_WRITE, "op %d", ops[i]);
		else if (ids[i] == 3)
			CHECK("faa-completion", ops[i] == IBV_WC_FETCH_ADD, "op %d", ops[i]);
	}
	CHECK("write-data", !memcmp(src, dst, sizeof(src)), "differs");
	CHECK("send-data", !memcmp(rbuf, "inline hello", 12), "differs");
	CHECK("faa-data", fetched == 40 && counter == 42, "fetched %llu counter %llu",
	      (unsigned long long)fetched, (unsigned long long)counter);

	/* Memory from mmap and from the stack, registered where it is and written remotely. */
	{
		char stackbuf[512];
		char *map = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
				 -1, 0);
		struct ibv_mr *smr2 = ibv_reg_mr(pd, stackbuf, sizeof(stackbuf),
						 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		struct ibv_mr *mmr = map == MAP_FAILED ? NULL :
			ibv_reg_mr(pd, map, 1 << 16, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);

		memset(stackbuf, 0, sizeof(stackbuf));
		CHECK("reg-stack-and-mmap", smr2 && mmr && mmr->addr == map, "errno %d", errno);
		ibv_wr_start(x);
		x->wr_id = 20;
		x->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_rdma_write(x, smr2->rkey, (uintptr_t)stackbuf);
		ibv_wr_set_sge(x, smr->lkey, (uintptr_t)src, sizeof(stackbuf));
		x->wr_id = 21;
		ibv_wr_rdma_write(x, mmr->rkey, (uintptr_t)map + 1000);
		ibv_wr_set_sge(x, smr->lkey, (uintptr_t)src, sizeof(src));
		CHECK("wr-complete-2", ibv_wr_complete(x) == 0, "failed");
		n = poll_ex(cq, 2, ids, ops, lens, imms, flags);
		CHECK("two-writes", n == 2, "got %d", n);
		CHECK("stack-data", !memcmp(stackbuf, src, sizeof(stackbuf)), "differs");
		CHECK("mmap-data", !memcmp(map + 1000, src, sizeof(src)) && map[999] == 0 &&
		      map[1000 + sizeof(src)] == 0, "differs");
		/* Writing past the region is refused by the responder: a remote access error. */
		ibv_wr_start(x);
		x->wr_id = 22;
		ibv_wr_rdma_write(x, smr2->rkey, (uintptr_t)stackbuf + 500);
		ibv_wr_set_sge(x, smr->lkey, (uintptr_t)src, 64);
		ibv_wr_complete(x);
		{
			struct ibv_poll_cq_attr attr = {};
			time_t end = time(NULL) + 10;
			int rc;

			while ((rc = ibv_start_poll(cq, &attr)) == ENOENT && time(NULL) < end)
				;
			CHECK("write-past-region", rc == 0 && cq->wr_id == 22 &&
			      cq->status == IBV_WC_REM_ACCESS_ERR, "rc %d status %s", rc,
			      ibv_wc_status_str(cq->status));
			if (rc == 0)
				ibv_end_poll(cq);
		}
		ibv_dereg_mr(smr2);
		ibv_dereg_mr(mmr);
		munmap(map, 1 << 16);
	}

	/* ibv_wr_abort drops what was started (a fresh pair: the first went to ERR above). */
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	a = ibv_create_qp_ex(ctx, &qa);
	b = ibv_create_qp_ex(ctx, &qa);
	CHECK("reconnect", a && b && !connect_to(a, b) && !connect_to(b, a), "failed");
	x = ibv_qp_to_qp_ex(a);
	ibv_wr_start(x);
	x->wr_id = 9;
	ibv_wr_rdma_read(x, dmr->rkey, (uintptr_t)dst);
	ibv_wr_set_sge(x, smr->lkey, (uintptr_t)src, 8);
	ibv_wr_abort(x);
	{
		struct ibv_poll_cq_attr attr = {};

		CHECK("abort-posts-nothing", ibv_start_poll(cq, &attr) == ENOENT, "a completion");
	}
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_destroy_qp(legacy);
	CHECK("destroy-cq-ex", ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0, "failed");
	printf("%d failures\n", failures);
	return failures;
}
