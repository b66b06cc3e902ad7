/* bench/loop_stall.c: a writer floods a connection whose consumer is stalled (or slow): a process to watch with strace -c for an event storm.
 *
 * Build (from the repo, after ./dev build build):
 *   gcc -O2 -Iinclude -Ilib -Ibuild -Itests bench/loop_stall.c build/.libs/libperch.a -luring -lck -lpthread -o /tmp/loop_stall
 * Run: /tmp/loop_stall stalled|slow [SECONDS [epoll|uring]]   (default 10 s, epoll)
 *   then, once it prints "ready": strace -c -f -p PID   (interrupt it before the end)
 *
 * One loop; a plain writer thread floods one connection (64 KiB writes, as
 * fast as the socket takes them); pause_bytes is 64 KiB. "stalled": the
 * consumer never consumes, recv stays paused with a full buffer. "slow":
 * every 10 ms the consumer (another thread) consumes what is queued, so
 * recv resumes and pauses again each time. Prints the loop's counters at
 * the end (waits, turns, interest changes, pauses) and the bytes consumed.
 */
#include <signal.h>
#include <stdio.h>

#include "loop_util.h"

struct sink {
	struct perch_conn *c;
	sem_t got;
};

static void sink_accept(struct perch_listener *l, struct perch_conn *c, void *arg)
{
	struct sink *s = arg;
	s->c = c;
	sem_post(&s->got);
}

struct flood {
	int fd;
	pthread_t th;
};

static void *flood_main(void *p)
{
	struct flood *f = p;
	static uint8_t buf[65536];
	while (lu_write_all(f->fd, buf, sizeof(buf)))
		;
	return NULL;
}

struct counters {
	struct perch_loop *loop;
	uint64_t waits, turns, yields, changes, pauses;
};

static void read_counters(void *p)
{
	struct counters *k = p;
	k->waits = k->loop->stats.waits;
	k->turns = k->loop->stats.read_turns;
	k->yields = k->loop->stats.read_yields;
	k->changes = k->loop->stats.interest_changes;
	k->pauses = k->loop->stats.recv_pauses;
}

/* Consumes everything queued (without waiting); returns the bytes. */
static size_t consume_queued(struct perch_conn *c)
{
	struct perch_read_result r;
	if (perch_conn_try_read(c, &r) != 0 || r.len == 0)
		return 0;
	perch_conn_advance(c, r.len, r.len);
	return r.len;
}

int main(int argc, char **argv)
{
	bool slow = argc > 1 && strcmp(argv[1], "slow") == 0;
	int secs = argc > 2 ? atoi(argv[2]) : 10;
	enum perch_backend backend = argc > 3 && strcmp(argv[3], "uring") == 0 ? PERCH_BACKEND_URING
									      : PERCH_BACKEND_EPOLL;
	if (argc < 2 || (!slow && strcmp(argv[1], "stalled") != 0) || secs < 1 || secs > 120) {
		fprintf(stderr, "usage: loop_stall stalled|slow [SECONDS 1..120 [epoll|uring]]\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	struct perch_loop_opts lo = { .backend = backend };
	struct perch_conn_opts co = { .pause_bytes = 64 * 1024 };
	struct lu_loop l;
	struct perch_listener *ls;
	struct sink s;
	sem_init(&s.got, 0, 0);
	if (lu_start(&l, &lo) != 0 ||
	    perch_listen(l.loop, "127.0.0.1", 0, &co, sink_accept, &s, &ls) != 0)
		return 1;
	struct flood f = { .fd = lu_plain_connect(perch_listener_port(ls)) };
	if (f.fd < 0 || lu_sem_wait(&s.got, LU_TIMEOUT_MS) != 0)
		return 1;
	pthread_create(&f.th, NULL, flood_main, &f);
	printf("ready: pid %d, %s consumer, %s, %d s\n", (int)getpid(), slow ? "slow" : "stalled",
	       perch_loop_backend_name(l.loop), secs);
	fflush(stdout);
	uint64_t consumed = 0;
	for (int i = 0; i < secs * 100; i++) {
		usleep(10 * 1000);
		if (slow)
			consumed += consume_queued(s.c);
	}
	struct counters k = { .loop = l.loop };
	lu_on_loop(&l, read_counters, &k);
	printf("consumed %llu B; loop: %llu waits, %llu read turns (%llu yields), %llu interest changes, %llu pauses\n",
	       (unsigned long long)consumed, (unsigned long long)k.waits, (unsigned long long)k.turns,
	       (unsigned long long)k.yields, (unsigned long long)k.changes, (unsigned long long)k.pauses);
	shutdown(f.fd, SHUT_RDWR);
	pthread_join(f.th, NULL);
	close(f.fd);
	perch_conn_release(s.c);
	lu_stop(&l);
	sem_destroy(&s.got);
	return 0;
}
