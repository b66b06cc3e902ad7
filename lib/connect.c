/* lib/connect.c: outgoing connections: started on the loop, timed out by its timer, reported once to the caller's callback. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include <perch/sock.h>

#include "loop_internal.h"

void perch__loop_connected(struct perch__sock *s, int res)
{
	struct perch__connecting *cx = perch__sock_cx(s);
	if (!cx || !cx->on_connected)
		return;
	perch__timer_disarm(&cx->connect_timer);
	perch_connect_fn cb = cx->on_connected;
	void *arg = cx->connect_arg;
	cx->on_connected = NULL;
	if (res < 0) {
		perch__sock_start_close(s);
		cb(s->loop, NULL, res, arg);
		return;
	}
	/* Answered with success: the kernel is done with the address. */
	s->loop->connecting[s->slot] = NULL;
	free(cx);
	perch__sock_set_nodelay(s);
	if (perch__loop_recv_wanted(s))
		s->loop->be->recv_arm(s);
	perch__conn_ref(perch__sock_conn(s)); /* the callback's */
	cb(s->loop, perch__sock_conn(s), 0, arg);
}

/*
 * Its timeout passed and the turn's completions did not answer it:
 * perch__loop_connected closes the socket, and the connect's own
 * completion, when it comes, finds the callback gone.
 */
static void connect_timed_out(struct perch_timer *t, void *arg)
{
	perch__loop_connected(arg, -ETIMEDOUT);
}

/* The loop's slot array for connects, made at the first (a server that never connects has none). */
static int connecting_room(struct perch_loop *loop)
{
	if (!loop->connecting)
		loop->connecting = calloc(loop->cap ? loop->cap : 1, sizeof(*loop->connecting));
	return loop->connecting ? 0 : -ENOMEM;
}

/*
 * Loop thread: cx's socket goes in the table, cx by its slot, and starts
 * connecting (an adopted one is connected at once); a refusal is reported
 * at once, and both freed.
 */
static void connect_start(struct perch__connecting *cx)
{
	struct perch__sock *s = cx->s;
	struct perch_loop *loop = s->loop;
	/* Posted work that perch_loop_free's last drain runs: no later turn would report it. */
	int err = loop->freeing ? -ECANCELED
		  : connecting_room(loop) != 0 || perch__table_insert(loop, s) != 0 ? -ENOMEM : 0;
	if (err) {
		perch_connect_fn cb = cx->on_connected;
		void *arg = cx->connect_arg;
		free(cx);
		perch_conn_release(perch__sock_conn(s)); /* not in the table: closes fd, frees s */
		cb(loop, NULL, err, arg);
		return;
	}
	PERCH_ASSERT(loop->connecting[s->slot] == NULL); /* cleared by the insert */
	loop->connecting[s->slot] = cx;
	if (cx->adopted) {
		perch__loop_connected(s, 0); /* posted, so never from inside perch_conn_adopt */
		return;
	}
	if (cx->connect_deadline_ms)
		perch__timer_arm_at(&cx->connect_timer, cx->connect_deadline_ms, cx->connect_timeout_ms);
	loop->be->connect(s);
}

static void run_posted_connect(struct perch_loop *loop, struct perch__msg *m)
{
	connect_start(perch__container_of(m, struct perch__connecting, connect_msg));
}

struct perch__connecting *perch__connecting_new(void)
{
	return calloc(1, sizeof(struct perch__connecting));
}

/* Fills s's connect's fields, ready to be posted (or started). */
static void connect_fill(struct perch__sock *s, struct perch__connecting *cx, perch_connect_fn on_connected,
			 void *arg)
{
	cx->s = s;
	cx->on_connected = on_connected;
	cx->connect_arg = arg;
	perch_timer_init(&cx->connect_timer, s->loop, connect_timed_out, s); /* an adopted one's is never armed */
	cx->connect_msg.run = run_posted_connect;
}

/* Any thread: a socket of the address's family connecting to it, started (or posted) on the loop. */
static int connect_to(struct perch_loop *loop, const struct sockaddr_storage *ss, socklen_t len,
		      const struct perch_conn_opts *o, perch_connect_fn on_connected, void *arg)
{
	struct perch__connecting *cx = perch__connecting_new();
	if (!cx)
		return -ENOMEM;
	int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		free(cx);
		return -errno;
	}
	struct perch__sock *s = perch__conn_sock_new(loop, fd, ss->ss_family, o, NULL);
	if (!s) {
		close(fd);
		free(cx);
		return -ENOMEM;
	}
	cx->addr = *ss;
	cx->addr_len = len;
	cx->connect_timeout_ms = o->connect_timeout_ms;
	cx->connect_deadline_ms = o->connect_timeout_ms ? perch__now_ms() + o->connect_timeout_ms : 0;
	connect_fill(s, cx, on_connected, arg);
	if (perch__loop_is_current(loop))
		connect_start(cx);
	else
		perch__inbox_push(loop, &cx->connect_msg);
	return 0;
}

void perch__conn_adopted_post(struct perch__sock *s, struct perch__connecting *cx, perch_connect_fn on_connected,
			      void *arg)
{
	cx->adopted = true;
	connect_fill(s, cx, on_connected, arg);
	perch__inbox_push(s->loop, &cx->connect_msg); /* posted even on the loop's thread: never reported inside the call */
}

int perch_connect(struct perch_loop *loop, const char *host, int port,
		  const struct perch_conn_opts *opts, perch_connect_fn on_connected, void *arg)
{
	struct sockaddr_storage ss;
	socklen_t len;
	struct perch_conn_opts o;
	if (!loop || !on_connected || port == 0 || perch__addr_parse(host, port, &ss, &len) != 0 ||
	    perch__conn_opts_resolve(opts, &o) != 0)
		return -EINVAL;
	return connect_to(loop, &ss, len, &o, on_connected, arg);
}

int perch_connect_unix(struct perch_loop *loop, const char *name,
		       const struct perch_conn_opts *opts, perch_connect_fn on_connected, void *arg)
{
	struct sockaddr_storage ss;
	socklen_t len;
	bool abstract;
	struct perch_conn_opts o;
	if (!loop || !on_connected || perch__conn_opts_resolve(opts, &o) != 0)
		return -EINVAL;
	int rc = perch__unix_addr_parse(name, &ss, &len, &abstract);
	return rc != 0 ? rc : connect_to(loop, &ss, len, &o, on_connected, arg);
}
