/* pthread_cancel of a thread blocked in rdma_get_cm_event, ibv_get_cq_event or
 * ibv_get_async_event: as with rdma-core, whose waits are read(2)s of kernel files and so
 * cancellation points, the thread ends (pthread_join gives PTHREAD_CANCELED) and the process
 * goes on. libiscsi's iSER transport cancels its CM thread so on every disconnect.
 *
 * Usage: cancel_wait   (the first device)
 * Prints "cancel_wait: ok" and exits 0 on success. */
#include <infiniband/verbs.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define FAIL(...) do { fprintf(stderr, "cancel_wait: " __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)

static struct rdma_event_channel *cm_ch;
static struct ibv_comp_channel *comp_ch;
static struct ibv_context *ctx;

static void *cm_waiter(void *a)
{
	struct rdma_cm_event *ev;

	(void)a;
	rdma_get_cm_event(cm_ch, &ev);
	FAIL("rdma_get_cm_event returned");
}

static void *cq_waiter(void *a)
{
	struct ibv_cq *cq;
	void *c;

	(void)a;
	ibv_get_cq_event(comp_ch, &cq, &c);
	FAIL("ibv_get_cq_event returned");
}

static void *async_waiter(void *a)
{
	struct ibv_async_event ev;

	(void)a;
	/* Take what the device reported at open, then wait for more. */
	for (;;) {
		if (ibv_get_async_event(ctx, &ev))
			FAIL("ibv_get_async_event: %m");
		ibv_ack_async_event(&ev);
	}
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void cancel(const char *what, void *(*f)(void *))
{
	pthread_t t;
	void *res;
	double t0;

	if (pthread_create(&t, NULL, f, NULL))
		FAIL("pthread_create");
	usleep(300000);
	t0 = now();
	if (pthread_cancel(t))
		FAIL("pthread_cancel");
	if (pthread_join(t, &res))
		FAIL("pthread_join");
	if (res != PTHREAD_CANCELED)
		FAIL("%s: the thread was not cancelled", what);
	printf("cancel_wait: %s cancelled in %.0f ms\n", what, (now() - t0) * 1000);
}

int main(void)
{
	struct ibv_device **list;
	struct ibv_cq *cq;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!(cm_ch = rdma_create_event_channel()))
		FAIL("rdma_create_event_channel: %m");
	if (!(list = ibv_get_device_list(NULL)) || !list[0])
		FAIL("no device");
	if (!(ctx = ibv_open_device(list[0])))
		FAIL("ibv_open_device: %m");
	if (!(comp_ch = ibv_create_comp_channel(ctx)))
		FAIL("ibv_create_comp_channel: %m");
	if (!(cq = ibv_create_cq(ctx, 16, NULL, comp_ch, 0)) || ibv_req_notify_cq(cq, 0))
		FAIL("ibv_create_cq: %m");
	cancel("rdma_get_cm_event", cm_waiter);
	cancel("ibv_get_cq_event", cq_waiter);
	cancel("ibv_get_async_event", async_waiter);
	/* Everything still works after the cancellations. */
	ibv_destroy_cq(cq);
	ibv_destroy_comp_channel(comp_ch);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	rdma_destroy_event_channel(cm_ch);
	printf("cancel_wait: ok\n");
	return 0;
}
