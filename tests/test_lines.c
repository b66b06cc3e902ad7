/* tests/test_lines.c: the guide's line protocol (examples/lines), over in-memory pipes and over loopback. */
#include "config.h"

#include "loop_util.h"
#include "cmocka_prelude.h"
#include "../examples/lines/lines.h"

/* ---- over two in-memory pipes: everything runs inline on this thread ---- */

struct mem_rig {
	struct perch_pipe_reader *req_r, *rep_r;   /* the server reads req_r; the client reads rep_r */
	struct perch_pipe_writer *req_w, *rep_w;
	int ended;
};

static void mem_ended(void *arg)
{
	((struct mem_rig *)arg)->ended++;
}

static void mem_rig_start(struct mem_rig *m)
{
	memset(m, 0, sizeof(*m));
	assert_int_equal(perch_pipe_new(NULL, &m->req_r, &m->req_w), 0);
	assert_int_equal(perch_pipe_new(NULL, &m->rep_r, &m->rep_w), 0);
	assert_int_equal(lines_serve(m->req_r, m->rep_w, mem_ended, m), 0);
}

static void client_send(struct mem_rig *m, const char *text)
{
	struct perch_vtask_handle h;
	assert_int_equal(perch_pipe_write(m->req_w, text, strlen(text)), 0);
	/* -EPIPE: the server read it all and ended (QUIT) inside this flush. */
	int rc = perch_pipe_flush(m->req_w, &h);
	assert_true(rc == 0 || (rc == -EPIPE && m->ended));
}

/* Everything the server replied so far, as a string. */
static void client_replies(struct mem_rig *m, char *out, size_t max)
{
	struct perch_read_result res;
	struct perch_vtask_handle h;
	size_t n = 0;
	if (perch_pipe_read(m->rep_r, &res, &h) == 0) {
		n = lu_copy(&res, (uint8_t *)out, max - 1);
		assert_int_equal(perch_pipe_advance_to(m->rep_r, res.len, res.len), 0);
	}
	out[n] = '\0';
}

static void mem_rig_end(struct mem_rig *m)
{
	perch_pipe_writer_free(m->req_w);
	perch_pipe_reader_free(m->rep_r);
}

static void commands_are_answered_in_order_and_quit_ends_the_session(void **state)
{
	struct mem_rig m;
	char out[256];
	mem_rig_start(&m);
	client_send(&m, "ECHO hello\nUPPER quiet\r\nNOPE\n");
	client_replies(&m, out, sizeof(out));
	assert_string_equal(out, "hello\nQUIET\nERR unknown command\n");
	assert_int_equal(m.ended, 0);
	client_send(&m, "QUIT\n");
	client_replies(&m, out, sizeof(out));
	assert_string_equal(out, "BYE\n");
	assert_int_equal(m.ended, 1);
	mem_rig_end(&m);
}

static void a_line_sent_byte_by_byte_is_answered_once_whole(void **state)
{
	struct mem_rig m;
	char out[64], byte[2] = { 0, 0 };
	const char *text = "ECHO slow client\n";
	mem_rig_start(&m);
	for (const char *p = text; *p; p++) {
		client_replies(&m, out, sizeof(out));
		assert_string_equal(out, "");
		byte[0] = *p;
		client_send(&m, byte);
	}
	client_replies(&m, out, sizeof(out));
	assert_string_equal(out, "slow client\n");
	/* The peer finishing ends the session too. */
	assert_int_equal(perch_pipe_writer_complete(m.req_w), 0);
	assert_int_equal(m.ended, 1);
	mem_rig_end(&m);
}

static void a_line_too_long_is_refused_and_ends_the_session(void **state)
{
	struct mem_rig m;
	char out[64];
	static char big[LINES_MAX + 10];
	memset(big, 'x', sizeof(big) - 1);
	mem_rig_start(&m);
	client_send(&m, big);
	client_replies(&m, out, sizeof(out));
	assert_string_equal(out, "ERR line too long\n");
	assert_int_equal(m.ended, 1);
	mem_rig_end(&m);
}

/* ---- over loopback: the same session on a connection, on the loop thread ---- */

struct tcp_rig {
	struct lu_loop l;
	struct perch_listener *ls;
};

static void tcp_ended(void *arg)
{
	struct perch_conn *c = arg;
	perch_conn_close(c);
	perch_conn_release(c);
}

static void tcp_accept(struct perch_listener *ls, struct perch_conn *c, void *arg)
{
	struct perch_pipe_reader *r;
	struct perch_pipe_writer *w;
	if (perch_pipe_reader_new(c, &r) != 0)
		goto fail;
	if (perch_pipe_writer_new(c, &w) != 0) {
		perch_pipe_reader_free(r);
		goto fail;
	}
	if (lines_serve(r, w, tcp_ended, c) == 0)
		return;
	perch_pipe_reader_free(r);
	perch_pipe_writer_free(w);
fail:
	perch_conn_release(c);
}

static void a_session_over_loopback_answers_and_closes_on_quit(void **state)
{
	struct tcp_rig t;
	uint8_t buf[128];
	assert_int_equal(lu_start(&t.l, NULL), 0);
	assert_int_equal(perch_listen(t.l.loop, "127.0.0.1", 0, NULL, tcp_accept, &t, &t.ls), 0);
	int fd = lu_plain_connect(perch_listener_port(t.ls));
	assert_true(fd >= 0);
	assert_true(lu_write_all(fd, (const uint8_t *)"ECHO one\nUPP", 12));
	usleep(20000);
	assert_true(lu_write_all(fd, (const uint8_t *)"ER two\nQUIT\n", 12));
	const char *want = "one\nTWO\nBYE\n";
	assert_true(lu_read_all(fd, buf, strlen(want)));
	assert_memory_equal(buf, want, strlen(want));
	/* Then the server closes: EOF. */
	assert_int_equal(read(fd, buf, sizeof(buf)), 0);
	close(fd);
	perch_listener_close(t.ls);
	assert_int_equal(lu_stop(&t.l), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(commands_are_answered_in_order_and_quit_ends_the_session),
		cmocka_unit_test(a_line_sent_byte_by_byte_is_answered_once_whole),
		cmocka_unit_test(a_line_too_long_is_refused_and_ends_the_session),
		cmocka_unit_test(a_session_over_loopback_answers_and_closes_on_quit),
	};
	return cmocka_run_group_tests_name("lines", tests, NULL, NULL);
}
