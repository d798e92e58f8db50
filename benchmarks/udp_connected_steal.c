/* What a UDP socket connected to a peer does to srdma's shared port (an SO_REUSEPORT group on
 * ADDRESS:4791 whose classic BPF program picks the member by a payload byte, as portshare's
 * picks the slot by QPN). Three group members g0, g1, g2 (g2 created after the connected one)
 * and a socket "conn" on the same address and port, connected to the peer's 4791; the peer
 * sends datagrams whose first byte is 0, 1, 2 from its port 4791 and from port 5000.
 *
 *   gcc -O2 -o /tmp/udp_connected_steal benchmarks/udp_connected_steal.c
 *   ip netns exec B /tmp/udp_connected_steal recv VARIANT & sleep 0.5
 *   for p in 4791 5000; do for b in 0 1 2; do
 *       ip netns exec A /tmp/udp_connected_steal send $p $b; done; done; wait
 *   (A = 10.196.0.1, B = 10.196.0.2, joined by veth, as benchmarks/ab.sh sets them up)
 *
 * VARIANT 0: no connected socket (each byte reaches its member, whatever the source port);
 *         1: conn joins the group (SO_REUSEPORT);
 *         2: every socket also has SO_REUSEADDR and conn has it alone (not in the group);
 *         3: as 2, and conn shut down for reading;
 *         4: conn has SO_REUSEPORT and SO_BINDTODEVICE (the interface the peer's datagrams
 *            come in on, here "vb"): it forms a group of its own, and the steered group
 *            has no connected member. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int bound(int reuseport, int reuseaddr, const char *ip, int port)
{
	int one = 1, fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
	if (reuseport)
		setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
	if (reuseaddr)
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	inet_pton(AF_INET, ip, &a.sin_addr);
	if (bind(fd, (struct sockaddr *)&a, sizeof a)) {
		perror("bind");
		exit(1);
	}
	return fd;
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "send")) {
		int fd = bound(1, 0, "10.196.0.1", atoi(argv[2]));
		struct sockaddr_in d = { .sin_family = AF_INET, .sin_port = htons(4791) };
		inet_pton(AF_INET, "10.196.0.2", &d.sin_addr);
		char b[8] = { (char)atoi(argv[3]) };
		return sendto(fd, b, sizeof b, 0, (struct sockaddr *)&d, sizeof d) < 0;
	}
	if (argc != 3 || strcmp(argv[1], "recv")) {
		fprintf(stderr, "usage: udp_connected_steal recv VARIANT | send SPORT BYTE\n");
		return 2;
	}
	int v = atoi(argv[2]), addr = v == 2 || v == 3;
	int g0 = bound(1, addr, "10.196.0.2", 4791), g1 = bound(1, addr, "10.196.0.2", 4791);
	struct sock_filter code[] = { { 0x30, 0, 0, 0 }, { 0x16, 0, 0, 0 } }; /* ldb [0]; ret a */
	struct sock_fprog prog = { 2, code };
	if (setsockopt(g0, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof prog))
		perror("SO_ATTACH_REUSEPORT_CBPF");
	int conn = -1;
	if (v == 4) {
		int one = 1;
		conn = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
		setsockopt(conn, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
		if (setsockopt(conn, SOL_SOCKET, SO_BINDTODEVICE, "vb", 3))
			perror("SO_BINDTODEVICE");
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(4791) };
		inet_pton(AF_INET, "10.196.0.2", &a.sin_addr);
		if (bind(conn, (struct sockaddr *)&a, sizeof a))
			perror("bind conn");
		struct sockaddr_in p = { .sin_family = AF_INET, .sin_port = htons(4791) };
		inet_pton(AF_INET, "10.196.0.1", &p.sin_addr);
		if (connect(conn, (struct sockaddr *)&p, sizeof p))
			perror("connect");
	} else if (v >= 1) {
		conn = bound(v == 1, addr, "10.196.0.2", 4791);
		struct sockaddr_in p = { .sin_family = AF_INET, .sin_port = htons(4791) };
		inet_pton(AF_INET, "10.196.0.1", &p.sin_addr);
		if (connect(conn, (struct sockaddr *)&p, sizeof p))
			perror("connect");
		if (v == 3)
			shutdown(conn, SHUT_RD);
	}
	int g2 = bound(1, addr, "10.196.0.2", 4791);
	sleep(2);
	int fds[4] = { g0, g1, conn, g2 };
	const char *name[4] = { "g0", "g1", "conn", "g2" };
	for (int i = 0; i < 4; i++) {
		char b[64];
		struct sockaddr_in f;
		socklen_t fl = sizeof f;
		while (fds[i] >= 0 && recvfrom(fds[i], b, sizeof b, 0, (struct sockaddr *)&f, &fl) >= 0)
			printf("%s got byte %d from port %d\n", name[i], b[0], ntohs(f.sin_port));
	}
	return 0;
}
