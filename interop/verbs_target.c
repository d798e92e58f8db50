/*
 * verbs_target: a kernel-rxe process whose memory srdma reaches by RDMA WRITE and READ.
 *
 * Runs on a lab guest (libibverbs + rdma_rxe). Registers a 64 KiB buffer (REMOTE_WRITE |
 * REMOTE_READ), its second half filled with a known pattern, and an RC QP. Over TCP (port
 * 18520) it reads the peer's "QPN PSN GID\n" (hex, GID as 32 hex digits), answers
 * "QPN PSN GID ADDR RKEY\n", connects the QP, then waits for "done LEN\n" and checks that the
 * first LEN bytes hold the peer's pattern ((i * 7 + 3) & 0xff). Exit 0 only if they do.
 *
 * Build: gcc -O2 -o verbs_target verbs_target.c -libverbs
 */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define BUF 65536
#define GID_INDEX 1

static void die(const char *what) { perror(what); exit(2); }

static int hexbyte(const char *s) { unsigned v; sscanf(s, "%2x", &v); return (int)v; }

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0]) die("no RDMA device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx) die("ibv_open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	unsigned char *buf = aligned_alloc(4096, BUF);
	if (!pd || !buf) die("pd/buffer");
	memset(buf, 0, BUF);
	for (int i = BUF / 2; i < BUF; i++) buf[i] = (unsigned char)((i * 13 + 1) & 0xff);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!mr || !cq) die("mr/cq");
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp) die("ibv_create_qp");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) die("INIT");
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, GID_INDEX, &gid)) die("ibv_query_gid");
	unsigned psn = (unsigned)getpid() & 0xffffff;

	int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(18520), .sin_addr.s_addr = INADDR_ANY };
	if (bind(ls, (void *)&sa, sizeof sa) || listen(ls, 1)) die("listen");
	printf("verbs_target: listening on 18520, QPN 0x%06x\n", qp->qp_num);
	fflush(stdout);
	int s = accept(ls, NULL, NULL);
	if (s < 0) die("accept");
	FILE *in = fdopen(s, "r");
	unsigned rqpn, rpsn;
	char rgid[64];
	if (fscanf(in, "%x %x %32s", &rqpn, &rpsn, rgid) != 3) die("peer message");
	char line[256], g[33];
	for (int i = 0; i < 16; i++) sprintf(g + 2 * i, "%02x", gid.raw[i]);
	int n = snprintf(line, sizeof line, "%x %x %s %llx %x\n", qp->qp_num, psn, g,
			 (unsigned long long)(uintptr_t)buf, mr->rkey);
	if (write(s, line, n) != n) die("write");

	struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = rqpn,
		.rq_psn = rpsn, .max_dest_rd_atomic = 1, .min_rnr_timer = 12 };
	r.ah_attr.is_global = 1;
	r.ah_attr.port_num = 1;
	r.ah_attr.grh.hop_limit = 64;
	r.ah_attr.grh.sgid_index = GID_INDEX;
	for (int i = 0; i < 16; i++) r.ah_attr.grh.dgid.raw[i] = (uint8_t)hexbyte(rgid + 2 * i);
	if (ibv_modify_qp(qp, &r, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) die("RTR");
	struct ibv_qp_attr t = { .qp_state = IBV_QPS_RTS, .sq_psn = psn, .timeout = 14, .retry_cnt = 7,
		.rnr_retry = 7, .max_rd_atomic = 1 };
	if (ibv_modify_qp(qp, &t, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC)) die("RTS");

	unsigned len;
	if (fscanf(in, " done %u", &len) != 1 || len > BUF / 2) die("done message");
	int bad = 0;
	for (unsigned i = 0; i < len; i++)
		if (buf[i] != (unsigned char)((i * 7 + 3) & 0xff)) bad++;
	printf("verbs_target: %u bytes written by the peer, %d wrong\n", len, bad);
	return bad ? 1 : 0;
}
