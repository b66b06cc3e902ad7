/* examples/resp/siphash.c: SipHash-2-4, written from the paper's specification (Aumasson and Bernstein, 2012). */
#include "siphash.h"

#include <endian.h>
#include <string.h>

/* The bytes p[0..n) as a little-endian word; n <= 8. memcpy: no alignment assumed, one load when n is 8. */
static inline uint64_t load_le(const uint8_t *p, size_t n)
{
	uint8_t b[8] = {0};
	memcpy(b, p, n);
	uint64_t w;
	memcpy(&w, b, sizeof(w));
	return le64toh(w);
}

static inline uint64_t rotl(uint64_t x, unsigned b)
{
	return (x << b) | (x >> (64 - b));
}

/* The state: four words, kept in registers (the rounds are inlined). */
struct sip {
	uint64_t v0, v1, v2, v3;
};

/* One SipRound: the ARX network of the paper's figure 2.1. */
static inline __attribute__((always_inline)) void sipround(struct sip *s)
{
	s->v0 += s->v1;
	s->v1 = rotl(s->v1, 13);
	s->v1 ^= s->v0;
	s->v0 = rotl(s->v0, 32);
	s->v2 += s->v3;
	s->v3 = rotl(s->v3, 16);
	s->v3 ^= s->v2;
	s->v0 += s->v3;
	s->v3 = rotl(s->v3, 21);
	s->v3 ^= s->v0;
	s->v2 += s->v1;
	s->v1 = rotl(s->v1, 17);
	s->v1 ^= s->v2;
	s->v2 = rotl(s->v2, 32);
}

/* c = 2 rounds per message word. */
static inline __attribute__((always_inline)) void compress(struct sip *s, uint64_t m)
{
	s->v3 ^= m;
	sipround(s);
	sipround(s);
	s->v0 ^= m;
}

uint64_t siphash24(const struct siphash_key *key, const void *msg, size_t len)
{
	const uint8_t *p = msg;
	uint64_t k0 = load_le(key->b, 8), k1 = load_le(key->b + 8, 8);
	/* Initialization: the key xored with the constants "somepseudorandomlygeneratedbytes". */
	struct sip s = {
		k0 ^ 0x736f6d6570736575ull,
		k1 ^ 0x646f72616e646f6dull,
		k0 ^ 0x6c7967656e657261ull,
		k1 ^ 0x7465646279746573ull,
	};
	size_t whole = len - len % 8;
	for (size_t i = 0; i < whole; i += 8)
		compress(&s, load_le(p + i, 8));
	/* The last word: the 0..7 remaining bytes, and len mod 256 in its top byte (p may be NULL at len 0). */
	uint64_t last = len % 8 ? load_le(p + whole, len % 8) : 0;
	compress(&s, last | ((uint64_t)(len & 0xff) << 56));
	/* Finalization: d = 4 rounds. */
	s.v2 ^= 0xff;
	sipround(&s);
	sipround(&s);
	sipround(&s);
	sipround(&s);
	return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}
