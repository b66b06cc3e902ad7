/* pipes/tls_internal.h: the TLS layer's state, shared by its context, BIO, session and engine. */
#ifndef PERCH_PIPES_TLS_INTERNAL_H
#define PERCH_PIPES_TLS_INTERNAL_H

#include <linux/tls.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <sys/types.h>

#include <perch/timer.h>
#include <perch/tls.h>

#include "backend.h"
#include "conn_internal.h"

struct perch_tls_ctx {
	uint32_t refs;
	int role;
	SSL_CTX *ssl;
	unsigned char *alpn;             /* the ALPN list in wire form (length-prefixed names) */
	unsigned alpn_len;
	perch_tls_sni_fn sni;
	void *sni_arg;
	pthread_mutex_t cache_lock;      /* a client's last session, for resumption */
	SSL_SESSION *cached;
	char *cached_name;
};

/* Where the session is. */
enum tls_state { TLS_HANDSHAKE, TLS_OPEN, TLS_FAILED };

/* How far a session's records moved to the kernel (pipes/tls_kernel.c). */
enum tls_ktls {
	KTLS_OFF,       /* OpenSSL encrypts: the kernel was not offered the session */
	KTLS_OFFERED,   /* the socket took TCP_ULP "tls"; OpenSSL may hand over its write keys */
	KTLS_KEYS,      /* OpenSSL handed them: the switch waits for the records before them to leave */
	KTLS_TX,        /* the kernel encrypts what the session writes */
};

/* The kernel's write keys, as OpenSSL hands them (linux/tls.h). */
union tls_ktls_keys {
	struct tls_crypto_info info;
	struct tls12_crypto_info_aes_gcm_128 gcm128;
	struct tls12_crypto_info_aes_gcm_256 gcm256;
	struct tls12_crypto_info_aes_ccm_128 ccm128;
	struct tls12_crypto_info_chacha20_poly1305 chacha;
};

/* What other threads ask of the engine (bits of `asks`). */
#define TLS_ASK_CLOSE_NOTIFY 1u   /* the plaintext writer completed */
#define TLS_ASK_CIPHER_READY 2u   /* the parked ciphertext read was delivered */
#define TLS_ASK_FLUSHED      4u   /* the waited ciphertext flush completed (flush_result) */

/*
 * A session. The plaintext side is a connection core with no socket
 * (`plain`) whose transport is this session: its reader is fed by
 * decryption (perch__conn_recv_arrived) and its flushes come here
 * (tls_ops.send). Everything below "engine" is the loop thread's alone;
 * other threads hand work over through the atomic fields and a kick
 * posted to the loop. The memory lives as long as `plain`: the session's
 * own reference, the plaintext ends', and one per posted kick and per
 * ciphertext flush still waited for.
 */
struct perch_tls {
	struct perch__msg kick_msg;
	uint32_t kick_posted;            /* kick_msg is in the inbox */
	struct perch_loop *loop;
	struct perch_tls_ctx *ctx;
	struct perch_tls_ctx *sni_ctx;   /* a context the SNI chooser picked, or NULL */
	struct perch_conn *plain;
	struct perch_pipe_reader *pr, *cr;   /* plaintext, ciphertext */
	struct perch_pipe_writer *pw, *cw;

	/* ---- handed over by any thread ---- */
	struct perch__txbuf *tx_in;      /* a plaintext flush's chain (tls_ops.send) */
	uint64_t unread;                 /* decrypted bytes not yet consumed */
	uint32_t asks;                   /* TLS_ASK_* */
	uint32_t paused;                 /* decryption waits for room: a consume at resume kicks */
	int32_t flush_result;            /* the waited ciphertext flush's, before TLS_ASK_FLUSHED */

	/* ---- engine: the loop thread's ---- */
	SSL *ssl;
	enum tls_state state;
	bool running, again, in_send, freed;
	bool timer_started, fail_unreported;
	bool after_timer;                /* the timer holds a reference for perch_tls_end */
	bool ending;                     /* perch_tls_end finishes what was flushed, and close_notify */
	bool free_left;                  /* freed inside the engine's run: its kick finishes the free */
	bool end_now;                    /* perch_tls_end's time is up: after() runs whatever is under way */
	bool end_flushing;               /* inside one of its flush calls */
	bool timers_left;                /* freed off the loop's thread: the kick disarms the timers */
	bool in_openssl_read;            /* OpenSSL asks for ciphertext: a continuation run there is inside its call */
	bool close_notify_deferred;      /* asked for inside OpenSSL's read: a free there still sends it */
	bool cin_have, cin_parked, cin_eof;
	bool cout_flushing;
	bool want_input;                 /* OpenSSL asked for ciphertext it lacked */
	bool close_notify_wanted, close_notify_sent, peer_closed, established;
	int io_error;                    /* the ciphertext pipes' error, for the failure it causes */
	struct perch_read_result cin;    /* the ciphertext result OpenSSL reads from */
	size_t cin_off;
	struct perch__txbuf *tx;         /* the plaintext chain being encrypted */
	struct perch__txbuf *tx_at;
	size_t tx_off;
	bool tx_encrypted;               /* all of tx is staged as records: done once they are flushed */
	struct perch__txbuf *deferred;   /* a chain ended inside tls_ops.send, completed by a kick */
	int deferred_result;
	bool has_deferred;
	size_t pause, resume;
	unsigned handshake_ms;
	struct perch_timer timer;
	void (*after)(void *arg);        /* perch_tls_end's: once the last ciphertext flush ended */
	void *after_arg;
	enum tls_ktls ktls;
	int ktls_ctrl_type;              /* the record type OpenSSL's next write is sent as, or -1: data */
	size_t ktls_ctrl_sent;           /* of that write, what the kernel took */
	union tls_ktls_keys ktls_keys;   /* held from the hand-over to the switch, then wiped */
	struct perch_timer ktls_retry;   /* a control record the socket had no room for */
	unsigned ktls_retry_ms;          /* its last wait (0: none since the last record sent) */
	int path;
	char path_why[160];              /* why the records take that path (perch_tls_path_reason) */
	int error;
	char reason[200];
};

/* ---- pipes/tls_ctx.c ---- */
void perch__tls_ctx_ref(struct perch_tls_ctx *ctx);
/* The client's cached session for `name`, with a reference for the caller (NULL if none). */
SSL_SESSION *perch__tls_ctx_cached(struct perch_tls_ctx *ctx, const char *name);

/* ---- pipes/tls_bio.c ---- */
/* A BIO that reads the session's ciphertext reader and writes its writer. NULL on ENOMEM. */
BIO *perch__tls_bio_new(struct perch_tls *s);
/*
 * Whether a read of OpenSSL's could only ask for ciphertext that is not
 * there: it holds no bytes, no handshake message of its own is under way,
 * and the reader has nothing new (or its read is parked). Then want_input
 * is set, as that read would have set it. Loop thread, in the engine.
 */
bool perch__tls_read_would_wait(struct perch_tls *s);

/* ---- pipes/tls_session.c ---- */
/*
 * Runs the engine now (loop thread, not inside tls_ops.send) or posts a
 * kick. Any thread; the caller holds a reference on s->plain across the
 * call that nothing the run does drops: a completion's, a posted kick's
 * (not the session's own: a continuation may free the session).
 */
void perch__tls_kick(struct perch_tls *s);
/* Posts a kick, whatever the thread. */
void perch__tls_kick_later(struct perch_tls *s);

/* ---- pipes/tls_decrypt.c (loop thread, in the engine) ---- */
/* Decrypts records into the plaintext reader until it has its fill, OpenSSL waits for ciphertext, or the session ends. */
void perch__tls_decrypt(struct perch_tls *s);

/* ---- pipes/tls_end.c (loop thread) ---- */
/* The session was freed and its last ciphertext flush ended (or its time ran out): after() runs. */
void perch__tls_run_after(struct perch_tls *s);
/* perch_tls_end's deadline passed, or could not be set: after() runs, and no flush starts now. */
void perch__tls_end_out_of_time(struct perch_tls *s);
/*
 * A kick reached a freed session: finishes a free made inside the
 * engine's run (the held chains, the ciphertext reader, the cipher side
 * unless it is ending), runs after() once the end's flush ended, and
 * disarms the timers a free off the loop's thread left.
 */
void perch__tls_freed_kicked(struct perch_tls *s);

/* ---- pipes/tls_kernel.c (loop thread) ---- */
/*
 * What kernel TLS asks of the socket: TCP_ULP "tls", TLS_TX with the
 * keys, a record of another type than data (a sendmsg with a
 * TLS_SET_RECORD_TYPE cmsg). Each returns 0 (send_ctrl: the bytes
 * taken) or a negative errno. A test plays the kernel through them.
 */
struct perch__tls_kernel_ops {
	int (*ulp)(int fd);
	int (*set_tx)(int fd, const void *keys, unsigned len);
	ssize_t (*send_ctrl)(int fd, uint8_t type, const void *buf, size_t len);
};
/* Replaces the kernel's calls (NULL: the real ones). Before any loop asks; tests only. */
void perch__tls_kernel_use(const struct perch__tls_kernel_ops *ops);
/* Before the handshake: offers the session to the kernel (the loop's probe, once) or says why not. */
void perch__tls_kernel_offer(struct perch_tls *s);
/* OpenSSL hands over its keys (BIO_CTRL_SET_KTLS): 1 when the kernel will encrypt, else 0. */
long perch__tls_kernel_keys(struct perch_tls *s, bool tx, const void *keys);
/*
 * OpenSSL writes bytes for the kernel to encrypt, once it handed its
 * keys: 0 when they are data, for the ciphertext writer as before; len
 * when they were a control record, sent; -EAGAIN when earlier bytes must
 * leave first (the engine flushes them, or a timer retries: OpenSSL
 * writes the same again); another negative errno failed the session.
 */
int perch__tls_kernel_write(struct perch_tls *s, const char *in, size_t len);
/* After the handshake: the records' path, and why. */
void perch__tls_choose_path(struct perch_tls *s);

/* ---- pipes/tls_fail.c (loop thread) ---- */
/* Fails the session with `err`; `why` (or OpenSSL's queue) is the reason. */
void perch__tls_fail(struct perch_tls *s, int err, const char *why);
/* Why the last OpenSSL call failed (not a retry, `ssl_error` its SSL_get_error): the session's failure. */
void perch__tls_fail_from_ssl(struct perch_tls *s, int ssl_error);
/* Before an OpenSSL call: empties the thread's error queue, if it holds anything, for SSL_get_error. */
void perch__tls_clear_errors(void);

/* ---- pipes/tls_engine.c (loop thread) ---- */
/* Runs the session's work until nothing is left to do now. */
void perch__tls_run(struct perch_tls *s);
/* The same, without a reference of its own: the caller holds one on s->plain across the call. */
void perch__tls_run_held(struct perch_tls *s);
/*
 * Sends close_notify and flushes it, if nothing is left to encrypt first,
 * without the rest of a run (no continuation runs); a kick does the rest.
 * Also from inside a continuation the engine runs, so that a session's
 * end sends it before its close; from one run inside OpenSSL's read (an
 * in-memory pipe's flush completed by its consumption) it only asks the
 * run to send it once that read returned.
 */
void perch__tls_close_notify_now(struct perch_tls *s);
/*
 * Freed by perch_tls_end with plaintext flushed and not yet sent, or a
 * close_notify owed: once the flush under way ended well (or at once,
 * with none), encrypts what is left, then close_notify if the writer
 * completed, and flushes it, round after round. True while a flush waits
 * (its end runs after() again); false when it is all sent, or cannot
 * be (a flush failed, the session failed): ending is then cleared.
 */
bool perch__tls_end_waits(struct perch_tls *s);

/* Ends a plaintext flush's chain: every held chain back to the core with `result` (an ending session's stay). */
void perch__tls_drop_sends(struct perch_tls *s, int result);

#endif /* PERCH_PIPES_TLS_INTERNAL_H */
