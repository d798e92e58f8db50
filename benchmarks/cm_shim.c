/* LD_PRELOAD timing shim for benchmarks/cm_setup.sh: prints when rdma_connect is called,
 * how long rdma_accept takes, and when each rdma_get_cm_event returns (CLOCK_MONOTONIC), on
 * stderr, so that the time from rdma_connect to the ESTABLISHED event can be read off an
 * unmodified rping, with rdma-core's librdmacm or srdma's.
 * Build: cc -shared -fPIC -o cm_shim.so cm_shim.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <time.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *p)
{
	static int (*f)(struct rdma_cm_id *, struct rdma_conn_param *);
	double t = now();
	int r;

	if (!f)
		f = dlsym(RTLD_NEXT, "rdma_connect");
	r = f(id, p);
	fprintf(stderr, "CMT %.6f connect %d\n", t, r);
	return r;
}

int rdma_get_cm_event(struct rdma_event_channel *ch, struct rdma_cm_event **ev)
{
	static int (*f)(struct rdma_event_channel *, struct rdma_cm_event **);
	int r;

	if (!f)
		f = dlsym(RTLD_NEXT, "rdma_get_cm_event");
	r = f(ch, ev);
	fprintf(stderr, "CMT %.6f event %s\n", now(), r ? "error" : rdma_event_str((*ev)->event));
	return r;
}

int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *p)
{
	static int (*f)(struct rdma_cm_id *, struct rdma_conn_param *);
	double t = now();
	int r;

	if (!f)
		f = dlsym(RTLD_NEXT, "rdma_accept");
	r = f(id, p);
	fprintf(stderr, "CMT %.6f accept %d (returned after %.3f ms)\n", t, r, (now() - t) * 1e3);
	return r;
}
