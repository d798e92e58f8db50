/* The kernel's share of srdma's busy round trip over UDP: a ping-pong of 40-byte datagrams
 * (an 8 B SEND's size on the wire) with no user-space work, done the way the UDP baseline
 * does it and the way srdma's UDP driver does it, between two addresses on UDP 4791.
 *
 *   gcc -O2 -o /tmp/udp_rtt_floor benchmarks/udp_rtt_floor.c
 *   ip netns exec B /tmp/udp_rtt_floor server 10.197.0.2 10.197.0.1 MODE &
 *   ip netns exec A /tmp/udp_rtt_floor client 10.197.0.1 10.197.0.2 MODE; wait
 *
 * MODE 0: connected socket, send + recv (srdma perf's UDP baseline);
 *      1: unconnected, sendmmsg with an address + recvmmsg of up to 32 (srdma's driver);
 *      2: as 1, and each reply followed by a 32-byte "ACK" datagram in the same sendmmsg;
 *      3: as 2 with UDP_GRO on (srdma turns it on), its cmsg received into a control
 *         buffer as srdma's driver does (before 2026-11-28 mode 3 passed none);
 *      4: connected, sendmmsg of reply + ACK, recvmmsg;
 *      5: as 2, but received on a second socket on the port, connected to the peer (the
 *         kernel prefers it to the unconnected one for the peer's datagrams);
 *      6: as 2, but sent from a socket connected to the peer from an ephemeral port;
 *      7: as 3, but each look is one recvmsg (one datagram) instead of a recvmmsg;
 *      8: as 7, but a look is a recvmsg only after an empty look, a recvmmsg after one
 *         that found a datagram;
 *      9: as 2, but each look is one recvfrom (no msghdr, no control buffer: srdma's
 *         busy looks while GRO is off, since 2026-11-28).
 *
 *   ip netns exec A /tmp/udp_rtt_floor looks MY_IP
 * times a look at an empty socket (bound to MY_IP:4791, SO_REUSEPORT) with each receive
 * call: recv, recvfrom, recvmsg, recvmmsg of 1 and of 32.
 * Environment: ACK_EVERY=N sends the "ACK" (modes 2..9) only every Nth round trip (a
 * responder that coalesces ACKs); SPIN_NS=T busy-waits T ns between taking the peer's
 * datagram and sending the reply, at both ends (user-space work on the critical path, as
 * srdma's engine has).
 * The client prints the half round trip averaged over 200000 round trips. */
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
#define BATCH 32

static long now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000L + t.tv_nsec;
}

static char rb[BATCH][2048];
static struct mmsghdr rm[BATCH];
static struct iovec riov[BATCH];
static struct sockaddr_in from[BATCH];
static char ctrl[BATCH][32];

/* Waits for the peer's reply (datagrams starting with 1; "ACKs" start with 2). */
static void wait_reply(int fd, int mode)
{
	if (mode == 0) {
		char b[64];
		while (recv(fd, b, sizeof b, 0) < 0)
			;
		return;
	}
	static int found;
	for (;;) {
		int n;
		if (mode == 9) {
			socklen_t l = sizeof from[0];
			n = recvfrom(fd, rb[0], sizeof rb[0], MSG_DONTWAIT, (struct sockaddr *)&from[0], &l) < 0 ? 0 : 1;
		} else if (mode == 7 || (mode == 8 && !found)) {
			rm[0].msg_hdr.msg_namelen = sizeof from[0];
			rm[0].msg_hdr.msg_controllen = rm[0].msg_hdr.msg_control ? sizeof ctrl[0] : 0;
			n = recvmsg(fd, &rm[0].msg_hdr, MSG_DONTWAIT) < 0 ? 0 : 1;
		} else {
			for (int j = 0; j < BATCH; j++)
				rm[j].msg_hdr.msg_controllen = rm[j].msg_hdr.msg_control ? sizeof ctrl[j] : 0;
			n = recvmmsg(fd, rm, BATCH, MSG_DONTWAIT, NULL);
		}
		found = n > 0;
		for (int j = 0; j < n; j++)
			if (rb[j][0] == 1)
				return;
	}
}

/* Points the receive messages at their buffers and addresses (and control buffers). */
static void arm_receive(int with_control)
{
	for (int i = 0; i < BATCH; i++) {
		riov[i].iov_base = rb[i];
		riov[i].iov_len = sizeof rb[i];
		rm[i].msg_hdr.msg_iov = &riov[i];
		rm[i].msg_hdr.msg_iovlen = 1;
		rm[i].msg_hdr.msg_name = &from[i];
		rm[i].msg_hdr.msg_namelen = sizeof from[i];
		if (with_control)
			rm[i].msg_hdr.msg_control = ctrl[i];
	}
}

/* Nanoseconds per look at an empty socket, for each receive call. */
static int looks(const char *ip)
{
	int one = 1, fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
	struct sockaddr_in me = { .sin_family = AF_INET, .sin_port = htons(4791) };
	if (fd < 0 || inet_pton(AF_INET, ip, &me.sin_addr) != 1) {
		fprintf(stderr, "bad address\n");
		return 2;
	}
	setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
	if (bind(fd, (struct sockaddr *)&me, sizeof me)) {
		perror("bind");
		return 1;
	}
	arm_receive(1);
	for (int i = 0; i < BATCH; i++)
		rm[i].msg_hdr.msg_controllen = sizeof ctrl[i];
	const char *names[] = { "recv", "recvfrom", "recvmsg", "recvmmsg 1", "recvmmsg 32" };
	for (int k = 0; k < 5; k++) {
		long t = now_ns();
		for (int i = 0; i < ITERS * 10; i++) {
			socklen_t l = sizeof from[0];
			switch (k) {
			case 0: recv(fd, rb[0], sizeof rb[0], MSG_DONTWAIT); break;
			case 1: recvfrom(fd, rb[0], sizeof rb[0], MSG_DONTWAIT, (struct sockaddr *)&from[0], &l); break;
			case 2: recvmsg(fd, &rm[0].msg_hdr, MSG_DONTWAIT); break;
			case 3: recvmmsg(fd, rm, 1, MSG_DONTWAIT, NULL); break;
			default: recvmmsg(fd, rm, BATCH, MSG_DONTWAIT, NULL); break;
			}
		}
		printf("%-12s %.0f ns per empty look\n", names[k], (double)(now_ns() - t) / (ITERS * 10));
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "looks"))
		return looks(argv[2]);
	if (argc != 5 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
		fprintf(stderr, "usage: udp_rtt_floor server|client MY_IP PEER_IP MODE\n");
		return 2;
	}
	int server = !strcmp(argv[1], "server"), mode = atoi(argv[4]), one = 1;
	int acks_every = getenv("ACK_EVERY") ? atoi(getenv("ACK_EVERY")) : 0;
	long spin_ns = getenv("SPIN_NS") ? atol(getenv("SPIN_NS")) : 0;
	int pmtu = IP_PMTUDISC_DO;
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		perror("socket");
		return 1;
	}
	setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
	setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
	if (mode == 3 || mode == 7 || mode == 8)
		setsockopt(fd, IPPROTO_UDP, 104 /* UDP_GRO */, &one, sizeof one);
	struct sockaddr_in me = { .sin_family = AF_INET, .sin_port = htons(4791) };
	struct sockaddr_in peer = { .sin_family = AF_INET, .sin_port = htons(4791) };
	if (inet_pton(AF_INET, argv[2], &me.sin_addr) != 1 ||
	    inet_pton(AF_INET, argv[3], &peer.sin_addr) != 1) {
		fprintf(stderr, "bad address\n");
		return 2;
	}
	if (bind(fd, (struct sockaddr *)&me, sizeof me)) {
		perror("bind");
		return 1;
	}
	int connected = mode == 0 || mode == 4;
	if (connected && connect(fd, (struct sockaddr *)&peer, sizeof peer)) {
		perror("connect");
		return 1;
	}
	/* sfd sends; fd receives. */
	int sfd = fd;
	if (mode == 5 || mode == 6) {
		struct sockaddr_in at = me;
		int rfd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
		if (rfd < 0) {
			perror("socket");
			return 1;
		}
		setsockopt(rfd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
		if (mode == 5)
			setsockopt(rfd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
		else
			at.sin_port = 0;
		if (bind(rfd, (struct sockaddr *)&at, sizeof at) ||
		    connect(rfd, (struct sockaddr *)&peer, sizeof peer)) {
			perror("second socket");
			return 1;
		}
		if (mode == 5)
			fd = rfd;
		else
			sfd = rfd;
	}
	int send_connected = connected || mode == 6;
	arm_receive(mode == 3 || mode == 7 || mode == 8);
	char reply[40] = { 1 }, ack[32] = { 2 };
	if (!server)
		usleep(300000); /* let the server bind */
	long start = now_ns();
	for (int i = 0; i < ITERS; i++) {
		if (server || i > 0)
			wait_reply(fd, mode);
		if (spin_ns)
			for (long t0 = now_ns(); now_ns() - t0 < spin_ns;)
				;
		if (mode == 0) {
			send(fd, reply, sizeof reply, 0);
			continue;
		}
		struct iovec iv[2] = { { reply, sizeof reply }, { ack, sizeof ack } };
		struct mmsghdr m[2];
		memset(m, 0, sizeof m);
		for (int k = 0; k < 2; k++) {
			if (!send_connected) {
				m[k].msg_hdr.msg_name = &peer;
				m[k].msg_hdr.msg_namelen = sizeof peer;
			}
			m[k].msg_hdr.msg_iov = &iv[k];
			m[k].msg_hdr.msg_iovlen = 1;
		}
		int acks = mode >= 2 && (acks_every == 0 || i % acks_every == 0);
		sendmmsg(sfd, m, acks ? 2 : 1, MSG_DONTWAIT);
	}
	if (!server) {
		wait_reply(fd, mode);
		printf("mode %d: half rtt %.2f us\n", mode, (double)(now_ns() - start) / ITERS / 2 / 1000);
	}
	return 0;
}
