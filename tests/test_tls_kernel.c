/* tests/test_tls_kernel.c: a session's write keys handed to the kernel: the real one (test_tls_kernel, a skip without CONFIG_TLS) or one the test plays (test_tls_kernel_played). */
#include "config.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <perch.h>
#include <perch/tls.h>

#include "both_backends.h"
#include "tls_internal.h"
#include "tls_test_certs.h"

/*
 * The kernel, played: perch's connection is one end of a Unix stream
 * pair, and a relay reads the other. Whatever perch wrote before it set
 * TLS_TX is already in the relay's receive queue when it does (a Unix
 * send lands in the peer's queue), so the set marks that offset of the
 * stream; from there the relay encrypts what perch writes, as the kernel
 * would, into records an OpenSSL client on a second pair decrypts. A
 * control record is queued at the offset it was sent at, to be sealed
 * in its place. A switch made before the earlier records left, wrong
 * keys, a control record sent as data: the client fails.
 */

static int backend;

#ifndef PERCH_REAL_KERNEL
#define PERCH_REAL_KERNEL 0
#endif
/* The kernel's own TLS, over loopback TCP: no relay, no kernel played. */
static const bool real = PERCH_REAL_KERNEL;

#define MSG_BIG (1u << 20)
#define MAX_CTRL 16

struct ctrl {
	uint64_t at;
	uint8_t type;
	size_t len;
	uint8_t bytes[1024];
};

static struct {
	pthread_mutex_t lock;
	int perch_fd, relay_fd, client_fd;   /* perch's end; the relay's two */
	bool ulp_done;
	int ulp_answer, set_tx_answer, ctrl_eagain, ctrl_partial;
	int set_tx_calls, ulp_calls_perch;
	union tls_ktls_keys keys;
	uint64_t switch_at, read_count;
	struct ctrl ctrls[MAX_CTRL];
	int nctrl;
	bool stop;
} k = {.lock = PTHREAD_MUTEX_INITIALIZER};

static size_t inq(int fd)
{
	int n = 0;
	if (ioctl(fd, FIONREAD, &n) != 0)
		abort();
	return (size_t)n;
}

static int fake_ulp(int fd)
{
	if (fd != k.perch_fd)
		return 0;   /* the loop's probe pair: this kernel has TLS */
	k.ulp_calls_perch++;
	k.ulp_done = k.ulp_answer == 0;
	return k.ulp_answer;
}

static int fake_set_tx(int fd, const void *keys, unsigned len)
{
	k.set_tx_calls++;
	if (fd != k.perch_fd || !k.ulp_done)
		return -ENOPROTOOPT;   /* as the kernel, without TCP_ULP "tls" first */
	if (k.set_tx_answer != 0)
		return k.set_tx_answer;
	const struct tls_crypto_info *info = keys;
	if (info->cipher_type != TLS_CIPHER_AES_GCM_128 && info->cipher_type != TLS_CIPHER_AES_GCM_256)
		return -EINVAL;   /* this kernel seals GCM only */
	pthread_mutex_lock(&k.lock);
	memcpy(&k.keys, keys, len);
	k.switch_at = k.read_count + inq(k.relay_fd);
	pthread_mutex_unlock(&k.lock);
	return 0;
}

/*
 * Each send is a record of what it took: Linux closes a record written in
 * part when the next TLS_SET_RECORD_TYPE send comes, so the rest goes as
 * a record of its own (legal for handshake messages; a 2-byte alert is
 * taken whole or not at all). A part taken is followed by no room.
 */
static ssize_t fake_send_ctrl(int fd, uint8_t type, const void *buf, size_t len)
{
	if (fd != k.perch_fd || k.switch_at == UINT64_MAX || len > sizeof(k.ctrls[0].bytes))
		return -EINVAL;
	if (k.ctrl_eagain > 0) {
		k.ctrl_eagain--;
		return -EAGAIN;
	}
	size_t take = len;
	if (k.ctrl_partial && len > 2) {
		k.ctrl_partial--;
		k.ctrl_eagain = 1;
		take = len / 2;
	}
	pthread_mutex_lock(&k.lock);
	assert_true(k.nctrl < MAX_CTRL);
	struct ctrl *c = &k.ctrls[k.nctrl++];
	*c = (struct ctrl){.at = k.read_count + inq(k.relay_fd), .type = type, .len = take};
	memcpy(c->bytes, buf, take);
	pthread_mutex_unlock(&k.lock);
	return (ssize_t)take;
}

static const struct perch__tls_kernel_ops fake_ops = {
	.ulp = fake_ulp, .set_tx = fake_set_tx, .send_ctrl = fake_send_ctrl,
};

/* ---- the relay: the kernel's sealing of records ---- */

static void write_all(int fd, const uint8_t *p, size_t n)
{
	while (n > 0) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w <= 0)
			return;   /* the client went: what it got is judged */
		p += w;
		n -= (size_t)w;
	}
}

static void be_increment(uint8_t *b, size_t n)
{
	for (size_t i = n; i-- > 0;)
		if (++b[i] != 0)
			return;
}

/* One record of `type` around `n` bytes, sealed as the kernel seals them, to the client. */
static void seal(uint8_t type, const uint8_t *pt, size_t n)
{
	bool big = k.keys.info.cipher_type == TLS_CIPHER_AES_GCM_256;
	const uint8_t *key = big ? k.keys.gcm256.key : k.keys.gcm128.key;
	uint8_t *iv = big ? k.keys.gcm256.iv : k.keys.gcm128.iv;
	uint8_t *seq = big ? k.keys.gcm256.rec_seq : k.keys.gcm128.rec_seq;
	const uint8_t *salt = big ? k.keys.gcm256.salt : k.keys.gcm128.salt;
	bool v13 = k.keys.info.version == TLS_1_3_VERSION;
	static uint8_t rec[5 + 8 + 16384 + 1 + 16];
	uint8_t nonce[12], aad[13], *out = rec + 5;
	memcpy(nonce, salt, 4);
	memcpy(nonce + 4, iv, 8);
	size_t inner = n + (v13 ? 1 : 0), aad_len;
	if (v13) {   /* RFC 8446 5.2: the type inside, the nonce the IV xor the sequence */
		for (int i = 0; i < 8; i++)
			nonce[4 + i] ^= seq[i];
		rec[0] = 23;
		aad_len = 5;
	} else {     /* RFC 5288: an explicit nonce, the sequence in the data authenticated */
		rec[0] = type;
		memcpy(out, iv, 8);
		out += 8;
		memcpy(aad, seq, 8);
		aad[8] = type;
		aad[9] = 3, aad[10] = 3;
		aad[11] = (uint8_t)(n >> 8), aad[12] = (uint8_t)n;
		aad_len = 13;
	}
	size_t body = (size_t)(out - rec - 5) + inner + 16;
	rec[1] = 3, rec[2] = 3, rec[3] = (uint8_t)(body >> 8), rec[4] = (uint8_t)body;
	if (v13)
		memcpy(aad, rec, 5);
	EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
	int len;
	assert_int_equal(EVP_EncryptInit_ex(c, big ? EVP_aes_256_gcm() : EVP_aes_128_gcm(), NULL, key, nonce), 1);
	assert_int_equal(EVP_EncryptUpdate(c, NULL, &len, aad, (int)aad_len), 1);
	assert_int_equal(EVP_EncryptUpdate(c, out, &len, pt, (int)n), 1);
	if (v13)
		assert_int_equal(EVP_EncryptUpdate(c, out + n, &len, &type, 1), 1);
	assert_int_equal(EVP_EncryptFinal_ex(c, out + inner, &len), 1);
	assert_int_equal(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, 16, out + inner), 1);
	EVP_CIPHER_CTX_free(c);
	be_increment(seq, 8);
	if (!v13)
		be_increment(iv, 8);
	write_all(k.client_fd, rec, 5 + body);
}

static uint64_t out_pos;   /* the relay's place in perch's stream */
static int ctrl_next;

/* Control records due at out_pos, in the order they were sent. */
static void seal_ctrls_due(int nctrl)
{
	while (ctrl_next < nctrl && k.ctrls[ctrl_next].at <= out_pos) {
		struct ctrl *c = &k.ctrls[ctrl_next++];
		seal(c->type, c->bytes, c->len);
	}
}

/* n bytes of perch's stream: raw before the switch, data to seal after it, control records between. */
static void relay_out(const uint8_t *d, size_t n, uint64_t switch_at, int nctrl)
{
	for (;;) {
		seal_ctrls_due(nctrl);
		if (n == 0)
			return;
		size_t take = n;
		if (ctrl_next < nctrl && k.ctrls[ctrl_next].at - out_pos < take)
			take = (size_t)(k.ctrls[ctrl_next].at - out_pos);
		if (out_pos < switch_at) {
			if (switch_at - out_pos < take)
				take = (size_t)(switch_at - out_pos);
			write_all(k.client_fd, d, take);
		} else {
			take = take < 16384 ? take : 16384;
			seal(23, d, take);
		}
		out_pos += take;
		d += take;
		n -= take;
	}
}

static void *relay_to_client(void *arg)
{
	static uint8_t buf[65536];
	while (!__atomic_load_n(&k.stop, __ATOMIC_ACQUIRE)) {
		struct pollfd p = {.fd = k.relay_fd, .events = POLLIN};
		poll(&p, 1, 2);
		pthread_mutex_lock(&k.lock);
		ssize_t n = recv(k.relay_fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n > 0)
			k.read_count += (uint64_t)n;
		uint64_t switch_at = k.switch_at;
		int nctrl = k.nctrl;
		pthread_mutex_unlock(&k.lock);
		relay_out(buf, n > 0 ? (size_t)n : 0, switch_at, nctrl);
		if (n == 0) {
			shutdown(k.client_fd, SHUT_WR);
			break;
		}
	}
	return NULL;
}

/* The client's records go to perch as they are: OpenSSL decrypts them there. */
static void *relay_to_perch(void *arg)
{
	uint8_t buf[16384];
	ssize_t n;
	while ((n = read(k.client_fd, buf, sizeof(buf))) > 0)
		write_all(k.relay_fd, buf, (size_t)n);
	shutdown(k.relay_fd, SHUT_WR);
	return NULL;
}

/* ---- the client: OpenSSL on blocking sockets ---- */

struct client {
	int fd;
	bool tls12, aes256, key_update;
	bool far_serves;   /* the far end is the TLS server, perch the client */
	const char *cipher12;   /* a TLS 1.2 cipher to ask for instead */
	bool poke;              /* perch's hello is written while records are in flight (poke) */
	/* what it found */
	bool connected, got_hello, got_big, got_close_notify, has_ticket;
	char why[256];
	bool done;
};

static uint8_t pattern(size_t i)
{
	return (uint8_t)(i * 7 + (i >> 11));
}

static bool read_exact(SSL *ssl, uint8_t *buf, size_t n)
{
	size_t have = 0, got;
	while (have < n) {
		if (SSL_read_ex(ssl, buf + have, n - have, &got) != 1)
			return false;
		have += got;
	}
	return true;
}

static void client_says(struct client *c, const char *what)
{
	snprintf(c->why, sizeof(c->why), "%s: ", what);
	size_t l = strlen(c->why);
	ERR_error_string_n(ERR_peek_last_error(), c->why + l, sizeof(c->why) - l);
}

static void *client_run(void *arg)
{
	struct client *c = arg;
	SSL_CTX *ctx = SSL_CTX_new(c->far_serves ? TLS_server_method() : TLS_client_method());
	if (c->far_serves) {
		SSL_CTX_use_certificate_file(ctx, cert("server.pem"), SSL_FILETYPE_PEM);
		SSL_CTX_use_PrivateKey_file(ctx, cert("server.key"), SSL_FILETYPE_PEM);
	} else {
		SSL_CTX_load_verify_locations(ctx, cert("ca.pem"), NULL);
		SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
	}
	if (c->tls12) {
		SSL_CTX_set_max_proto_version(ctx, TLS1_2_VERSION);
		SSL_CTX_set_cipher_list(ctx, c->cipher12	? c->cipher12
					     : c->aes256 ? "ECDHE-ECDSA-AES256-GCM-SHA384"
							 : "ECDHE-ECDSA-AES128-GCM-SHA256");
	} else {
		SSL_CTX_set_ciphersuites(ctx, c->aes256 ? "TLS_AES_256_GCM_SHA384" : "TLS_AES_128_GCM_SHA256");
	}
	SSL *ssl = SSL_new(ctx);
	SSL_set_fd(ssl, c->fd);
	if (!c->far_serves) {
		SSL_set1_host(ssl, "localhost");
		SSL_set_tlsext_host_name(ssl, "localhost");
	}
	uint8_t hello[16], *big = malloc(MSG_BIG);
	if ((c->far_serves ? SSL_accept(ssl) : SSL_connect(ssl)) != 1) {
		client_says(c, "connect");
		goto out;
	}
	__atomic_store_n(&c->connected, true, __ATOMIC_RELEASE);
	if (!read_exact(ssl, hello, 16) || memcmp(hello, "hello from perch", 16) != 0) {
		client_says(c, "hello");
		goto out;
	}
	c->got_hello = true;
	size_t w;
	if (c->key_update && SSL_key_update(ssl, SSL_KEY_UPDATE_REQUESTED) != 1)
		client_says(c, "key update");
	SSL_write_ex(ssl, "and from the client", 19, &w);
	if (!read_exact(ssl, big, MSG_BIG)) {
		client_says(c, "big");
		goto out;
	}
	c->got_big = true;
	for (size_t i = 0; i < MSG_BIG; i++)
		if (big[i] != pattern(i)) {
			snprintf(c->why, sizeof(c->why), "byte %zu differs", i);
			c->got_big = false;
			goto out;
		}
	uint8_t more;
	size_t got;
	int r = SSL_read_ex(ssl, &more, 1, &got);
	c->got_close_notify = r == 0 && SSL_get_error(ssl, r) == SSL_ERROR_ZERO_RETURN;
	if (!c->got_close_notify)
		client_says(c, "end");
	SSL_SESSION *sess = SSL_get1_session(ssl);
	c->has_ticket = sess && SSL_SESSION_has_ticket(sess);
	SSL_SESSION_free(sess);
out:
	free(big);
	SSL_free(ssl);
	SSL_CTX_free(ctx);
	shutdown(c->fd, SHUT_WR);
	__atomic_store_n(&c->done, true, __ATOMIC_RELEASE);
	return NULL;
}

/* ---- perch's side ---- */

struct side {
	struct perch_loop *loop;
	struct perch_tls_ctx *ctx;
	struct perch_conn *conn;
	struct perch_tls *tls;
	pthread_t relay[2], client;
	int client_end;
	struct perch_vtask_handle early;   /* perch as the client: its hello's flush, before the handshake */
	int early_rc;
};

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static bool turn_until(struct side *s, bool (*done)(struct side *))
{
	double end = now_ms() + 10000;
	while (!done(s) && now_ms() < end)
		perch_loop_run_once(s->loop, 2);
	return done(s);
}

static void adopted(struct perch_loop *loop, struct perch_conn *c, int err, void *arg)
{
	assert_int_equal(err, 0);
	((struct side *)arg)->conn = c;
}

static bool conn_there(struct side *s)
{
	return s->conn != NULL;
}

static bool settled(struct side *s)
{
	return perch_tls_established(s->tls) || perch_tls_error(s->tls, NULL, 0) != 0;
}

/*
 * When the client says so, the hello is written at the first turn's end
 * that finds the keys handed over while the records before them are still
 * in flight (on io_uring a flush's send is submitted at the next turn's
 * enter). The write posts a kick, which runs the engine at the next
 * turn's start, before that enter: OpenSSL writes again what waited.
 */
static struct client *the_client;   /* the far end of the session being run */
static bool poked;

static void poke(struct side *s)
{
	if (!the_client->poke || poked || s->tls->ktls != KTLS_KEYS || !s->tls->cout_flushing)
		return;
	poked = true;
	assert_int_equal(perch_pipe_write(perch_tls_writer(s->tls), "hello from perch", 16), 0);
	s->early_rc = perch_pipe_flush(perch_tls_writer(s->tls), &s->early);
}

/* Turns the loop until the handshake completed or failed (10 s at most), poking as told. */
static bool settle(struct side *s)
{
	double end = now_ms() + 10000;
	while (!settled(s) && now_ms() < end) {
		perch_loop_run_once(s->loop, 2);
		poke(s);
	}
	return settled(s);
}

/* A connected loopback TCP pair: *perch_end for perch, *far_end for the client. */
static void tcp_pair(int *perch_end, int *far_end)
{
	int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	assert_true(ls >= 0);
	assert_int_equal(bind(ls, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(ls, 1), 0);
	assert_int_equal(getsockname(ls, (struct sockaddr *)&a, &len), 0);
	*far_end = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_int_equal(connect(*far_end, (struct sockaddr *)&a, sizeof(a)), 0);
	*perch_end = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
	assert_true(*perch_end >= 0);
	close(ls);
}

/* Two Unix pairs with the relay between them: the kernel played as told. */
static void played_pairs(int *perch_end, int *far_end)
{
	int pp[2], cp[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pp), 0);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, cp), 0);
	k.perch_fd = *perch_end = pp[0];
	k.relay_fd = pp[1];
	k.client_fd = cp[0];
	*far_end = cp[1];
	k.switch_at = UINT64_MAX;
	k.read_count = 0;
	k.nctrl = 0;
	k.ulp_done = false;
	k.set_tx_calls = k.ulp_calls_perch = 0;
	k.stop = false;
	out_pos = 0;
	ctrl_next = 0;
	perch__tls_kernel_use(&fake_ops);
}

/* perch's server session on one end, the client on the far one. */
static void side_start(struct side *s, struct client *c)
{
	int perch_end;
	if (real)
		tcp_pair(&perch_end, &s->client_end);
	else
		played_pairs(&perch_end, &s->client_end);
	struct perch_loop_opts lo = {.backend = backend};
	assert_int_equal(perch_loop_new(&lo, &s->loop), 0);
	poked = false;
	char why[256];
	struct perch_tls_ctx_opts o = {.role = PERCH_TLS_SERVER, .cert_file = cert("server.pem"),
				       .key_file = cert("server.key")};
	if (c->far_serves)
		o = (struct perch_tls_ctx_opts){.role = PERCH_TLS_CLIENT, .ca_file = cert("ca.pem")};
	assert_int_equal(perch_tls_ctx_new(&o, &s->ctx, why, sizeof(why)), 0);
	assert_int_equal(perch_conn_adopt(s->loop, perch_end, NULL, adopted, s), 0);
	assert_true(turn_until(s, conn_there));
	struct perch_pipe_reader *r;
	struct perch_pipe_writer *w;
	assert_int_equal(perch_pipe_reader_new(s->conn, &r), 0);
	assert_int_equal(perch_pipe_writer_new(s->conn, &w), 0);
	struct perch_tls_opts to = {.server_name = "localhost"};
	assert_int_equal(perch_tls_new(s->ctx, s->loop, r, w, c->far_serves ? &to : NULL, &s->tls), 0);
	if (c->far_serves) {   /* written at once: it leaves right after the client's Finished */
		assert_int_equal(perch_pipe_write(perch_tls_writer(s->tls), "hello from perch", 16), 0);
		s->early_rc = perch_pipe_flush(perch_tls_writer(s->tls), &s->early);
	}
	c->fd = s->client_end;
	if (!real) {
		assert_int_equal(pthread_create(&s->relay[0], NULL, relay_to_client, NULL), 0);
		assert_int_equal(pthread_create(&s->relay[1], NULL, relay_to_perch, NULL), 0);
	}
	assert_int_equal(pthread_create(&s->client, NULL, client_run, c), 0);
	assert_true(settle(s));
}

static bool client_done(struct side *s)
{
	return __atomic_load_n(&the_client->done, __ATOMIC_ACQUIRE);
}

static bool client_connected(struct side *s)
{
	return __atomic_load_n(&the_client->connected, __ATOMIC_ACQUIRE) || client_done(s);
}

/* Waits for the client (after closing the connection, when the session failed), then ends it all. */
static void side_end(struct side *s, bool close_first)
{
	if (close_first)
		perch_conn_close(s->conn);
	assert_true(turn_until(s, client_done));
	perch_tls_free(s->tls);
	if (!close_first)
		perch_conn_close(s->conn);
	perch_conn_release(s->conn);
	for (int i = 0; i < 8; i++)
		perch_loop_run_once(s->loop, 1);
	pthread_join(s->client, NULL);
	close(s->client_end);
	if (!real) {
		__atomic_store_n(&k.stop, true, __ATOMIC_RELEASE);
		shutdown(k.client_fd, SHUT_RDWR);
		pthread_join(s->relay[0], NULL);
		pthread_join(s->relay[1], NULL);
		close(k.client_fd);
		close(k.relay_fd);
	}
	perch_loop_free(s->loop);
	perch_tls_ctx_free(s->ctx);
	perch__tls_kernel_use(NULL);
}

/* Writes and flushes on perch's side, turning the loop until the flush completed. */
static int write_flush(struct side *s, const void *data, size_t len)
{
	struct perch_pipe_writer *w = perch_tls_writer(s->tls);
	int rc = perch_pipe_write(w, data, len);
	if (rc)
		return rc;
	struct perch_vtask_handle h;
	rc = perch_pipe_flush(w, &h);
	double end = now_ms() + 10000;
	while (rc == PERCH_PENDING && perch_vtask_status(h) == PERCH_PENDING && now_ms() < end)
		perch_loop_run_once(s->loop, 2);
	if (rc != PERCH_PENDING)
		return rc;
	int64_t result = -ETIMEDOUT;
	perch_vtask_result(h, &result);
	return (int)result;
}

static void expect_read(struct side *s, const char *want)
{
	size_t n = strlen(want), have = 0;
	char got[64] = {0};
	double end = now_ms() + 10000;
	while (have < n && now_ms() < end) {
		struct perch_read_result r;
		if (perch_pipe_try_read(perch_tls_reader(s->tls), &r) == 0) {
			assert_int_equal(r.error, 0);
			size_t take = r.len < n - have ? r.len : n - have;
			perch_segs_copy(&r, 0, got + have, take);
			assert_int_equal(perch_pipe_advance_to(perch_tls_reader(s->tls), take, take), 0);
			have += take;
		}
		perch_loop_run_once(s->loop, 2);
	}
	assert_string_equal(got, want);
}

/* A mebibyte from perch, then close_notify, then the end once the client is done. */
static void send_big_then_end(struct side *s)
{
	uint8_t *big = malloc(MSG_BIG);
	for (size_t i = 0; i < MSG_BIG; i++)
		big[i] = pattern(i);
	assert_int_equal(write_flush(s, big, MSG_BIG), 0);
	free(big);
	assert_int_equal(perch_pipe_writer_complete(perch_tls_writer(s->tls)), 0);
	side_end(s, false);
}

/* A whole session through the played kernel: hello each way, a mebibyte, close_notify. */
static void run_session(struct client *c, int eagain, int partial)
{
	struct side s = {0};
	the_client = c;
	k.ulp_answer = 0;
	k.set_tx_answer = 0;
	k.ctrl_eagain = eagain;
	k.ctrl_partial = partial;
	side_start(&s, c);
	turn_until(&s, client_connected);
	char why[256] = "";
	if (perch_tls_error(s.tls, why, sizeof(why)) != 0 || !c->connected)
		fail_msg("handshake: perch says \"%s\", the client \"%s\"", why, c->why);
	assert_int_equal(perch_tls_path(s.tls), PERCH_TLS_PATH_KERNEL_TX);
	assert_non_null(strstr(perch_tls_path_reason(s.tls), "kernel: the kernel encrypts"));
	bool early = c->far_serves || poked;   /* the hello was written before the handshake completed */
	if (!early)
		assert_int_equal(write_flush(&s, "hello from perch", 16), 0);
	expect_read(&s, "and from the client");
	if (early && s.early_rc == PERCH_PENDING) {
		int64_t result = -1;
		assert_int_equal(perch_vtask_result(s.early, &result), 0);
		assert_int_equal(result, 0);
	} else if (early) {
		assert_int_equal(s.early_rc, 0);
	}
	send_big_then_end(&s);
	if (!c->got_hello || !c->got_big || !c->got_close_notify)
		fail_msg("the client: %s", c->why);
	assert_true(c->has_ticket || c->far_serves);
	if (real)
		return;
	assert_int_equal(k.set_tx_calls, 1);
	assert_int_equal(k.ulp_calls_perch, 1);
	assert_int_equal(k.ctrl_eagain, 0);
	assert_int_equal(k.ctrl_partial, 0);
	/* Control records went as such: TLS 1.3's tickets (handshake), 1.2's Finished, the alert last. */
	assert_true(k.nctrl >= 1);
	for (int i = 0; i < k.nctrl - 1; i++)
		assert_int_equal(k.ctrls[i].type, 22);
	assert_int_equal(k.ctrls[k.nctrl - 1].type, 21);
}

static void tls13_aes128_records_leave_through_the_kernel(void **state)
{
	struct client c = {0};
	run_session(&c, 0, 0);
	assert_true(real || k.nctrl == 3);   /* two tickets, close_notify */
}

static void tls13_aes256_control_records_wait_for_room(void **state)
{
	struct client c = {.aes256 = true};
	run_session(&c, 3, 0);
}

static void tls12_finished_follows_the_switch_as_a_control_record(void **state)
{
	struct client c = {.tls12 = true};
	run_session(&c, 0, 0);
	assert_true(real || k.nctrl == 2);   /* Finished, close_notify */
}

static void tls12_aes256_control_records_taken_in_parts_are_whole(void **state)
{
	struct client c = {.tls12 = true, .aes256 = true};
	run_session(&c, 0, 1);
}

static void tls12_the_switch_waits_for_records_still_in_flight(void **state)
{
	struct client c = {.tls12 = true, .poke = true};
	run_session(&c, 0, 0);
	/* io_uring always leaves the window open a turn; epoll's flush may complete at once. */
	assert_true(poked || backend == PERCH_BACKEND_EPOLL);
}

static void tls13_client_data_written_early_follows_its_finished(void **state)
{
	struct client c = {.far_serves = true};
	run_session(&c, 0, 0);
	assert_true(real || k.nctrl == 1);   /* close_notify */
}

static void tls12_client_data_written_early_follows_its_finished(void **state)
{
	struct client c = {.far_serves = true, .tls12 = true, .aes256 = true};
	run_session(&c, 0, 0);
	assert_true(real || k.nctrl == 2);   /* Finished, close_notify */
}

static void a_key_update_the_peer_asks_for_fails_the_session_saying_why(void **state)
{
	struct client c = {.key_update = true};
	struct side s = {0};
	the_client = &c;
	k.ulp_answer = k.set_tx_answer = k.ctrl_eagain = k.ctrl_partial = 0;
	side_start(&s, &c);
	assert_int_equal(write_flush(&s, "hello from perch", 16), 0);
	expect_read(&s, "and from the client");   /* under the client's new keys: OpenSSL's to read */
	/* The reply's KeyUpdate would leave the kernel's keys behind OpenSSL's: refused before it goes. */
	assert_int_equal(write_flush(&s, "more", 4), -EPROTO);
	char why[256] = "";
	assert_int_equal(perch_tls_error(s.tls, why, sizeof(why)), -EPROTO);
	assert_string_equal(why, "the peer asked for a key update, which the kernel's keys cannot follow");
	side_end(&s, true);
	assert_true(c.got_hello);
	assert_false(c.got_big);
}

/* A session the kernel does not get: it stays in userspace saying `why`, and carries everything. */
static void stays_in_userspace(struct client *c, int ulp_answer, const char *why)
{
	struct side s = {0};
	the_client = c;
	k.ulp_answer = ulp_answer;
	k.set_tx_answer = k.ctrl_eagain = k.ctrl_partial = 0;
	side_start(&s, c);
	assert_true(perch_tls_established(s.tls));
	assert_int_equal(perch_tls_path(s.tls), PERCH_TLS_PATH_USERSPACE);
	assert_string_equal(perch_tls_path_reason(s.tls), why);
	assert_int_equal(write_flush(&s, "hello from perch", 16), 0);
	expect_read(&s, "and from the client");
	send_big_then_end(&s);
	if (!c->got_big || !c->got_close_notify)
		fail_msg("the client: %s", c->why);
	assert_int_equal(k.set_tx_calls, 0);
	assert_int_equal(k.nctrl, 0);
}

static void a_socket_refusing_the_ulp_stays_in_userspace(void **state)
{
	struct client c = {0};
	stays_in_userspace(&c, -EOPNOTSUPP, "userspace: this socket refused TCP_ULP \"tls\" (Operation not supported)");
}

static void a_cipher_the_kernel_does_not_take_stays_in_userspace(void **state)
{
	struct client c = {.tls12 = true, .cipher12 = "ECDHE-ECDSA-AES128-SHA256"};
	stays_in_userspace(&c, 0,
			   "userspace: OpenSSL kept the keys of ECDHE-ECDSA-AES128-SHA256 (a cipher the kernel "
			   "does not take, or no kTLS in OpenSSL)");
}

static void keys_the_kernel_refuses_fail_the_session_saying_why(void **state)
{
	struct client c = {0};
	struct side s = {0};
	the_client = &c;
	k.ulp_answer = 0;
	k.set_tx_answer = -EINVAL;
	k.ctrl_eagain = k.ctrl_partial = 0;
	side_start(&s, &c);
	char why[256] = "";
	assert_int_equal(perch_tls_error(s.tls, why, sizeof(why)), -EINVAL);
	assert_string_equal(why, "the kernel refused the session's keys (TLS_TX: Invalid argument)");
	/* Its reader says so, and nothing hangs: the client is let go. */
	struct perch_read_result r;
	double end = now_ms() + 5000;
	while (perch_pipe_try_read(perch_tls_reader(s.tls), &r) != 0 && now_ms() < end)
		perch_loop_run_once(s.loop, 2);
	assert_int_equal(r.error, -EINVAL);
	side_end(&s, true);
	assert_false(c.got_hello);
	assert_int_equal(k.set_tx_calls, 1);
}

/* perch_tls_end's after(): how often it ran. */
static int ended;

static void count_end(void *arg)
{
	(void)arg;
	ended++;
}

/* Inside a turn: 128 KiB flushed, the writer completed, the session ended; whether a flush waited then. */
struct last_words {
	struct perch_tls *tls;
	bool waited, done;
};

static void say_last_words(void *arg)
{
	struct last_words *l = arg;
	enum { BIG = 128 * 1024 };
	static uint8_t data[BIG];
	struct perch_pipe_writer *w = perch_tls_writer(l->tls);
	struct perch_vtask_handle h;
	assert_int_equal(perch_pipe_write(w, data, BIG), 0);
	int rc = perch_pipe_flush(w, &h);
	assert_true(rc == 0 || rc == PERCH_PENDING);
	assert_int_equal(perch_pipe_writer_complete(w), 0);
	l->waited = l->tls->cout_flushing;
	k.ctrl_eagain = 1000000;   /* the close_notify will find no room */
	perch_tls_end(l->tls, count_end, NULL);
	l->done = true;
}

/* A session on the kernel's path (the kernel plays along), a message each way done. */
static void on_the_kernels_path_after_a_word_each_way(struct side *s, struct client *c)
{
	the_client = c;
	k.ulp_answer = k.set_tx_answer = k.ctrl_eagain = k.ctrl_partial = 0;
	side_start(s, c);
	turn_until(s, client_connected);
	assert_int_equal(perch_tls_path(s->tls), PERCH_TLS_PATH_KERNEL_TX);
	assert_int_equal(write_flush(s, "hello from perch", 16), 0);
	expect_read(s, "and from the client");
}

/*
 * Ended while its last flush is in flight, with close_notify owed: once
 * that flush ended the close_notify, a control record, finds no room in
 * the socket, so a timer would retry it. The end gives up on it instead:
 * after() runs once and the session goes with no timer armed (ASan).
 */
static void an_end_whose_close_notify_finds_no_room_leaves_no_timer(void **state)
{
	struct client c = {0};
	struct side s = {0};
	on_the_kernels_path_after_a_word_each_way(&s, &c);
	ended = 0;
	struct last_words l = {.tls = s.tls};
	s.tls = NULL;
	assert_int_equal(perch_loop_post(s.loop, say_last_words, &l), 0);
	double end = now_ms() + 100;   /* fifty retries' time */
	while (now_ms() < end)
		perch_loop_run_once(s.loop, 2);
	assert_true(l.done);
	assert_true(l.waited || backend == PERCH_BACKEND_EPOLL);
	assert_int_equal(ended, 1);
	k.ctrl_eagain = 0;
	side_end(&s, true);
}

/*
 * The writer completed between turns (its close_notify asked for, a kick
 * posted), then the session freed there with no room in the socket: the
 * free sends no close_notify, so it arms no retry in memory that goes
 * (the session is held by the kick until the next turn).
 */
static void a_free_after_a_complete_between_turns_leaves_no_timer(void **state)
{
	struct client c = {0};
	struct side s = {0};
	on_the_kernels_path_after_a_word_each_way(&s, &c);
	k.ctrl_eagain = 1000000;
	struct perch_tls *t = s.tls;
	s.tls = NULL;
	assert_int_equal(perch_pipe_writer_complete(perch_tls_writer(t)), 0);
	perch_tls_free(t);
	assert_false(perch_timer_is_armed(&t->ktls_retry));
	double end = now_ms() + 100;
	while (now_ms() < end)
		perch_loop_run_once(s.loop, 2);
	k.ctrl_eagain = 0;
	side_end(&s, true);
}

/* 0 when a connected loopback TCP socket takes TCP_ULP "tls", else -errno (ENOENT: no CONFIG_TLS). */
static int kernel_takes_tls(void)
{
	int a, b, rc = 0;
	tcp_pair(&a, &b);
	if (setsockopt(b, IPPROTO_TCP, 31 /* TCP_ULP */, "tls", 4) != 0)
		rc = -errno;
	close(a);
	close(b);
	return rc;
}

/* Whole sessions: the kernel's own TLS runs them too. */
#define SESSION_TESTS                                                                      \
	cmocka_unit_test(tls13_aes128_records_leave_through_the_kernel),                   \
	cmocka_unit_test(tls13_aes256_control_records_wait_for_room),                      \
	cmocka_unit_test(tls12_finished_follows_the_switch_as_a_control_record),           \
	cmocka_unit_test(tls12_aes256_control_records_taken_in_parts_are_whole),           \
	cmocka_unit_test(tls12_the_switch_waits_for_records_still_in_flight),              \
	cmocka_unit_test(tls13_client_data_written_early_follows_its_finished),            \
	cmocka_unit_test(tls12_client_data_written_early_follows_its_finished),            \
	cmocka_unit_test(a_key_update_the_peer_asks_for_fails_the_session_saying_why)

int main(void)
{
	const struct CMUnitTest sessions[] = {SESSION_TESTS};
	/* The same, and the kernel's refusals, which only the played kernel gives at will. */
	const struct CMUnitTest played[] = {
		SESSION_TESTS,
		cmocka_unit_test(a_socket_refusing_the_ulp_stays_in_userspace),
		cmocka_unit_test(a_cipher_the_kernel_does_not_take_stays_in_userspace),
		cmocka_unit_test(keys_the_kernel_refuses_fail_the_session_saying_why),
		cmocka_unit_test(an_end_whose_close_notify_finds_no_room_leaves_no_timer),
		cmocka_unit_test(a_free_after_a_complete_between_turns_leaves_no_timer),
	};
	int rc = real ? kernel_takes_tls() : 0;
	if (rc != 0) {
		printf("SKIP: the kernel refuses TCP_ULP \"tls\" (%s%s): the kernel's own TLS cannot run "
		       "here; test_tls_kernel_played hands the keys to a kernel it plays\n",
		       strerror(-rc), rc == -ENOENT ? ": no CONFIG_TLS" : "");
		return 77;
	}
	make_certs();
	int failed = real ? RUN_ON_BOTH_BACKENDS("tls kernel", sessions, backend)
			  : RUN_ON_BOTH_BACKENDS("tls kernel played", played, backend);
	remove_certs();
	return failed;
}
