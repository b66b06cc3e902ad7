/* examples/resp/resp_store.c: a chained hash map of binary-safe strings, and the PING/ECHO/SET/GET/DEL/INCR command table over it. */
#include "resp_store.h"

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "siphash.h"

/* ---- the map ---- */

struct entry {
	struct entry *next;
	uint64_t hash;
	size_t klen, vlen, vcap;
	char *val;
	char key[];
};

/*
 * A value's memory, counted: the store holds one reference, and a GET
 * answered by reference (resp_store_value_get) holds one until its send
 * released it, so an overwrite or a DEL meanwhile never frees bytes the
 * kernel still reads. Counted atomically: the release runs on a loop
 * thread, outside the store's lock.
 */
struct value {
	uint32_t refs;
	char data[];
};

static struct value *value_of(const char *data)
{
	return (struct value *)(void *)(data - offsetof(struct value, data));
}

static char *value_new(size_t cap)
{
	struct value *v = malloc(sizeof(*v) + (cap ? cap : 1));
	if (!v)
		return NULL;
	v->refs = 1;
	return v->data;
}

void resp_store_value_get(const char *val)
{
	__atomic_add_fetch(&value_of(val)->refs, 1, __ATOMIC_RELAXED);
}

void resp_store_value_put(const char *val)
{
	if (val && __atomic_sub_fetch(&value_of(val)->refs, 1, __ATOMIC_ACQ_REL) == 0)
		free(value_of(val));
}

/* Whether only the store holds the value: it may be overwritten in place. */
static bool value_unshared(const char *val)
{
	return __atomic_load_n(&value_of(val)->refs, __ATOMIC_ACQUIRE) == 1;
}

struct resp_store {
	struct entry **buckets;
	size_t nbuckets;  /* a power of two */
	size_t count;
	struct siphash_key key;  /* secret, drawn when the store is made */
};

/*
 * Keys come from clients, so the hash is keyed: with an unkeyed one (FNV-1a
 * here before) a client can choose keys that share a bucket, and 131,072 of
 * them turned every SET into a walk of one chain (14.4 s of CPU).
 */
static uint64_t hash_key(const struct resp_store *s, const char *k, size_t n)
{
	return siphash24(&s->key, k, n);
}

/* Fills key from getrandom(2). Returns 0 or -errno (ENOSYS on kernels before 3.17). */
static int draw_key(struct siphash_key *key)
{
	size_t got = 0;
	while (got < sizeof(key->b)) {
		ssize_t n = getrandom(key->b + got, sizeof(key->b) - got, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO; /* not in its contract; never loop on it */
		got += (size_t)n;
	}
	return 0;
}

int resp_store_new(struct resp_store **out)
{
	struct resp_store *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	int rc = draw_key(&s->key);
	if (rc < 0) {
		free(s);
		return rc;
	}
	s->nbuckets = 1024;
	s->buckets = calloc(s->nbuckets, sizeof(*s->buckets));
	if (!s->buckets) {
		free(s);
		return -ENOMEM;
	}
	*out = s;
	return 0;
}

void resp_store_free(struct resp_store *s)
{
	if (!s)
		return;
	for (size_t b = 0; b < s->nbuckets; b++) {
		for (struct entry *e = s->buckets[b], *next; e; e = next) {
			next = e->next;
			resp_store_value_put(e->val);
			free(e);
		}
	}
	free(s->buckets);
	free(s);
}

size_t resp_store_count(const struct resp_store *s)
{
	return s->count;
}

size_t resp_store_longest_chain(const struct resp_store *s)
{
	size_t longest = 0;
	for (size_t b = 0; b < s->nbuckets; b++) {
		size_t n = 0;
		for (const struct entry *e = s->buckets[b]; e; e = e->next)
			n++;
		if (n > longest)
			longest = n;
	}
	return longest;
}

/* The link that points at key's entry (or at the NULL ending its chain). */
static struct entry **find(const struct resp_store *s, const char *key, size_t klen, uint64_t h)
{
	struct entry **link = &s->buckets[h & (s->nbuckets - 1)];
	for (; *link; link = &(*link)->next)
		if ((*link)->hash == h && (*link)->klen == klen && memcmp((*link)->key, key, klen) == 0)
			break;
	return link;
}

/* Doubles the table when keys outnumber buckets; a failed grow only costs longer chains. */
static void maybe_grow(struct resp_store *s)
{
	if (s->count < s->nbuckets)
		return;
	size_t n = s->nbuckets * 2;
	struct entry **nb = calloc(n, sizeof(*nb));
	if (!nb)
		return;
	for (size_t b = 0; b < s->nbuckets; b++) {
		for (struct entry *e = s->buckets[b], *next; e; e = next) {
			next = e->next;
			e->next = nb[e->hash & (n - 1)];
			nb[e->hash & (n - 1)] = e;
		}
	}
	free(s->buckets);
	s->buckets = nb;
	s->nbuckets = n;
}

/* Stores val into e, reusing its memory when it fits and no send still reads it. */
static int put_value(struct entry *e, const char *val, size_t vlen)
{
	if (!e->val || vlen > e->vcap || !value_unshared(e->val)) {
		char *v = value_new(vlen);
		if (!v)
			return -ENOMEM;
		resp_store_value_put(e->val);
		e->val = v;
		e->vcap = vlen;
	}
	memcpy(e->val, val, vlen);
	e->vlen = vlen;
	return 0;
}

int resp_store_set(struct resp_store *s, const char *key, size_t klen, const char *val, size_t vlen)
{
	uint64_t h = hash_key(s, key, klen);
	struct entry **link = find(s, key, klen, h);
	if (*link)
		return put_value(*link, val, vlen);
	struct entry *e = calloc(1, sizeof(*e) + klen);
	if (!e)
		return -ENOMEM;
	if (put_value(e, val, vlen) < 0) {
		free(e);
		return -ENOMEM;
	}
	e->hash = h;
	e->klen = klen;
	memcpy(e->key, key, klen);
	*link = e;
	s->count++;
	maybe_grow(s);
	return 0;
}

const char *resp_store_get(const struct resp_store *s, const char *key, size_t klen, size_t *vlen)
{
	struct entry *e = *find(s, key, klen, hash_key(s, key, klen));
	if (!e)
		return NULL;
	*vlen = e->vlen;
	return e->val;
}

int resp_store_del(struct resp_store *s, const char *key, size_t klen)
{
	struct entry **link = find(s, key, klen, hash_key(s, key, klen));
	struct entry *e = *link;
	if (!e)
		return 0;
	*link = e->next;
	resp_store_value_put(e->val);
	free(e);
	s->count--;
	return 1;
}

int resp_store_incr(struct resp_store *s, const char *key, size_t klen, int64_t by, int64_t *out)
{
	size_t vlen;
	long long cur = 0;
	const char *v = resp_store_get(s, key, klen, &vlen);
	if (v && !resp_parse_ll(v, vlen, &cur))
		return -EINVAL;
	if ((by > 0 && cur > INT64_MAX - by) || (by < 0 && cur < INT64_MIN - by))
		return -ERANGE;
	char num[24];
	int n = snprintf(num, sizeof(num), "%lld", cur + (long long)by);
	int rc = resp_store_set(s, key, klen, num, (size_t)n);
	if (rc == 0)
		*out = cur + by;
	return rc;
}

/* ---- replies: staged on the writer as they are made ---- */

static int put(struct perch_pipe_writer *o, const char *s, size_t n)
{
	return perch_pipe_write(o, s, n);
}

#define PUT_LIT(o, lit) put((o), (lit), sizeof(lit) - 1)

/* ":<n>\r\n" */
static int reply_int(struct perch_pipe_writer *o, long long n)
{
	char b[32];
	return put(o, b, (size_t)snprintf(b, sizeof(b), ":%lld\r\n", n));
}

/* "$<len>\r\n<bytes>\r\n" */
static int reply_bulk(struct perch_pipe_writer *o, const char *p, size_t n)
{
	char b[32];
	int rc = put(o, b, (size_t)snprintf(b, sizeof(b), "$%zu\r\n", n));
	if (rc == 0)
		rc = put(o, p, n);
	return rc ? rc : PUT_LIT(o, "\r\n");
}

/* An error line may not hold CR or LF: they become spaces, as redis does. */
int resp_reply_error(struct perch_pipe_writer *w, const char *msg)
{
	size_t n = strlen(msg), len;
	uint8_t *p;
	int rc = perch_pipe_get_buffer(w, n + 7, &p, &len);
	if (rc != 0)
		return rc;
	assert(len >= n + 7);
	memcpy(p, "-ERR ", 5);
	for (size_t i = 0; i < n; i++)
		p[5 + i] = msg[i] == '\r' || msg[i] == '\n' ? ' ' : (uint8_t)msg[i];
	memcpy(p + 5 + n, "\r\n", 2);
	return perch_pipe_advance(w, n + 7);
}

/* ---- commands ---- */

static bool arg_is(struct resp_arg a, const char *name)
{
	return a.len == strlen(name) && strncasecmp(a.p, name, a.len) == 0;
}

typedef int (*cmd_fn)(struct resp_store *s, const struct resp_cmd *c, struct perch_pipe_writer *o);

static int cmd_ping(struct resp_store *s, const struct resp_cmd *c, struct perch_pipe_writer *o)
{
	return c->argc == 1 ? PUT_LIT(o, "+PONG\r\n") : reply_bulk(o, c->argv[1].p, c->argv[1].len);
}

static int cmd_echo(struct resp_store *s, const struct resp_cmd *c, struct perch_pipe_writer *o)
{
	return reply_bulk(o, c->argv[1].p, c->argv[1].len);
}

/* SET key value; the options (EX, PX, NX, XX, GET, KEEPTTL) are not implemented. */
static int cmd_set(struct resp_store *s, const struct resp_cmd *c, struct perch_pipe_writer *o)
{
	if (c->argc != 3)
		return resp_reply_error(o, "syntax error");
	if (resp_store_set(s, c->argv[1].p, c->argv[1].len, c->argv[2].p, c->argv[2].len) < 0)
		return -ENOMEM;
	return PUT_LIT(o, "+OK\r\n");
}

size_t resp_reply_ref_min = RESP_REPLY_REF_MIN;

static void value_sent(void *arg, const void *data, size_t len)
{
	resp_store_value_put(data);
}

/* "$<len>\r\n<bytes>\r\n", the bytes staged by reference: the store's value, held until its send is done. */
static int reply_bulk_ref(struct perch_pipe_writer *o, const char *v, size_t n)
{
	char b[32];
	int rc = put(o, b, (size_t)snprintf(b, sizeof(b), "$%zu\r\n", n));
	if (rc != 0)
		return rc;
	resp_store_value_get(v);
	rc = perch_pipe_write_ref(o, v, n, value_sent, NULL);
	if (rc != 0) {
		resp_store_value_put(v); /* refused: nothing staged, no release will come */
		return rc;
	}
	return PUT_LIT(o, "\r\n");
}

static int cmd_get(struct resp_store *s, const struct resp_cmd *c, struct perch_pipe_writer *o)
{
	size_t n;
	const char *v = resp_store_get(s, c->argv[1].p, c->argv[1].len, &n);
	if (!v)
		return PUT_LIT(o, "$-1\r\n");
	return n >= resp_reply_ref_min ? reply_bulk_ref(o, v, n) : reply_bulk(o, v, n);
}

static int cmd_del(struct resp_store *s, const struct resp_cmd *c, struct perch_pipe_writer *o)
{
	long long n = 0;
	for (size_t i = 1; i < c->argc; i++)
		n += resp_store_del(s, c->argv[i].p, c->argv[i].len);
	return reply_int(o, n);
}

static int cmd_incr(struct resp_store *s, const struct resp_cmd *c, struct perch_pipe_writer *o)
{
	int64_t v;
	int rc = resp_store_incr(s, c->argv[1].p, c->argv[1].len, 1, &v);
	if (rc == -EINVAL)
		return resp_reply_error(o, "value is not an integer or out of range");
	if (rc == -ERANGE)
		return resp_reply_error(o, "increment or decrement would overflow");
	return rc < 0 ? rc : reply_int(o, v);
}

/* CONFIG GET and COMMAND: nothing to tell, which clients take as "use your defaults". */
static int cmd_empty_array(struct resp_store *s, const struct resp_cmd *c, struct perch_pipe_writer *o)
{
	return PUT_LIT(o, "*0\r\n");
}

/* arity as redis writes it: N exactly, -N at least N (the name counts). */
static const struct command {
	const char *name;
	int arity;
	cmd_fn fn;
} commands[] = {
	{ "ping", -1, cmd_ping },  { "echo", 2, cmd_echo }, { "set", -3, cmd_set },
	{ "get", 2, cmd_get },     { "del", -2, cmd_del },  { "incr", 2, cmd_incr },
	{ "config", -2, cmd_empty_array }, { "command", -1, cmd_empty_array },
};

/* redis's words: "unknown command 'x', with args beginning with: 'a' 'b' ", the args cut near 128 bytes. */
static int reply_unknown(const struct resp_cmd *c, struct perch_pipe_writer *o)
{
	char args[256], msg[512];
	size_t al = 0;
	args[0] = '\0';
	for (size_t i = 1; i < c->argc && al < 128; i++) {
		int room = (int)(128 - al);
		int len = c->argv[i].len < (size_t)room ? (int)c->argv[i].len : room;
		al += (size_t)snprintf(args + al, sizeof(args) - al, "'%.*s' ", len, c->argv[i].p);
	}
	snprintf(msg, sizeof(msg), "unknown command '%.*s', with args beginning with: %s",
		 (int)(c->argv[0].len > 128 ? 128 : c->argv[0].len), c->argv[0].p, args);
	return resp_reply_error(o, msg);
}

int resp_execute(struct resp_store *s, const struct resp_cmd *c, struct perch_pipe_writer *out)
{
	if (c->argc == 0)
		return 0;
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		const struct command *k = &commands[i];
		if (!arg_is(c->argv[0], k->name))
			continue;
		if ((k->arity > 0 && c->argc != (size_t)k->arity) ||
		    (k->arity < 0 && c->argc < (size_t)-k->arity) || (k->fn == cmd_ping && c->argc > 2)) {
			char msg[64];
			snprintf(msg, sizeof(msg), "wrong number of arguments for '%s' command", k->name);
			return resp_reply_error(out, msg);
		}
		return k->fn(s, c, out);
	}
	return reply_unknown(c, out);
}
