/*
 * The seed scenario of srdma, written as any verbs user would write it against rdma-core's
 * headers: A registers memory and RDMA-WRITEs it (with immediate) into B; B's CQ completes;
 * B processes the data (adds 1 to every byte) and forwards it by SEND to C; C's CQ
 * completes and C checks every byte.
 *
 *   chain c SIZE PORT_C                 C: waits for B on TCP PORT_C
 *   chain b SIZE PORT_B HOST_C PORT_C   B: waits for A on PORT_B, then connects to C
 *   chain a SIZE HOST_B PORT_B          A: connects to B
 *
 * Each link exchanges {QPN, PSN, GID, address, rkey} over TCP, then moves its RC QP through
 * INIT, RTR and RTS. Options: GID index from $CHAIN_GID (default 1, the IPv4-mapped GID on
 * rxe and srdma). Exit 0 only if the data arrived intact; every failure says which call.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define DIE(...) do { fprintf(stderr, "chain %c: ", role); fprintf(stderr, __VA_ARGS__); \
                      fprintf(stderr, "\n"); exit(1); } while (0)
#define IMM 0x5eed

static char role;

struct peer {
	uint32_t qpn, psn;
	uint8_t gid[16];
	uint64_t addr;
	uint32_t rkey;
};

struct link {
	struct ibv_qp *qp;
	struct ibv_cq *cq;
	struct peer local, remote;
};

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static int gid_index = 1;

static int tcp_listen_accept(int port)
{
	int one = 1, s = socket(AF_INET, SOCK_STREAM, 0), c;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };

	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(s, (struct sockaddr *)&a, sizeof(a)) || listen(s, 1))
		DIE("listen on TCP %d: %s", port, strerror(errno));
	c = accept(s, NULL, NULL);
	if (c < 0)
		DIE("accept: %s", strerror(errno));
	close(s);
	return c;
}

static int tcp_connect(const char *host, int port)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *res;
	char p[16];
	int i;

	snprintf(p, sizeof(p), "%d", port);
	if (getaddrinfo(host, p, &hints, &res))
		DIE("cannot resolve %s", host);
	/* The peer may still be starting: retry for up to 20 s. */
	for (i = 0; i < 200; i++) {
		int s = socket(AF_INET, SOCK_STREAM, 0);

		if (!connect(s, res->ai_addr, res->ai_addrlen)) {
			freeaddrinfo(res);
			return s;
		}
		close(s);
		usleep(100000);
	}
	DIE("connect to %s:%d: %s", host, port, strerror(errno));
}

static void exchange(int sock, struct link *l)
{
	if (write(sock, &l->local, sizeof(l->local)) != sizeof(l->local) ||
	    read(sock, &l->remote, sizeof(l->remote)) != sizeof(l->remote))
		DIE("exchange of QP information failed");
}

static void create_link(struct link *l, int depth)
{
	struct ibv_qp_init_attr init = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = depth, .max_recv_wr = depth,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE,
	};
	union ibv_gid gid;

	l->cq = ibv_create_cq(ctx, depth * 2, NULL, NULL, 0);
	if (!l->cq)
		DIE("ibv_create_cq: %s", strerror(errno));
	init.send_cq = init.recv_cq = l->cq;
	l->qp = ibv_create_qp(pd, &init);
	if (!l->qp)
		DIE("ibv_create_qp: %s", strerror(errno));
	if (ibv_modify_qp(l->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  IBV_QP_ACCESS_FLAGS))
		DIE("ibv_modify_qp to INIT");
	if (ibv_query_gid(ctx, 1, gid_index, &gid))
		DIE("ibv_query_gid %d", gid_index);
	l->local.qpn = l->qp->qp_num;
	l->local.psn = lrand48() & 0xffffff;
	memcpy(l->local.gid, gid.raw, 16);
}

static void connect_link(struct link *l)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
		.dest_qp_num = l->remote.qpn, .rq_psn = l->remote.psn,
		.max_dest_rd_atomic = 1, .min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .hop_limit = 64, .sgid_index = gid_index } },
	};

	memcpy(a.ah_attr.grh.dgid.raw, l->remote.gid, 16);
	if (ibv_modify_qp(l->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			  IBV_QP_MIN_RNR_TIMER))
		DIE("ibv_modify_qp to RTR");
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = l->local.psn;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(l->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		DIE("ibv_modify_qp to RTS");
}

static struct ibv_wc wait_wc(struct ibv_cq *cq, const char *what)
{
	struct ibv_wc wc;
	int n;

	do
		n = ibv_poll_cq(cq, 1, &wc);
	while (n == 0);
	if (n < 0)
		DIE("ibv_poll_cq failed waiting for %s", what);
	if (wc.status != IBV_WC_SUCCESS)
		DIE("%s completed with %s", what, ibv_wc_status_str(wc.status));
	return wc;
}

static void post_recv(struct link *l, void *buf, size_t len, struct ibv_mr *mr)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = len, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = buf ? 1 : 0 }, *bad;

	if (ibv_post_recv(l->qp, &wr, &bad))
		DIE("ibv_post_recv");
}

static uint8_t pattern(size_t i)
{
	return (uint8_t)(i * 7 + 3);
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_mr *mr;
	struct link l = { 0 }, down = { 0 };
	struct ibv_sge sge;
	struct ibv_send_wr wr = { 0 }, *bad;
	struct ibv_wc wc;
	uint8_t *buf;
	size_t size, i;
	int s;

	if (argc < 4 || !strchr("abc", argv[1][0]))
		return fprintf(stderr, "usage: see the comment at the top of chain.c\n"), 2;
	role = argv[1][0];
	size = strtoul(argv[2], NULL, 0);
	if (getenv("CHAIN_GID"))
		gid_index = atoi(getenv("CHAIN_GID"));
	srand48(getpid());

	list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		DIE("no RDMA device");
	ctx = ibv_open_device(list[0]);
	if (!ctx)
		DIE("ibv_open_device: %s", strerror(errno));
	pd = ibv_alloc_pd(ctx);
	if (!pd)
		DIE("ibv_alloc_pd: %s", strerror(errno));
	/* The application's own memory: malloc'd, registered where it is. */
	buf = malloc(size);
	if (!buf)
		DIE("malloc");
	mr = ibv_reg_mr(pd, buf, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!mr)
		DIE("ibv_reg_mr: %s", strerror(errno));

	switch (role) {
	case 'a':
		for (i = 0; i < size; i++)
			buf[i] = pattern(i);
		s = tcp_connect(argv[3], atoi(argv[4]));
		create_link(&l, 4);
		exchange(s, &l);
		connect_link(&l);
		sge = (struct ibv_sge){ .addr = (uintptr_t)buf, .length = size, .lkey = mr->lkey };
		wr.wr_id = 7;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.imm_data = htonl(IMM);
		wr.wr.rdma.remote_addr = l.remote.addr;
		wr.wr.rdma.rkey = l.remote.rkey;
		if (ibv_post_send(l.qp, &wr, &bad))
			DIE("ibv_post_send");
		wc = wait_wc(l.cq, "the RDMA WRITE");
		/* Wait until B has its data before tearing down. */
		if (read(s, &i, 1) < 0)
			DIE("waiting for B");
		printf("a: wrote %zu bytes\n", size);
		break;
	case 'b':
		s = tcp_listen_accept(atoi(argv[3]));
		create_link(&l, 4);
		l.local.addr = (uintptr_t)buf;
		l.local.rkey = mr->rkey;
		post_recv(&l, NULL, 0, mr);
		exchange(s, &l);
		connect_link(&l);
		wc = wait_wc(l.cq, "the WRITE's immediate");
		if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || ntohl(wc.imm_data) != IMM ||
		    wc.byte_len != size)
			DIE("unexpected completion: opcode %d imm %#x len %u", wc.opcode,
			    ntohl(wc.imm_data), wc.byte_len);
		(void)!write(s, "k", 1);
		for (i = 0; i < size; i++)
			buf[i] += 1;
		s = tcp_connect(argv[4], atoi(argv[5]));
		create_link(&down, 4);
		exchange(s, &down);
		connect_link(&down);
		sge = (struct ibv_sge){ .addr = (uintptr_t)buf, .length = size, .lkey = mr->lkey };
		wr.wr_id = 8;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_SEND;
		wr.send_flags = IBV_SEND_SIGNALED;
		if (ibv_post_send(down.qp, &wr, &bad))
			DIE("ibv_post_send");
		wait_wc(down.cq, "the SEND");
		if (read(s, &i, 1) < 0)
			DIE("waiting for C");
		printf("b: forwarded %zu bytes\n", size);
		break;
	case 'c':
		s = tcp_listen_accept(atoi(argv[3]));
		create_link(&l, 4);
		memset(buf, 0, size);
		post_recv(&l, buf, size, mr);
		exchange(s, &l);
		connect_link(&l);
		wc = wait_wc(l.cq, "the SEND");
		if (wc.opcode != IBV_WC_RECV || wc.byte_len != size)
			DIE("unexpected completion: opcode %d len %u", wc.opcode, wc.byte_len);
		for (i = 0; i < size; i++)
			if (buf[i] != (uint8_t)(pattern(i) + 1))
				DIE("byte %zu is %u, expected %u", i, buf[i],
				    (uint8_t)(pattern(i) + 1));
		(void)!write(s, "k", 1);
		printf("c: received %zu bytes, all as expected\n", size);
		break;
	}
	ibv_destroy_qp(l.qp);
	if (down.qp)
		ibv_destroy_qp(down.qp);
	ibv_destroy_cq(l.cq);
	if (down.cq)
		ibv_destroy_cq(down.cq);
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	free(buf);
	return 0;
}
