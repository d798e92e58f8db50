/*
 * The socket calls servers and clients make, one after another, each printing what the
 * program saw: return values, errno names, descriptor numbers (as "the lowest free one" or
 * not), readiness bits. Run once on the kernel and once under `srdma exec --rsockets`:
 * the two outputs must be the same, line for line (tests/programs.rs).
 *
 *   sockets server PORT READY   listens on 127.0.0.1:PORT, creates file READY when it
 *                               waits for the connection
 *   sockets client PORT READY   connects to it once READY exists (PORT + 1 has nobody
 *                               listening)
 *
 * The first connection waits for READY (the server's first waits must find nothing);
 * from then on the two sides keep in step through the connection itself, so nothing
 * depends on timing.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *side;
/* The file the server creates when it waits for the client's connection. */
static const char *ready;

static void say(const char *fmt, ...)
{
	va_list ap;
	printf("%s: ", side);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}

/* "ok" or the errno's name. */
static const char *res(long r)
{
	if (r >= 0)
		return "ok";
	const char *n = strerrorname_np(errno);
	return n ? n : "E?";
}

static void die(const char *what)
{
	say("FATAL %s: %s", what, strerrorname_np(errno));
	exit(1);
}

/* The lowest free descriptor number now (what the kernel gives the next one). */
static int lowest_free(void)
{
	int fd = open("/dev/null", O_RDONLY);
	close(fd);
	return fd;
}

static struct sockaddr_in addr_of(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
	return a;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* Reads exactly n bytes (blocking socket). */
static void read_all(int fd, char *buf, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = read(fd, buf + got, n - got);
		if (r <= 0)
			die("read_all");
		got += r;
	}
}

static void write_all(int fd, const char *buf, size_t n)
{
	size_t done = 0;
	while (done < n) {
		ssize_t r = write(fd, buf + done, n - done);
		if (r < 0 && errno == EAGAIN) {
			struct pollfd p = { .fd = fd, .events = POLLOUT };
			poll(&p, 1, 1000);
			continue;
		}
		if (r <= 0)
			die("write_all");
		done += r;
	}
}

static void set_block(int fd, int on)
{
	int fl = fcntl(fd, F_GETFL);
	fcntl(fd, F_SETFL, on ? fl & ~O_NONBLOCK : fl | O_NONBLOCK);
}

static unsigned sum(const char *b, size_t n)
{
	unsigned s = 0;
	for (size_t i = 0; i < n; i++)
		s = s * 31 + (unsigned char)b[i];
	return s;
}

#define BULK (1 << 20)

/* The distinct data values of epoll events, ascending, as "a b c" (or "-"). */
static const char *seen_str(const int *seen, int n)
{
	static char out[64];
	int at = 0;
	out[0] = 0;
	for (int v = 0; v < n; v++)
		if (seen[v])
			at += snprintf(out + at, sizeof out - at, "%s%d", at ? " " : "", v);
	return at ? out : "-";
}

/* Calls epoll_wait (at most `max` events each, waiting up to 2 s) until the data values in
 * `want` (a mask over 0..MANY) have all been reported or 10 s went by (ready members
 * reported again and again while the last one is still on its way); marks in `seen` every
 * value reported. */
#define MANY 6
static void epoll_until(int ep, int max, unsigned want, int *seen)
{
	struct epoll_event evs[8];
	unsigned got = 0;
	for (double t0 = now(); (got & want) != want && now() - t0 < 10;) {
		int n = epoll_wait(ep, evs, max, 2000);
		for (int j = 0; j < n; j++) {
			seen[evs[j].data.u64] = 1;
			got |= 1u << evs[j].data.u64;
		}
	}
}

/* Several connections in one epoll set (an epoll server's life): only the ready ones are
 * reported; level-triggered ones again until drained, edge-triggered ones once per
 * arrival, one-shot ones once until EPOLL_CTL_MOD; with room for one event per call, the
 * ready ones take turns. The client sends on the connections the server names, in step
 * with it through the last connection. */
static void epoll_many_server(int l)
{
	int cs[MANY], ep = epoll_create1(0);
	char b[4];
	for (int i = 0; i < MANY; i++) {
		cs[i] = accept(l, NULL, NULL);
		if (cs[i] < 0)
			die("accept many");
		struct epoll_event ev = { .events = EPOLLIN, .data.u64 = i };
		if (i == 0)
			ev.events |= EPOLLET;
		if (i == 1)
			ev.events |= EPOLLONESHOT;
		if (i == MANY - 1)
			ev.events = 0;
		if (epoll_ctl(ep, EPOLL_CTL_ADD, cs[i], &ev) != 0)
			die("epoll add many");
	}
	struct epoll_event evs[8];
	say("many: idle n=%d", epoll_wait(ep, evs, 8, 0));
	write_all(cs[MANY - 1], "g", 1);
	int seen[MANY] = { 0 };
	epoll_until(ep, 8, 1 << 0 | 1 << 1 | 1 << 3, seen);
	say("many: first %s", seen_str(seen, MANY));
	memset(seen, 0, sizeof seen);
	int n = epoll_wait(ep, evs, 8, 0);
	for (int j = 0; j < n; j++)
		seen[evs[j].data.u64] = 1;
	say("many: again %s", seen_str(seen, MANY));
	struct epoll_event re = { .events = EPOLLIN | EPOLLONESHOT, .data.u64 = 1 };
	say("many: rearm %s", res(epoll_ctl(ep, EPOLL_CTL_MOD, cs[1], &re)));
	memset(seen, 0, sizeof seen);
	n = epoll_wait(ep, evs, 8, 0);
	for (int j = 0; j < n; j++)
		seen[evs[j].data.u64] = 1;
	say("many: after rearm %s", seen_str(seen, MANY));
	for (int i = 0; i < 4; i++)
		if (i != 2)
			read_all(cs[i], b, 1);
	say("many: drained n=%d", epoll_wait(ep, evs, 8, 0));
	write_all(cs[MANY - 1], "h", 1);
	memset(seen, 0, sizeof seen);
	epoll_until(ep, 1, 1 << 0 | 1 << 2 | 1 << 4, seen);
	say("many: one at a time %s", seen_str(seen, MANY));
	memset(seen, 0, sizeof seen);
	for (int i = 0; i < 2; i++)
		if (epoll_wait(ep, evs, 1, 0) == 1)
			seen[evs[0].data.u64] = 1;
	say("many: in turn %s", seen_str(seen, MANY));
	say("many: del %s", res(epoll_ctl(ep, EPOLL_CTL_DEL, cs[2], NULL)));
	n = epoll_wait(ep, evs, 8, 0);
	memset(seen, 0, sizeof seen);
	for (int j = 0; j < n; j++)
		seen[evs[j].data.u64] = 1;
	say("many: after del %s", seen_str(seen, MANY));
	say("many: mod deleted %s", res(epoll_ctl(ep, EPOLL_CTL_MOD, cs[2], &re)));
	say("many: del deleted %s", res(epoll_ctl(ep, EPOLL_CTL_DEL, cs[2], NULL)));
	struct epoll_event back = { .events = EPOLLIN, .data.u64 = 2 };
	say("many: add back %s", res(epoll_ctl(ep, EPOLL_CTL_ADD, cs[2], &back)));
	say("many: add twice %s", res(epoll_ctl(ep, EPOLL_CTL_ADD, cs[2], &back)));
	n = epoll_wait(ep, evs, 8, 0);
	memset(seen, 0, sizeof seen);
	for (int j = 0; j < n; j++)
		seen[evs[j].data.u64] = 1;
	say("many: after add back %s", seen_str(seen, MANY));
	/* The set under another name outlives its first; once both are closed, EBADF. */
	int ep2 = dup(ep);
	close(ep);
	say("many: mod through dup %s", res(epoll_ctl(ep2, EPOLL_CTL_MOD, cs[2], &back)));
	close(ep2);
	say("many: add to closed %s", res(epoll_ctl(ep2, EPOLL_CTL_ADD, cs[0], &back)));
	for (int i = 0; i < MANY; i++)
		close(cs[i]);
}

static void epoll_many_client(struct sockaddr_in *a)
{
	int s[MANY];
	char b[4];
	for (int i = 0; i < MANY; i++) {
		s[i] = socket(AF_INET, SOCK_STREAM, 0);
		if (connect(s[i], (struct sockaddr *)a, sizeof *a) != 0)
			die("connect many");
	}
	read_all(s[MANY - 1], b, 1);
	write_all(s[0], "x", 1);
	write_all(s[1], "x", 1);
	write_all(s[3], "x", 1);
	read_all(s[MANY - 1], b, 1);
	write_all(s[2], "y", 1);
	write_all(s[4], "y", 1);
	write_all(s[0], "y", 1);
	say("many: eof %zd", read(s[MANY - 1], b, 1));
	for (int i = 0; i < MANY; i++)
		close(s[i]);
}

/* A server that closes its listening socket and listens again on the same port before
 * each client (iperf3's server does so around each test): every client connects to the
 * new listener and is served. The client connects as soon as the server says it listens
 * again, through a connection kept for that. */
#define RELISTEN 6
static int relisten_server(int l, int port)
{
	struct sockaddr_in a = addr_of(port);
	int one = 1, ok = 0;
	char b[4];
	int ctrl = accept(l, NULL, NULL);
	if (ctrl < 0)
		die("accept ctrl");
	for (int i = 0; i < RELISTEN; i++) {
		close(l);
		l = socket(AF_INET, SOCK_STREAM, 0);
		setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 16) != 0)
			die("listen again");
		write_all(ctrl, "g", 1);
		int c = accept(l, NULL, NULL);
		if (c < 0)
			die("accept again");
		read_all(c, b, 1);
		write_all(c, "k", 1);
		ok += b[0] == 'x';
		close(c);
	}
	say("relisten: served %d", ok);
	close(ctrl);
	return l;
}

static void relisten_client(struct sockaddr_in *a)
{
	char b[4];
	int ok = 0;
	int ctrl = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(ctrl, (struct sockaddr *)a, sizeof *a) != 0)
		die("connect ctrl");
	for (int i = 0; i < RELISTEN; i++) {
		read_all(ctrl, b, 1);
		int s = socket(AF_INET, SOCK_STREAM, 0);
		int r = connect(s, (struct sockaddr *)a, sizeof *a);
		if (r == 0 && write(s, "x", 1) == 1 && read(s, b, 1) == 1 && b[0] == 'k')
			ok++;
		close(s);
	}
	say("relisten: served %d", ok);
	close(ctrl);
}

static int server(int port)
{
	char buf[BULK];
	signal(SIGPIPE, SIG_IGN);
	int expect = lowest_free();
	int l = socket(AF_INET, SOCK_STREAM, 0);
	say("socket lowest=%d", l == expect);
	int one = 1;
	say("SO_REUSEADDR %s", res(setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one)));
	struct sockaddr_in a = addr_of(port);
	say("bind %s", res(bind(l, (struct sockaddr *)&a, sizeof a)));
	say("bind again %s", res(bind(l, (struct sockaddr *)&a, sizeof a)));
	say("listen %s", res(listen(l, 16)));
	struct sockaddr_in got;
	socklen_t len = sizeof got;
	long rr = getsockname(l, (struct sockaddr *)&got, &len);
	say("getsockname %s port=%d", res(rr), ntohs(got.sin_port) == port);
	int v = 0;
	len = sizeof v;
	getsockopt(l, SOL_SOCKET, SO_ACCEPTCONN, &v, &len);
	say("SO_ACCEPTCONN %d", v);
	say("getpeername of listener %s", res(getpeername(l, (struct sockaddr *)&got, &len)));

	int ep = epoll_create1(EPOLL_CLOEXEC);
	int pp[2];
	if (pipe(pp))
		die("pipe");
	struct epoll_event ev = { .events = EPOLLIN, .data.u64 = 1 };
	say("epoll add listener %s", res(epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev)));
	say("epoll add listener again %s", res(epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev)));
	ev.data.u64 = 2;
	say("epoll add pipe %s", res(epoll_ctl(ep, EPOLL_CTL_ADD, pp[0], &ev)));
	say("epoll mod unknown %s", res(epoll_ctl(ep, EPOLL_CTL_MOD, pp[1], &ev)));
	set_block(l, 0);
	say("accept none waiting %s", res(accept(l, NULL, NULL)));
	struct epoll_event evs[8];
	say("epoll_wait nothing %d", epoll_wait(ep, evs, 8, 50));
	if (write(pp[1], "x", 1) != 1)
		die("write pipe");
	int n = epoll_wait(ep, evs, 8, 1000);
	say("epoll_wait pipe n=%d data=%llu events=%x", n, (unsigned long long)evs[0].data.u64,
	    evs[0].events);
	read(pp[0], buf, 10);

	/* The client connects now. */
	int rf = open(ready, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
	if (rf < 0)
		die("creating the ready file");
	close(rf);
	n = epoll_wait(ep, evs, 8, 20000);
	say("epoll_wait listener n=%d data=%llu in=%d", n, (unsigned long long)evs[0].data.u64,
	    !!(evs[0].events & EPOLLIN));
	expect = lowest_free();
	len = sizeof got;
	int c = accept4(l, (struct sockaddr *)&got, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
	say("accept4 %s lowest=%d len=%d family=%d", res(c), c == expect, len, got.sin_family);
	char ip[64];
	inet_ntop(AF_INET, &got.sin_addr, ip, sizeof ip);
	say("peer %s", ip);
	say("epoll del listener %s", res(epoll_ctl(ep, EPOLL_CTL_DEL, l, NULL)));
	say("O_NONBLOCK %d FD_CLOEXEC %d", !!(fcntl(c, F_GETFL) & O_NONBLOCK),
	    !!(fcntl(c, F_GETFD) & FD_CLOEXEC));
	len = sizeof got;
	rr = getsockname(c, (struct sockaddr *)&got, &len);
	say("getsockname %s port=%d", res(rr), ntohs(got.sin_port) == port);
	say("read nothing yet %s", res(read(c, buf, 10)));
	ev.events = EPOLLIN | EPOLLRDHUP;
	ev.data.u64 = 3;
	say("epoll add conn %s", res(epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev)));
	write_all(c, "go1", 3);
	n = epoll_wait(ep, evs, 8, 20000);
	say("epoll_wait conn n=%d data=%llu events=%x", n, (unsigned long long)evs[0].data.u64,
	    evs[0].events);
	int avail = -1;
	ioctl(c, FIONREAD, &avail);
	say("FIONREAD %d", avail);
	ssize_t r = recv(c, buf, 2, MSG_PEEK);
	say("peek %zd %.2s", r, buf);
	r = read(c, buf, 100);
	say("read %zd %.*s", r, (int)r, buf);
	struct iovec iov[3] = { { "abc", 3 }, { "defgh", 5 }, { "ijk", 3 } };
	say("writev %zd", writev(c, iov, 3));

	/* poll over the connection and the pipe: only the pipe is readable. */
	if (write(pp[1], "y", 1) != 1)
		die("write pipe");
	struct pollfd pf[2] = { { .fd = c, .events = POLLIN }, { .fd = pp[0], .events = POLLIN } };
	n = poll(pf, 2, 1000);
	say("poll n=%d conn=%x pipe=%x", n, pf[0].revents, pf[1].revents);
	read(pp[0], buf, 10);
	/* select: writable, not readable. */
	fd_set rd, wr;
	FD_ZERO(&rd);
	FD_ZERO(&wr);
	FD_SET(c, &rd);
	FD_SET(c, &wr);
	struct timeval tv = { 1, 0 };
	n = select(c + 1, &rd, &wr, NULL, &tv);
	say("select n=%d rd=%d wr=%d", n, FD_ISSET(c, &rd), FD_ISSET(c, &wr));

	/* dup, dup2, close of the original: the socket lives on under the new numbers. */
	expect = lowest_free();
	int d = dup(c);
	say("dup %s lowest=%d", res(d), d == expect);
	say("close original %s", res(close(c)));
	say("epoll del closed %s", res(epoll_ctl(ep, EPOLL_CTL_DEL, c, &ev)));
	say("dup2 %d", dup2(d, 50));
	close(d);
	c = 50;
	ev.data.u64 = 4;
	say("epoll add dup2 %s", res(epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev)));
	write_all(c, "dup", 3);

	/* Blocking with a receive timeout. */
	set_block(c, 1);
	struct timeval rt = { 0, 100000 };
	say("SO_RCVTIMEO %s", res(setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &rt, sizeof rt)));
	double t0 = now();
	r = recv(c, buf, 10, 0);
	say("recv with timeout %s waited=%d", res(r), now() - t0 > 0.09);
	rt.tv_usec = 0;
	setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &rt, sizeof rt);

	/* A megabyte, read whole. */
	write_all(c, "go2", 3);
	r = recv(c, buf, BULK, MSG_WAITALL);
	say("bulk %zd sum=%u", r, sum(buf, r > 0 ? r : 0));
	write_all(c, buf, BULK);

	/* Many small writes the server does not read yet: a byte buffer takes them all. */
	usleep(200000);
	r = recv(c, buf, 5000 * 20, MSG_WAITALL);
	say("small writes read %zd sum=%u", r, sum(buf, r > 0 ? r : 0));

	/* fork: the child closes the listener and the connection and exits; the parent goes on. */
	pid_t pid = fork();
	if (pid == 0) {
		close(l);
		close(c);
		_exit(0);
	}
	int st;
	waitpid(pid, &st, 0);
	say("child exit %d", WEXITSTATUS(st));
	write_all(c, "go3", 3);

	/* Shut writing down: the client reads the end of the stream, then closes. */
	say("shutdown %s", res(shutdown(c, SHUT_WR)));
	n = epoll_wait(ep, evs, 8, 20000);
	say("epoll_wait eof n=%d events=%x", n, evs[0].events);
	r = read(c, buf, 10);
	say("read eof %zd", r);
	struct pollfd pc = { .fd = c, .events = POLLIN | POLLOUT | POLLRDHUP };
	poll(&pc, 1, 1000);
	say("poll after eof %x", pc.revents);
	close(c);

	/* A second connection, accepted blocking, gets a file by sendfile. */
	set_block(l, 1);
	expect = lowest_free();
	c = accept(l, NULL, NULL);
	say("accept blocking %s lowest=%d", res(c), c == expect);
	char path[] = "/tmp/srdma-sockets-XXXXXX";
	int f = mkstemp(path);
	for (int i = 0; i < 65536; i++)
		buf[i] = (char)(i * 7);
	write(f, buf, 65536);
	unlink(path);
	off_t off = 1000;
	size_t sent = 0;
	while (sent < 64000) {
		ssize_t s = sendfile(c, f, &off, 64000 - sent);
		if (s <= 0)
			die("sendfile");
		sent += s;
	}
	say("sendfile %zu off=%ld", sent, (long)off);
	r = read(c, buf, 10);
	say("read after client close %zd", r);
	/* Writing to a closed peer fails, whichever error comes first. */
	int failed = 0;
	for (int i = 0; i < 50 && !failed; i++) {
		if (write(c, "z", 1) < 0)
			failed = errno == EPIPE || errno == ECONNRESET;
		else
			usleep(10000);
	}
	say("write to closed peer fails %d", failed);
	close(c);
	epoll_many_server(l);
	l = relisten_server(l, port);
	close(l);
	close(ep);
	say("done");
	return 0;
}

static int client(int port)
{
	char buf[BULK];
	signal(SIGPIPE, SIG_IGN);
	struct sockaddr_in a = addr_of(port), none = addr_of(port + 1);

	/* Nobody there: refused, blocking and not. */
	int s = socket(AF_INET, SOCK_STREAM, 0);
	say("connect refused %s", res(connect(s, (struct sockaddr *)&none, sizeof none)));
	close(s);
	s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	say("connect refused, non-blocking %s", res(connect(s, (struct sockaddr *)&none, sizeof none)));
	struct pollfd p = { .fd = s, .events = POLLOUT };
	poll(&p, 1, 5000);
	int e = 0;
	socklen_t len = sizeof e;
	getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &len);
	say("poll %x SO_ERROR %s", p.revents, e ? strerrorname_np(e) : "0");
	close(s);

	int expect = lowest_free();
	s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	say("socket lowest=%d", s == expect);
	int one = 1;
	say("TCP_NODELAY %s", res(setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one)));
	say("getpeername unconnected %s", res(getpeername(s, (struct sockaddr *)&a, &len)));
	a = addr_of(port);
	for (int i = 0; access(ready, F_OK) != 0; i++) {
		if (i == 3000)
			die("the server never got ready");
		usleep(10000);
	}
	say("connect %s", res(connect(s, (struct sockaddr *)&a, sizeof a)));
	p.fd = s;
	p.events = POLLOUT;
	int n = poll(&p, 1, 20000);
	e = -1;
	len = sizeof e;
	getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &len);
	say("poll n=%d out=%d SO_ERROR %d", n, !!(p.revents & POLLOUT), e);
	say("connect again %s", res(connect(s, (struct sockaddr *)&a, sizeof a)));
	say("connect once more %s", res(connect(s, (struct sockaddr *)&a, sizeof a)));
	struct sockaddr_in got;
	len = sizeof got;
	long rr = getpeername(s, (struct sockaddr *)&got, &len);
	say("getpeername %s port=%d", res(rr), ntohs(got.sin_port) == port);
	char ip[64];
	inet_ntop(AF_INET, &got.sin_addr, ip, sizeof ip);
	say("peer %s", ip);
	len = sizeof got;
	getsockname(s, (struct sockaddr *)&got, &len);
	inet_ntop(AF_INET, &got.sin_addr, ip, sizeof ip);
	say("local %s", ip);
	set_block(s, 1);
	read_all(s, buf, 3);
	say("got %.3s", buf);
	say("send %zd", send(s, "hello", 5, 0));
	read_all(s, buf, 11);
	say("got %.11s", buf);
	read_all(s, buf, 3);
	say("got %.3s", buf);
	read_all(s, buf, 3);
	say("got %.3s", buf);
	for (int i = 0; i < BULK; i++)
		buf[i] = (char)(i * 13 + 1);
	say("bulk sum=%u", sum(buf, BULK));
	write_all(s, buf, BULK);
	memset(buf, 0, BULK);
	ssize_t r = recv(s, buf, BULK, MSG_WAITALL);
	say("bulk back %zd sum=%u", r, sum(buf, r > 0 ? r : 0));
	set_block(s, 0);
	int taken = 0;
	for (int i = 0; i < 5000; i++) {
		char m[20];
		memset(m, 'a' + i % 26, sizeof m);
		if (write(s, m, sizeof m) != sizeof m)
			break;
		taken++;
	}
	say("small writes taken %d", taken);
	set_block(s, 1);
	for (int i = taken; i < 5000; i++) {
		char m[20];
		memset(m, 'a' + i % 26, sizeof m);
		write_all(s, m, sizeof m);
	}
	read_all(s, buf, 3);
	say("got %.3s", buf);
	/* The server shut writing down: the end of the stream, then we close. */
	r = read(s, buf, 10);
	say("read eof %zd", r);
	struct pollfd pc = { .fd = s, .events = POLLIN | POLLRDHUP };
	poll(&pc, 1, 1000);
	say("poll after eof %x", pc.revents);
	close(s);

	/* A second connection, blocking, gets a file. */
	s = socket(AF_INET, SOCK_STREAM, 0);
	say("connect blocking %s", res(connect(s, (struct sockaddr *)&a, sizeof a)));
	read_all(s, buf, 64000);
	int ok = 1;
	for (int i = 0; i < 64000; i++)
		ok &= buf[i] == (char)((i + 1000) * 7);
	say("file ok %d", ok);
	close(s);

	epoll_many_client(&a);
	relisten_client(&a);

	/* What rsockets do not carry stays the kernel's: UDP and a socket pair. */
	int u = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in ua = addr_of(0);
	bind(u, (struct sockaddr *)&ua, sizeof ua);
	len = sizeof ua;
	getsockname(u, (struct sockaddr *)&ua, &len);
	say("udp sendto %zd", sendto(u, "dgram", 5, 0, (struct sockaddr *)&ua, sizeof ua));
	say("udp recv %zd", recv(u, buf, 10, 0));
	close(u);
	int sp[2];
	say("socketpair %s", res(socketpair(AF_UNIX, SOCK_STREAM, 0, sp)));
	ssize_t w = write(sp[0], "ab", 2);
	say("unix write %zd read %zd", w, read(sp[1], buf, 2));
	close(sp[0]);
	close(sp[1]);
	say("done");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: sockets server|client PORT READY-FILE\n");
		return 2;
	}
	side = argv[1];
	ready = argv[3];
	int port = atoi(argv[2]);
	return strcmp(side, "server") == 0 ? server(port) : client(port);
}
