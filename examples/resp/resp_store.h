/* examples/resp/resp_store.h: the RESP example's key space (binary-safe strings in a chained hash map) and its command table. */
#ifndef PERCH_EXAMPLES_RESP_STORE_H
#define PERCH_EXAMPLES_RESP_STORE_H

#include <stddef.h>
#include <stdint.h>

#include <perch.h>

#include "resp_parse.h"

/* Not thread-safe: one store per loop thread, or a lock around each call, is the caller's choice. */
struct resp_store;

/*
 * Makes an empty store with a secret hash key of its own from getrandom(2),
 * so clients cannot choose keys that collide. Returns 0 with *out, -ENOMEM,
 * or getrandom's error (-ENOSYS: the kernel has none; then no store).
 */
int resp_store_new(struct resp_store **out);
/* Frees the store and every key in it; NULL is ignored. */
void resp_store_free(struct resp_store *s);

/* Number of keys. */
size_t resp_store_count(const struct resp_store *s);
/* The most keys any one bucket holds (walks the whole table: for tests and diagnostics). */
size_t resp_store_longest_chain(const struct resp_store *s);
/* Sets key to value (copies both). Returns 0 or -ENOMEM (then the old value stays). */
int resp_store_set(struct resp_store *s, const char *key, size_t klen, const char *val, size_t vlen);
/* The value of key (valid until the next change of that key), *vlen set; NULL when absent. */
const char *resp_store_get(const struct resp_store *s, const char *key, size_t klen, size_t *vlen);
/*
 * Takes a reference on a value resp_store_get returned: its bytes then stay
 * valid (a later SET of the key writes a new value, a DEL leaves them)
 * until resp_store_value_put drops it. Under the store's lock, as the get;
 * the put may come from any thread.
 */
void resp_store_value_get(const char *val);
/* Drops a reference resp_store_value_get took; the last frees the bytes. Any thread; NULL is ignored. */
void resp_store_value_put(const char *val);
/* Removes key. Returns 1 if it was there, 0 if not. */
int resp_store_del(struct resp_store *s, const char *key, size_t klen);
/*
 * Adds `by` to the integer held at key (absent: 0) and stores the result as
 * decimal. Returns 0 with *out; -EINVAL when the value is not a 64-bit
 * integer as redis reads one; -ERANGE when the sum would overflow; -ENOMEM.
 */
int resp_store_incr(struct resp_store *s, const char *key, size_t klen, int64_t by, int64_t *out);

/*
 * Runs one parsed command against the store and stages its RESP2 reply on
 * w, once: a GET's value is copied from the store into the writer's staged
 * bytes and nowhere else. PING [msg], ECHO msg, SET key value, GET key,
 * DEL key [key ...], INCR key, plus CONFIG GET and COMMAND answered with an
 * empty array (what redis-benchmark and redis-cli ask first). Unknown
 * commands, wrong arity and SET options get redis's error replies. argc 0
 * stages nothing. Returns 0, -ENOMEM, or what perch_pipe_write returns
 * (-EBUSY while a flush waits, -EPIPE).
 */
int resp_execute(struct resp_store *s, const struct resp_cmd *cmd, struct perch_pipe_writer *w);

/*
 * A GET's value at least this long is staged by reference (sent from the
 * store's memory, held until its send is done); a shorter one is copied.
 * RESP_REPLY_REF_MIN by default; SIZE_MAX copies every value. Set it
 * before the server starts.
 */
extern size_t resp_reply_ref_min;
#define RESP_REPLY_REF_MIN (16u << 10)

/* Stages "-ERR <msg>\r\n" (a protocol error from resp_parse, say). Returns as resp_execute. */
int resp_reply_error(struct perch_pipe_writer *w, const char *msg);

#endif /* PERCH_EXAMPLES_RESP_STORE_H */
