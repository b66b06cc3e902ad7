/* bench/loop_recv_mode.c: multishot vs single-shot recv: a 256 MiB stream, and 10,000 short connections; also idles with 100 connections (for strace -c).
 *
 * Build (from the repo, after ./dev build build-loop):
 *   gcc -O2 -Iinclude -Ilib -Ibuild-loop -Itests bench/loop_recv_mode.c build-loop/.libs/libperch.a -luring -lck -lpthread -o /tmp/loop_recv_mode
 * Run: /tmp/loop_recv_mode            (both measurements, both modes)
 *      /tmp/loop_recv_mode idle 100   (100 idle connections; prints "ready", idles 30 s)
 */
#include <stdio.h>
#include <sys/time.h>

#include "loop_util.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

struct sink { struct perch_conn *c; sem_t got; };

static void sink_accept(struct perch_listener *l, struct perch_conn *c, void *arg)
{
	struct sink *s = arg;
	s->c = c;
	sem_post(&s->got);
}

struct feeder { int fd; size_t len; pthread_t th; };

static void *feed(void *p)
{
	struct feeder *f = p;
	static uint8_t buf[1 << 16];
	for (size_t off = 0; off < f->len; off += sizeof(buf))
		lu_write_all(f->fd, buf, sizeof(buf));
	shutdown(f->fd, SHUT_WR);
	return NULL;
}

static void stream(enum perch_recv_mode mode, const char *name)
{
	struct lu_loop l;
	struct sink s = { 0 };
	struct perch_listener *ls;
	struct perch_conn_opts o = { .recv_mode = mode };
	sem_init(&s.got, 0, 0);
	lu_start(&l, NULL);
	perch_listen(l.loop, "127.0.0.1", 0, &o, sink_accept, &s, &ls);
	struct feeder f = { lu_plain_connect(perch_listener_port(ls)), 256u << 20 };
	lu_sem_wait(&s.got, 10000);
	double t0 = now();
	pthread_create(&f.th, NULL, feed, &f);
	struct lu_end e = lu_read_to_end(s.c, NULL, f.len);
	double t = now() - t0;
	pthread_join(f.th, NULL);
	printf("stream %-11s 256 MiB in %.3f s = %.0f MiB/s (completed=%d, got=%zu)\n", name, t, 256 / t,
	       e.completed, e.got);
	perch_conn_release(s.c);
	close(f.fd);
	lu_stop(&l);
}

struct churn { uint32_t n; sem_t done; };

static void churned(struct perch_loop *loop, struct perch_conn *c, int r, void *arg)
{
	struct churn *k = arg;
	if (c)
		perch_conn_release(c);
	sem_post(&k->done);
}

static void churn(enum perch_recv_mode mode, const char *name)
{
	struct lu_loop l;
	struct lu_echo_stats st = { 0 };
	struct perch_listener *ls;
	struct perch_conn_opts o = { .recv_mode = mode };
	struct churn k = { 0 };
	sem_init(&k.done, 0, 0);
	lu_start(&l, NULL);
	perch_listen(l.loop, "127.0.0.1", 0, &o, lu_echo_accept, &st, &ls);
	double t0 = now();
	for (int b = 0; b < 100; b++) {
		for (int i = 0; i < 100; i++)
			perch_connect(l.loop, "127.0.0.1", perch_listener_port(ls), &o, churned, &k);
		for (int i = 0; i < 100; i++)
			lu_sem_wait(&k.done, 10000);
	}
	while (perch__load_u32(&st.ended) < 10000)
		usleep(100);
	double t = now() - t0;
	printf("churn  %-11s 10,000 connections in %.3f s = %.0f conn/s\n", name, t, 10000 / t);
	lu_stop(&l);
}

static void idle(int n)
{
	struct lu_loop l;
	struct lu_echo_stats st = { 0 };
	struct perch_listener *ls;
	lu_start(&l, NULL);
	perch_listen(l.loop, "127.0.0.1", 0, NULL, lu_echo_accept, &st, &ls);
	for (int i = 0; i < n; i++)
		if (!lu_connect(&l, "127.0.0.1", perch_listener_port(ls), NULL))
			return;
	printf("ready %d\n", getpid());
	fflush(stdout);
	sleep(30);
}

int main(int argc, char **argv)
{
	if (argc > 2) {
		idle(atoi(argv[2]));
		return 0;
	}
	for (int rep = 0; rep < 3; rep++) {
		stream(PERCH_RECV_MULTISHOT, "multishot");
		stream(PERCH_RECV_SINGLESHOT, "single-shot");
	}
	for (int rep = 0; rep < 3; rep++) {
		churn(PERCH_RECV_MULTISHOT, "multishot");
		churn(PERCH_RECV_SINGLESHOT, "single-shot");
	}
	return 0;
}
