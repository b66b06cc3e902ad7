/* lib/connect.c: outgoing connections: started on the loop, timed out by its timer, reported once to the caller's callback. */
#include "config.h"

#include <errno.h>
#include <unistd.h>

#include <perch/sock.h>

#include "loop_internal.h"

void perch__loop_connected(struct perch__sock *s, int res)
{
	perch__timer_disarm(&s->connect_timer);
	perch_connect_fn cb = s->on_connected;
	void *arg = s->connect_arg;
	s->on_connected = NULL;
	if (!cb)
		return;
	if (res < 0) {
		perch__sock_start_close(s);
		cb(s->loop, NULL, res, arg);
		return;
	}
	perch__sock_set_nodelay(s);
	if (perch__loop_recv_wanted(s))
		s->loop->be->recv_arm(s);
	perch__conn_ref(s->conn); /* the callback's */
	cb(s->loop, s->conn, 0, arg);
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

/*
 * Loop thread: s goes in the table and starts connecting (an adopted one
 * is connected at once); a refusal is reported at once, and s freed.
 */
static void connect_start(struct perch__sock *s)
{
	/* Posted work that perch_loop_free's last drain runs: no later turn would report it. */
	int err = s->loop->freeing ? -ECANCELED : perch__table_insert(s->loop, s) != 0 ? -ENOMEM : 0;
	if (err) {
		perch_connect_fn cb = s->on_connected;
		void *arg = s->connect_arg;
		struct perch_loop *loop = s->loop;
		perch_conn_release(s->conn); /* not in the table: closes fd, frees s */
		cb(loop, NULL, err, arg);
		return;
	}
	if (s->adopted) {
		perch__loop_connected(s, 0); /* posted, so never from inside perch_conn_adopt */
		return;
	}
	if (s->connect_deadline_ms)
		perch__timer_arm_at(&s->connect_timer, s->connect_deadline_ms, s->opts.connect_timeout_ms);
	s->loop->be->connect(s);
}

static void run_posted_connect(struct perch_loop *loop, struct perch__msg *m)
{
	connect_start(perch__container_of(m, struct perch__sock, connect_msg));
}

/* Any thread: a socket of the address's family connecting to it, started (or posted) on the loop. */
static int connect_to(struct perch_loop *loop, const struct sockaddr_storage *ss, socklen_t len,
		      const struct perch_conn_opts *o, perch_connect_fn on_connected, void *arg)
{
	int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	struct perch__sock *s = perch__conn_sock_new(loop, fd, ss->ss_family, o);
	if (!s) {
		close(fd);
		return -ENOMEM;
	}
	s->addr = *ss;
	s->addr_len = len;
	s->on_connected = on_connected;
	s->connect_arg = arg;
	s->connect_deadline_ms = o->connect_timeout_ms ? perch__now_ms() + o->connect_timeout_ms : 0;
	perch_timer_init(&s->connect_timer, loop, connect_timed_out, s);
	if (perch__loop_is_current(loop)) {
		connect_start(s);
		return 0;
	}
	s->connect_msg.run = run_posted_connect;
	perch__inbox_push(loop, &s->connect_msg);
	return 0;
}

void perch__conn_adopted_post(struct perch__sock *s, perch_connect_fn on_connected, void *arg)
{
	s->adopted = true;
	s->on_connected = on_connected;
	s->connect_arg = arg;
	perch_timer_init(&s->connect_timer, s->loop, connect_timed_out, s); /* never armed; disarmed as any */
	s->connect_msg.run = run_posted_connect;
	perch__inbox_push(s->loop, &s->connect_msg);
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
