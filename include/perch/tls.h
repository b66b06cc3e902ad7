/* perch/tls.h: TLS (OpenSSL 3) between a ciphertext pipe pair and a plaintext one with the same API. */
#ifndef PERCH_TLS_H
#define PERCH_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include <perch/common.h>
#include <perch/loop.h>
#include <perch/pipe.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * A TLS session takes a ciphertext reader and writer (over a connection,
 * or an in-memory pipe) and hands back a plaintext reader and writer used
 * with the very calls of pipe.h: a protocol written for plain pipes runs
 * over TLS unchanged, and a parked plaintext read or flush is one
 * continuation registration, as on a connection. OpenSSL reads the
 * ciphertext from the received segments and writes its records into the
 * ciphertext writer's staging buffers (a BIO over the pipes, no memory
 * BIO). The session's own work (handshake, decrypt, encrypt) runs on its
 * loop's thread; the plaintext ends may be used from any thread, as any
 * pipe's. Built in when configure finds OpenSSL 3 (doc/tls.md); in a
 * perch built without it, perch_tls_ctx_new and perch_tls_new return
 * -EOPNOTSUPP and say so.
 */
struct perch_tls_ctx;
struct perch_tls;

#define PERCH_TLS_SERVER 0
#define PERCH_TLS_CLIENT 1

/* Peer verification; 0 is the role's default (a client verifies, a server asks for no certificate). */
#define PERCH_TLS_VERIFY_DEFAULT 0
#define PERCH_TLS_VERIFY_NONE    1   /* a client accepts any certificate: tests only */
#define PERCH_TLS_VERIFY_PEER    2   /* a client checks the server's; a server asks for the client's */
#define PERCH_TLS_VERIFY_REQUIRE 3   /* as PEER, and a server refuses a client without one */

/*
 * A server's choice of context for the name a client asked for (SNI),
 * on the loop's thread during the handshake: set *use (a context of the
 * server role; the session keeps its own reference) and return 0, or
 * return -ENOENT to keep the session's context, or another negative errno
 * to fail the handshake (the client gets an unrecognized_name alert).
 */
typedef int (*perch_tls_sni_fn)(void *arg, const char *server_name, struct perch_tls_ctx **use);

/* What a context is made of; zeroed means every default. Strings are copied. */
struct perch_tls_ctx_opts {
	int role;                  /* PERCH_TLS_SERVER or PERCH_TLS_CLIENT */
	const char *cert_file;     /* PEM certificate chain, leaf first (a server needs one) */
	const char *key_file;      /* PEM private key of the leaf */
	const char *cert_pem;      /* the chain in memory (NUL-terminated PEM), instead of cert_file */
	const char *key_pem;       /* the key in memory, instead of key_file */
	const char *ca_file;       /* PEM CAs to verify the peer with */
	const char *ca_dir;        /* a hashed CA directory (c_rehash), with or instead of ca_file */
	int verify;                /* PERCH_TLS_VERIFY_*; a client without a CA uses the system's */
	const char *alpn;          /* protocols, comma-separated, preferred first ("h2,http/1.1") */
	bool no_tickets;           /* no session resumption (tickets are on by default) */
	perch_tls_sni_fn sni;      /* a server's context chooser, or NULL */
	void *sni_arg;
};

/*
 * Makes a context (TLS 1.2 at least, renegotiation refused). Returns 0
 * with *out set; -EINVAL (NULL out, a bad role or verify, a server without
 * a certificate, an ALPN name empty or over 255 bytes, a certificate or key
 * that does not load or match), -ENOENT (a file that is not there; another
 * errno of stat(2) as it came), -ENOMEM. On failure `why` (when not NULL)
 * gets a line saying what was wrong, with OpenSSL's reason. Any thread.
 * It empties the thread's OpenSSL error queue, as the engine's runs on
 * the loop's thread may (perch_tls_new's first step is one): save what
 * is queued first.
 */
PERCH_API int perch_tls_ctx_new(const struct perch_tls_ctx_opts *opts, struct perch_tls_ctx **out,
				char *why, size_t why_len);

/* Drops the caller's reference: sessions keep theirs. NULL is ignored. Any thread. */
PERCH_API void perch_tls_ctx_free(struct perch_tls_ctx *ctx);

/* Options of one session; zeroed (or NULL) means every default. */
struct perch_tls_opts {
	/*
	 * A client's SNI and the name its peer's certificate must bear; an
	 * address (numeric IPv4 or IPv6) is checked against the
	 * certificate's IP names instead, and sends no SNI.
	 */
	const char *server_name;
	unsigned handshake_ms;     /* the handshake's deadline; 0: 10 s */
	size_t pause_bytes;        /* decrypted bytes unread at which decryption pauses; 0: 64 KiB */
};

/* The error a plaintext read reports for a stream that ended without close_notify (truncation). */
#define PERCH_TLS_TRUNCATED (-ECONNABORTED)

/*
 * Starts a session over `cipher_r` and `cipher_w`, which it takes (freed
 * by perch_tls_free, also when this fails), and begins the handshake on
 * `loop`'s thread. Returns 0 with *out set; -EINVAL (a NULL, a client
 * context without server_name while it verifies, a server_name empty or
 * over 255 bytes); -ENOMEM. On the loop's
 * thread, or any thread while the loop is not running. On the loop's
 * thread the handshake's first step runs inside this call, after *out is
 * set: over an in-memory pipe a continuation of the peer's may run there
 * too, and if it frees the session (through *out), the 0 returned comes
 * after that free.
 *
 * A failed handshake, a peer's protocol error, or a timeout reaches the
 * plaintext reader as a result with `error` set: -EPROTO (perch_tls_error
 * says OpenSSL's reason: "http request" for plaintext to a TLS port, a
 * failed certificate check, no shared cipher), -ETIMEDOUT (the deadline),
 * PERCH_TLS_TRUNCATED, or the ciphertext side's own error; a pending
 * plaintext flush then fails with the same error, and a later one with
 * -EPIPE. A peer's close_notify is the reader's `completed`.
 */
PERCH_API int perch_tls_new(struct perch_tls_ctx *ctx, struct perch_loop *loop,
			    struct perch_pipe_reader *cipher_r, struct perch_pipe_writer *cipher_w,
			    const struct perch_tls_opts *opts, struct perch_tls **out);

/*
 * The plaintext ends, owned by the session (do not free them): read and
 * write them as any pipe's, from any thread. Bytes written before the
 * handshake completes leave after it. perch_pipe_writer_complete on the
 * writer sends close_notify after what was flushed. NULL for a NULL session.
 */
PERCH_API struct perch_pipe_reader *perch_tls_reader(struct perch_tls *t);
PERCH_API struct perch_pipe_writer *perch_tls_writer(struct perch_tls *t);

/*
 * Ends the session: a parked plaintext read is taken back (its task
 * completes with -ECANCELED) and a parked flush fails (-EPIPE), both
 * inside this call, and both pairs are
 * freed. No close_notify is sent by this call: flush what was written,
 * then complete the plaintext writer (close_notify follows what was
 * flushed). On the loop's thread, or any thread while the loop is not
 * running (the caller's own synchronisation, a join or a lock, orders
 * the call before the loop's next turn): the session's memory then waits
 * for that turn (or perch_loop_free), which disarms its timers. NULL is
 * ignored. On the kernel's path
 * (perch_tls_path), a control record still waiting for room in the
 * socket (a close_notify to a peer that stopped reading) is dropped.
 * `t` is gone after this call, as memory after free(): call neither this
 * nor perch_tls_end on it again.
 */
PERCH_API void perch_tls_free(struct perch_tls *t);

/* How long perch_tls_end waits at most for the last ciphertext flush. */
#define PERCH_TLS_END_MS 1000u

/*
 * perch_tls_free, then after(arg) on the loop's thread once the
 * ciphertext flush still under way (the close_notify a completed
 * plaintext writer sent, say) ended, at once when none is, or
 * PERCH_TLS_END_MS later at most: close the connection in after(), so
 * that the close comes after close_notify, not over it (a close cancels
 * an io_uring send in flight). What the plaintext writer flushed and the
 * session had not sent yet (a flush waiting behind the one under way)
 * is encrypted and flushed first, then the close_notify a completed
 * writer asked for, all within PERCH_TLS_END_MS; what is left then, or
 * after a flush failed, is dropped, with no close_notify. An end before
 * the handshake completed sends none of it (the handshake is not
 * finished for it). Flush before completing the writer: the completion
 * drops bytes written and not flushed.
 *
 * The plaintext ends are gone at once: their waiting flush completes
 * with -EPIPE, even if its bytes are sent. after(arg) may run inside
 * this call. On the loop's thread only (unlike perch_tls_free), where
 * after() and the end's flushes run. NULL is ignored (after is not
 * called); `t` is gone after this call, as perch_tls_free says. On the
 * kernel's path a control record is sent by a sendmsg of its own, not a
 * flush: one still waiting for room is dropped, as perch_tls_free says.
 * A NULL after makes it perch_tls_free.
 */
PERCH_API void perch_tls_end(struct perch_tls *t, void (*after)(void *arg), void *arg);

/* After the handshake (loop thread, or once it completed): what was agreed. NULL before it. */
PERCH_API const char *perch_tls_alpn(const struct perch_tls *t);
PERCH_API const char *perch_tls_version(const struct perch_tls *t);
PERCH_API const char *perch_tls_cipher(const struct perch_tls *t);
/* Whether the handshake resumed an earlier session (a ticket). */
PERCH_API bool perch_tls_resumed(const struct perch_tls *t);
/* Whether the handshake completed. */
PERCH_API bool perch_tls_established(const struct perch_tls *t);

#define PERCH_TLS_PATH_USERSPACE 0   /* OpenSSL encrypts and decrypts */
#define PERCH_TLS_PATH_KERNEL_TX 1   /* the kernel encrypts (kTLS); OpenSSL decrypts */
#define PERCH_TLS_PATH_KERNEL    2   /* the kernel does both (not taken yet: OpenSSL decrypts) */

/*
 * How records move: the session's path (PERCH_TLS_PATH_*) once the
 * handshake completed, and why, in one line. A loop asks the kernel once
 * whether it takes TLS (TCP_ULP "tls" on a loopback pair it makes for the
 * question); a session over a socket offers it its records, and where
 * OpenSSL hands over write keys of a cipher the kernel takes (AES-GCM
 * 128/256, AES-CCM 128, ChaCha20-Poly1305), the path is
 * PERCH_TLS_PATH_KERNEL_TX: the kernel gets the keys before the session's
 * next byte leaves and encrypts all it sends, while OpenSSL still
 * decrypts. A kernel that refuses the keys then fails the session
 * (perch_tls_error). The reason reads "kernel: the kernel encrypts
 * (TLS_TX), OpenSSL decrypts", or "userspace: " and why not ("the kernel
 * refused TCP_ULP \"tls\" (No such file or directory: no CONFIG_TLS)",
 * "the ciphertext is not a socket's", ...: doc/tls.md lists them).
 * Before the handshake completed, and for NULL: PERCH_TLS_PATH_USERSPACE
 * and a NULL reason. Loop thread, or once the handshake completed.
 */
PERCH_API int perch_tls_path(const struct perch_tls *t);
PERCH_API const char *perch_tls_path_reason(const struct perch_tls *t);

/*
 * Why the session failed, as one line (OpenSSL's reason, the certificate
 * check's verdict, a timeout), into `buf`; returns the session's error
 * (0 while it has none). Loop thread, or after the failure was read.
 */
PERCH_API int perch_tls_error(const struct perch_tls *t, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* PERCH_TLS_H */
