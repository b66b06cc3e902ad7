/* tests/fuzz/fuzz_split.h: the harnesses' input layout: control bytes the fuzzer mutates (split points, limits), then the stream. */
#ifndef PERCH_TESTS_FUZZ_SPLIT_H
#define PERCH_TESTS_FUZZ_SPLIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_MAX_CHUNKS 16

/*
 * An input is: a byte n (mod FUZZ_MAX_CHUNKS: how many split points), n
 * bytes of chunk lengths (each b means b + 1 bytes), `nknobs` knob bytes
 * for the harness, then the stream. Missing bytes read as 0. The chunks cut
 * the stream at those points; the last chunk is whatever remains.
 */
struct fuzz_input {
	const uint8_t *data;         /* the stream */
	size_t len;
	size_t ends[FUZZ_MAX_CHUNKS + 1]; /* each chunk's end offset, increasing, the last len */
	size_t nchunks;
	const uint8_t *knobs;        /* nknobs bytes, zero-padded */
	uint8_t knob_buf[16];
};

static inline uint8_t fuzz_byte(const uint8_t **p, size_t *left)
{
	if (*left == 0)
		return 0;
	(*left)--;
	return *(*p)++;
}

/* Splits raw[0..n) as described; nknobs <= 16. */
static inline void fuzz_input_split(struct fuzz_input *in, const uint8_t *raw, size_t n, size_t nknobs)
{
	size_t splits = fuzz_byte(&raw, &n) % FUZZ_MAX_CHUNKS, lens[FUZZ_MAX_CHUNKS];
	for (size_t i = 0; i < splits; i++)
		lens[i] = (size_t)fuzz_byte(&raw, &n) + 1;
	memset(in->knob_buf, 0, sizeof(in->knob_buf));
	for (size_t i = 0; i < nknobs; i++)
		in->knob_buf[i] = fuzz_byte(&raw, &n);
	in->knobs = in->knob_buf;
	in->data = raw;
	in->len = n;
	size_t at = 0;
	in->nchunks = 0;
	for (size_t i = 0; i < splits && at + lens[i] < n; i++) {
		at += lens[i];
		in->ends[in->nchunks++] = at;
	}
	in->ends[in->nchunks++] = n;
}

/* A heap copy of p[0..n) of exactly n bytes, so that ASan sees a read past the end. */
static inline char *fuzz_exact_copy(const uint8_t *p, size_t n)
{
	char *c = malloc(n ? n : 1);
	if (!c)
		abort();
	if (n)
		memcpy(c, p, n);
	return c;
}

/* A growing log of what a run saw, compared byte for byte between two runs. */
struct fuzz_log {
	uint8_t *p;
	size_t len, cap;
};

static inline void fuzz_log_put(struct fuzz_log *l, const void *p, size_t n)
{
	if (l->cap - l->len < n) {
		size_t cap = l->cap ? l->cap : 256;
		while (cap - l->len < n)
			cap *= 2;
		uint8_t *q = realloc(l->p, cap);
		if (!q)
			abort();
		l->p = q;
		l->cap = cap;
	}
	memcpy(l->p + l->len, p, n);
	l->len += n;
}

static inline void fuzz_log_num(struct fuzz_log *l, uint64_t v)
{
	fuzz_log_put(l, &v, sizeof(v));
}

/* Aborts (a finding) unless the two logs are equal; then frees both. */
static inline void fuzz_log_same(struct fuzz_log *a, struct fuzz_log *b)
{
	if (a->len != b->len || (a->len && memcmp(a->p, b->p, a->len) != 0))
		abort();
	free(a->p);
	free(b->p);
	*a = *b = (struct fuzz_log){ 0 };
}

/*
 * One parse of in->data[pos..avail), logging what it found: returns the
 * message's length to parse on after it, 0 when it needs more bytes, -1
 * when nothing after it is read (an error, a last message).
 */
typedef long (*fuzz_parse_fn)(const struct fuzz_input *in, size_t pos, size_t avail, const void *lim,
			      struct fuzz_log *l);

/* Parses the pipelined stream, the bytes arriving up to each chunk end in turn (whole: all at once). */
static inline void fuzz_stream(const struct fuzz_input *in, bool whole, fuzz_parse_fn parse, const void *lim,
			       struct fuzz_log *l)
{
	size_t pos = 0;
	for (size_t k = whole ? in->nchunks - 1 : 0; k < in->nchunks; k++) {
		long n = 0;
		while (pos < in->ends[k] && (n = parse(in, pos, in->ends[k], lim, l)) > 0)
			pos += (size_t)n;
		if (n < 0)
			return;
	}
	fuzz_log_num(l, 0); /* waiting for more at the end */
	fuzz_log_num(l, pos);
}

/* The oracle: the stream parsed in its chunks logs exactly what it logs parsed whole; aborts if not. */
static inline void fuzz_whole_equals_split(const struct fuzz_input *in, fuzz_parse_fn parse, const void *lim)
{
	struct fuzz_log whole = { 0 }, split = { 0 };
	fuzz_stream(in, true, parse, lim, &whole);
	fuzz_stream(in, false, parse, lim, &split);
	fuzz_log_same(&whole, &split);
}

#endif /* PERCH_TESTS_FUZZ_SPLIT_H */
