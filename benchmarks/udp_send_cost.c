/* What one UDP send costs in a loopback ping-pong, for the socket setups srdma and its UDP
 * baseline use: a busy ping-pong of 24-byte datagrams (an 8 B SEND's size on the wire)
 * between 127.0.0.1:5555 and 127.0.0.2:5556, timing every send call (on loopback it also
 * delivers the datagram to the peer's socket) and the half round trip.
 *
 *   gcc -O2 -o /tmp/udp_send_cost benchmarks/udp_send_cost.c
 *   /tmp/udp_send_cost server MODE & /tmp/udp_send_cost client MODE; wait
 *
 * MODE bits: 1 connected socket (send) instead of sendto, 2 SO_REUSEPORT, 4 sendmmsg of
 * three iovecs (header, payload, ICRC: how srdma sends), 8 UDP_GRO on. Both ends print
 * "send N ns, half rtt X us". 200000 round trips. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define ITERS 200000

static long now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000L + t.tv_nsec;
}

int main(int argc, char **argv)
{
	if (argc != 3 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
		fprintf(stderr, "usage: udp_send_cost server|client MODE\n");
		return 2;
	}
	int server = !strcmp(argv[1], "server"), mode = atoi(argv[2]), one = 1;
	int pmtu = IP_PMTUDISC_DO;
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		perror("socket");
		return 1;
	}
	if (mode & 2)
		setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
	if (mode & 8)
		setsockopt(fd, IPPROTO_UDP, 104 /* UDP_GRO */, &one, sizeof one);
	setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
	struct sockaddr_in me = { .sin_family = AF_INET, .sin_port = htons(server ? 5555 : 5556) };
	struct sockaddr_in peer = { .sin_family = AF_INET, .sin_port = htons(server ? 5556 : 5555) };
	inet_pton(AF_INET, server ? "127.0.0.1" : "127.0.0.2", &me.sin_addr);
	inet_pton(AF_INET, server ? "127.0.0.2" : "127.0.0.1", &peer.sin_addr);
	if (bind(fd, (struct sockaddr *)&me, sizeof me)) {
		perror("bind");
		return 1;
	}
	if ((mode & 1) && connect(fd, (struct sockaddr *)&peer, sizeof peer)) {
		perror("connect");
		return 1;
	}
	char buf[64] = { 0 }, hdr[12] = { 0 }, pay[8] = { 0 }, crc[4] = { 0 };
	long sent_ns = 0, start;
	if (!server)
		usleep(200000); /* let the server bind */
	start = now_ns();
	for (int i = 0; i < ITERS; i++) {
		if (server || i > 0)
			while (recv(fd, buf, sizeof buf, 0) < 0)
				;
		long t = now_ns();
		if (mode & 4) {
			struct iovec iov[3] = { { hdr, 12 }, { pay, 8 }, { crc, 4 } };
			struct mmsghdr m = { 0 };
			m.msg_hdr.msg_name = &peer;
			m.msg_hdr.msg_namelen = sizeof peer;
			m.msg_hdr.msg_iov = iov;
			m.msg_hdr.msg_iovlen = 3;
			sendmmsg(fd, &m, 1, MSG_DONTWAIT);
		} else if (mode & 1) {
			send(fd, buf, 24, 0);
		} else {
			sendto(fd, buf, 24, 0, (struct sockaddr *)&peer, sizeof peer);
		}
		sent_ns += now_ns() - t;
	}
	if (!server)
		while (recv(fd, buf, sizeof buf, 0) < 0)
			;
	printf("%s mode %d: send %ld ns, half rtt %.2f us\n", argv[1], mode, sent_ns / ITERS,
	       (double)(now_ns() - start) / ITERS / 2 / 1000);
	return 0;
}
