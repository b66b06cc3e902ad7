/* examples/resp/siphash.c: SipHash-2-4, written from the paper's specification (Aumasson and Bernstein, 2012). */
#include "siphash.h"

/* The bytes p[0..n) as a little-endian word; n <= 8. Byte by byte: no alignment or endianness assumed. */
static uint64_t load_le(const uint8_t *p, size_t n)
{
	uint64_t w = 0;
	for (size_t i = 0; i < n; i++)
		w |= (uint64_t)p[i] << (8 * i);
	return w;
}

static uint64_t rotl(uint64_t x, unsigned b)
{
	return (x << b) | (x >> (64 - b));
}

/* One SipRound: the ARX network of the paper's figure 2.1. */
static void sipround(uint64_t v[4])
{
	v[0] += v[1];
	v[1] = rotl(v[1], 13);
	v[1] ^= v[0];
	v[0] = rotl(v[0], 32);
	v[2] += v[3];
	v[3] = rotl(v[3], 16);
	v[3] ^= v[2];
	v[0] += v[3];
	v[3] = rotl(v[3], 21);
	v[3] ^= v[0];
	v[2] += v[1];
	v[1] = rotl(v[1], 17);
	v[1] ^= v[2];
	v[2] = rotl(v[2], 32);
}

/* c = 2 rounds per message word. */
static void compress(uint64_t v[4], uint64_t m)
{
	v[3] ^= m;
	sipround(v);
	sipround(v);
	v[0] ^= m;
}

uint64_t siphash24(const struct siphash_key *key, const void *msg, size_t len)
{
	const uint8_t *p = msg;
	uint64_t k0 = load_le(key->b, 8), k1 = load_le(key->b + 8, 8);
	/* Initialization: the key xored with the constants "somepseudorandomlygeneratedbytes". */
	uint64_t v[4] = {
		k0 ^ 0x736f6d6570736575ull,
		k1 ^ 0x646f72616e646f6dull,
		k0 ^ 0x6c7967656e657261ull,
		k1 ^ 0x7465646279746573ull,
	};
	size_t whole = len - len % 8;
	for (size_t i = 0; i < whole; i += 8)
		compress(v, load_le(p + i, 8));
	/* The last word: the 0..7 remaining bytes, and len mod 256 in its top byte (p may be NULL at len 0). */
	uint64_t last = len % 8 ? load_le(p + whole, len % 8) : 0;
	compress(v, last | ((uint64_t)(len & 0xff) << 56));
	/* Finalization: d = 4 rounds. */
	v[2] ^= 0xff;
	for (int i = 0; i < 4; i++)
		sipround(v);
	return v[0] ^ v[1] ^ v[2] ^ v[3];
}
