/* tests/test_resp_store.c: the RESP store's keyed hash: SipHash-2-4's reference vectors, its key from getrandom, and chains an attacker cannot grow. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/types.h>

#include "cmocka_prelude.h"

#include "../examples/resp/resp_store.h"
#include "../examples/resp/siphash.h"

/* ---- getrandom, wrapped: the test may choose the bytes or the error ---- */

ssize_t __real_getrandom(void *buf, size_t len, unsigned flags);

static int getrandom_fails;                      /* an errno to fail with, 0: none */
static int getrandom_failures;                   /* how many calls fail with it; -1: all */
static const struct siphash_key *getrandom_gives; /* NULL: the kernel's bytes */
static int getrandom_calls;

ssize_t __wrap_getrandom(void *buf, size_t len, unsigned flags)
{
	getrandom_calls++;
	if (getrandom_fails && getrandom_failures != 0) {
		if (getrandom_failures > 0)
			getrandom_failures--;
		errno = getrandom_fails;
		return -1;
	}
	if (getrandom_gives) {
		size_t n = len < sizeof(getrandom_gives->b) ? len : sizeof(getrandom_gives->b);
		memcpy(buf, getrandom_gives->b, n);
		return (ssize_t)n;
	}
	return __real_getrandom(buf, len, flags);
}

static int reset_wrap(void **state)
{
	getrandom_fails = 0;
	getrandom_failures = -1;
	getrandom_gives = NULL;
	getrandom_calls = 0;
	return 0;
}

/* ---- SipHash-2-4 ---- */

/* The key of the paper's examples: bytes 00 01 .. 0f. */
static struct siphash_key reference_key(void)
{
	struct siphash_key k;
	for (int i = 0; i < 16; i++)
		k.b[i] = (uint8_t)i;
	return k;
}

/*
 * SipHash-2-4 under key 00..0f of the messages 00 01 .. (len-1), len 0..63, each
 * output as its 8 little-endian bytes: the reference vectors that come with the
 * authors' reference implementation (vectors_sip64). Entry 15 is the paper's
 * worked example (appendix A): a129ca6149be45e5.
 */
static const uint8_t vectors[64][8] = {
	{ 0x31, 0x0e, 0x0e, 0xdd, 0x47, 0xdb, 0x6f, 0x72 }, { 0xfd, 0x67, 0xdc, 0x93, 0xc5, 0x39, 0xf8, 0x74 },
	{ 0x5a, 0x4f, 0xa9, 0xd9, 0x09, 0x80, 0x6c, 0x0d }, { 0x2d, 0x7e, 0xfb, 0xd7, 0x96, 0x66, 0x67, 0x85 },
	{ 0xb7, 0x87, 0x71, 0x27, 0xe0, 0x94, 0x27, 0xcf }, { 0x8d, 0xa6, 0x99, 0xcd, 0x64, 0x55, 0x76, 0x18 },
	{ 0xce, 0xe3, 0xfe, 0x58, 0x6e, 0x46, 0xc9, 0xcb }, { 0x37, 0xd1, 0x01, 0x8b, 0xf5, 0x00, 0x02, 0xab },
	{ 0x62, 0x24, 0x93, 0x9a, 0x79, 0xf5, 0xf5, 0x93 }, { 0xb0, 0xe4, 0xa9, 0x0b, 0xdf, 0x82, 0x00, 0x9e },
	{ 0xf3, 0xb9, 0xdd, 0x94, 0xc5, 0xbb, 0x5d, 0x7a }, { 0xa7, 0xad, 0x6b, 0x22, 0x46, 0x2f, 0xb3, 0xf4 },
	{ 0xfb, 0xe5, 0x0e, 0x86, 0xbc, 0x8f, 0x1e, 0x75 }, { 0x90, 0x3d, 0x84, 0xc0, 0x27, 0x56, 0xea, 0x14 },
	{ 0xee, 0xf2, 0x7a, 0x8e, 0x90, 0xca, 0x23, 0xf7 }, { 0xe5, 0x45, 0xbe, 0x49, 0x61, 0xca, 0x29, 0xa1 },
	{ 0xdb, 0x9b, 0xc2, 0x57, 0x7f, 0xcc, 0x2a, 0x3f }, { 0x94, 0x47, 0xbe, 0x2c, 0xf5, 0xe9, 0x9a, 0x69 },
	{ 0x9c, 0xd3, 0x8d, 0x96, 0xf0, 0xb3, 0xc1, 0x4b }, { 0xbd, 0x61, 0x79, 0xa7, 0x1d, 0xc9, 0x6d, 0xbb },
	{ 0x98, 0xee, 0xa2, 0x1a, 0xf2, 0x5c, 0xd6, 0xbe }, { 0xc7, 0x67, 0x3b, 0x2e, 0xb0, 0xcb, 0xf2, 0xd0 },
	{ 0x88, 0x3e, 0xa3, 0xe3, 0x95, 0x67, 0x53, 0x93 }, { 0xc8, 0xce, 0x5c, 0xcd, 0x8c, 0x03, 0x0c, 0xa8 },
	{ 0x94, 0xaf, 0x49, 0xf6, 0xc6, 0x50, 0xad, 0xb8 }, { 0xea, 0xb8, 0x85, 0x8a, 0xde, 0x92, 0xe1, 0xbc },
	{ 0xf3, 0x15, 0xbb, 0x5b, 0xb8, 0x35, 0xd8, 0x17 }, { 0xad, 0xcf, 0x6b, 0x07, 0x63, 0x61, 0x2e, 0x2f },
	{ 0xa5, 0xc9, 0x1d, 0xa7, 0xac, 0xaa, 0x4d, 0xde }, { 0x71, 0x65, 0x95, 0x87, 0x66, 0x50, 0xa2, 0xa6 },
	{ 0x28, 0xef, 0x49, 0x5c, 0x53, 0xa3, 0x87, 0xad }, { 0x42, 0xc3, 0x41, 0xd8, 0xfa, 0x92, 0xd8, 0x32 },
	{ 0xce, 0x7c, 0xf2, 0x72, 0x2f, 0x51, 0x27, 0x71 }, { 0xe3, 0x78, 0x59, 0xf9, 0x46, 0x23, 0xf3, 0xa7 },
	{ 0x38, 0x12, 0x05, 0xbb, 0x1a, 0xb0, 0xe0, 0x12 }, { 0xae, 0x97, 0xa1, 0x0f, 0xd4, 0x34, 0xe0, 0x15 },
	{ 0xb4, 0xa3, 0x15, 0x08, 0xbe, 0xff, 0x4d, 0x31 }, { 0x81, 0x39, 0x62, 0x29, 0xf0, 0x90, 0x79, 0x02 },
	{ 0x4d, 0x0c, 0xf4, 0x9e, 0xe5, 0xd4, 0xdc, 0xca }, { 0x5c, 0x73, 0x33, 0x6a, 0x76, 0xd8, 0xbf, 0x9a },
	{ 0xd0, 0xa7, 0x04, 0x53, 0x6b, 0xa9, 0x3e, 0x0e }, { 0x92, 0x59, 0x58, 0xfc, 0xd6, 0x42, 0x0c, 0xad },
	{ 0xa9, 0x15, 0xc2, 0x9b, 0xc8, 0x06, 0x73, 0x18 }, { 0x95, 0x2b, 0x79, 0xf3, 0xbc, 0x0a, 0xa6, 0xd4 },
	{ 0xf2, 0x1d, 0xf2, 0xe4, 0x1d, 0x45, 0x35, 0xf9 }, { 0x87, 0x57, 0x75, 0x19, 0x04, 0x8f, 0x53, 0xa9 },
	{ 0x10, 0xa5, 0x6c, 0xf5, 0xdf, 0xcd, 0x9a, 0xdb }, { 0xeb, 0x75, 0x09, 0x5c, 0xcd, 0x98, 0x6c, 0xd0 },
	{ 0x51, 0xa9, 0xcb, 0x9e, 0xcb, 0xa3, 0x12, 0xe6 }, { 0x96, 0xaf, 0xad, 0xfc, 0x2c, 0xe6, 0x66, 0xc7 },
	{ 0x72, 0xfe, 0x52, 0x97, 0x5a, 0x43, 0x64, 0xee }, { 0x5a, 0x16, 0x45, 0xb2, 0x76, 0xd5, 0x92, 0xa1 },
	{ 0xb2, 0x74, 0xcb, 0x8e, 0xbf, 0x87, 0x87, 0x0a }, { 0x6f, 0x9b, 0xb4, 0x20, 0x3d, 0xe7, 0xb3, 0x81 },
	{ 0xea, 0xec, 0xb2, 0xa3, 0x0b, 0x22, 0xa8, 0x7f }, { 0x99, 0x24, 0xa4, 0x3c, 0xc1, 0x31, 0x57, 0x24 },
	{ 0xbd, 0x83, 0x8d, 0x3a, 0xaf, 0xbf, 0x8d, 0xb7 }, { 0x0b, 0x1a, 0x2a, 0x32, 0x65, 0xd5, 0x1a, 0xea },
	{ 0x13, 0x50, 0x79, 0xa3, 0x23, 0x1c, 0xe6, 0x60 }, { 0x93, 0x2b, 0x28, 0x46, 0xe4, 0xd7, 0x06, 0x66 },
	{ 0xe1, 0x91, 0x5f, 0x5c, 0xb1, 0xec, 0xa4, 0x6c }, { 0xf3, 0x25, 0x96, 0x5c, 0xa1, 0x6d, 0x62, 0x9f },
	{ 0x57, 0x5f, 0xf2, 0x8e, 0x60, 0x38, 0x1b, 0xe5 }, { 0x72, 0x45, 0x06, 0xeb, 0x4c, 0x32, 0x8a, 0x95 },
};

static void siphash_matches_the_reference_vectors(void **state)
{
	struct siphash_key k = reference_key();
	uint8_t msg[64];
	for (int i = 0; i < 64; i++)
		msg[i] = (uint8_t)i;
	for (size_t len = 0; len < 64; len++) {
		uint64_t want = 0;
		for (int b = 0; b < 8; b++)
			want |= (uint64_t)vectors[len][b] << (8 * b);
		if (siphash24(&k, msg, len) != want)
			fail_msg("SipHash-2-4 of %zu bytes: got %016llx, want %016llx", len,
				 (unsigned long long)siphash24(&k, msg, len), (unsigned long long)want);
	}
	/* The paper's worked example, as the paper prints it; and the empty message without a buffer. */
	assert_true(siphash24(&k, msg, 15) == 0xa129ca6149be45e5ull);
	assert_true(siphash24(&k, NULL, 0) == 0x726fdb47dd0e0e31ull);
}

/* ---- the store's key ---- */

static void store_new_reports_a_failed_getrandom(void **state)
{
	struct resp_store *s = (struct resp_store *)&s; /* must stay untouched */
	struct resp_store *before = s;
	getrandom_fails = ENOSYS;
	assert_int_equal(resp_store_new(&s), -ENOSYS);
	assert_ptr_equal(s, before);
	getrandom_fails = EAGAIN;
	assert_int_equal(resp_store_new(&s), -EAGAIN);
	assert_ptr_equal(s, before);
}

static void store_new_retries_an_interrupted_getrandom(void **state)
{
	struct resp_store *s;
	getrandom_fails = EINTR;
	getrandom_failures = 1;
	assert_int_equal(resp_store_new(&s), 0);
	assert_int_equal(getrandom_calls, 2);
	resp_store_free(s);
}

/* Keys that share the low `bits` bits of SipHash-2-4 under key k, each "c:<n>". */
static char (*keys_colliding_under(const struct siphash_key *k, unsigned bits, size_t want))[16]
{
	char (*keys)[16] = calloc(want, sizeof(*keys));
	assert_non_null(keys);
	uint64_t mask = (1ull << bits) - 1;
	size_t got = 0;
	for (unsigned long n = 0; got < want; n++) {
		char b[16];
		int len = snprintf(b, sizeof(b), "c:%lu", n);
		if ((siphash24(k, b, (size_t)len) & mask) == 0)
			memcpy(keys[got++], b, sizeof(b));
	}
	return keys;
}

/*
 * Keys built to share one bucket under a key the test knows do share it when
 * the store's key is that one (getrandom gave it), and spread under a key of
 * the store's own: the hash is keyed by what getrandom gave, nothing else.
 */
static void store_hashes_under_the_key_getrandom_gave(void **state)
{
	const size_t n = 100; /* below the 1,024 first buckets: the table does not grow */
	static const struct siphash_key chosen = { { 0x5e, 0xc2, 0xe7, 0x01, 0x99, 0x42, 0x10, 0xab,
						     0x3c, 0x77, 0xd0, 0x0d, 0x61, 0xf4, 0x28, 0x85 } };
	char(*keys)[16] = keys_colliding_under(&chosen, 10, n);
	struct resp_store *known, *secret;
	getrandom_gives = &chosen;
	assert_int_equal(resp_store_new(&known), 0);
	getrandom_gives = NULL;
	assert_int_equal(resp_store_new(&secret), 0);
	for (size_t i = 0; i < n; i++) {
		size_t len = strlen(keys[i]);
		assert_int_equal(resp_store_set(known, keys[i], len, "v", 1), 0);
		assert_int_equal(resp_store_set(secret, keys[i], len, "v", 1), 0);
	}
	assert_int_equal(resp_store_longest_chain(known), n);
	/* 100 keys in 1,024 buckets at random: 7 in one bucket has odds near 1e-8. */
	assert_true(resp_store_longest_chain(secret) <= 6);
	resp_store_free(known);
	resp_store_free(secret);
	free(keys);
}

/* ---- hash flooding ---- */

/* The store's old hash: FNV-1a, unkeyed. */
static uint64_t fnv1a(const char *k, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (unsigned char)k[i]) * 1099511628211ull;
	return h;
}

#define FLOOD_BITS 20                 /* the low bits the keys share: every bucket index the table reaches */
#define FLOOD_LEVELS 14               /* 2^14 keys */
#define FLOOD_BLOCK 3                 /* bytes a level adds */
#define FLOOD_KEY_LEN (FLOOD_LEVELS * FLOOD_BLOCK)

/*
 * FNV-1a's low n bits after a byte depend only on the low n bits before it
 * (xor and multiply carry upward only). So two 3-byte blocks that take one
 * low-20-bit state to the same next state are interchangeable, and 14 such
 * pairs, one after the other, give 2^14 keys of one low-20-bit hash: the
 * attack of issue #20. Each pair is found by a birthday search over blocks.
 */
static void find_colliding_blocks(uint32_t from, char a[FLOOD_BLOCK], char b[FLOOD_BLOCK], uint32_t *to)
{
	const uint32_t mask = (1u << FLOOD_BITS) - 1;
	uint32_t *seen = malloc(sizeof(uint32_t) << FLOOD_BITS); /* state -> block number + 1 */
	assert_non_null(seen);
	memset(seen, 0, sizeof(uint32_t) << FLOOD_BITS);
	for (uint32_t n = 0; n < 64 * 64 * 64; n++) {
		char blk[FLOOD_BLOCK] = { (char)('0' + n % 64), (char)('0' + n / 64 % 64), (char)('0' + n / 4096) };
		uint64_t h = from;
		for (int i = 0; i < FLOOD_BLOCK; i++)
			h = (h ^ (unsigned char)blk[i]) * 1099511628211ull;
		uint32_t st = (uint32_t)h & mask;
		if (seen[st]) {
			uint32_t m = seen[st] - 1;
			char other[FLOOD_BLOCK] = { (char)('0' + m % 64), (char)('0' + m / 64 % 64), (char)('0' + m / 4096) };
			memcpy(a, other, FLOOD_BLOCK);
			memcpy(b, blk, FLOOD_BLOCK);
			*to = st;
			free(seen);
			return;
		}
		seen[st] = n + 1;
	}
	fail_msg("no colliding blocks from state %x", from);
}

/* Every key of the flood, back to back (FLOOD_KEY_LEN bytes each). */
static char *flood_keys(void)
{
	char pairs[FLOOD_LEVELS][2][FLOOD_BLOCK];
	uint32_t st = (uint32_t)1469598103934665603ull & ((1u << FLOOD_BITS) - 1);
	for (int l = 0; l < FLOOD_LEVELS; l++)
		find_colliding_blocks(st, pairs[l][0], pairs[l][1], &st);
	char *keys = malloc((size_t)FLOOD_KEY_LEN << FLOOD_LEVELS);
	assert_non_null(keys);
	for (size_t k = 0; k < (1u << FLOOD_LEVELS); k++)
		for (int l = 0; l < FLOOD_LEVELS; l++)
			memcpy(keys + k * FLOOD_KEY_LEN + l * FLOOD_BLOCK, pairs[l][(k >> l) & 1], FLOOD_BLOCK);
	return keys;
}

static void fnv1a_colliding_keys_spread_over_the_store(void **state)
{
	const size_t n = 1u << FLOOD_LEVELS;
	char *keys = flood_keys();
	/* The attack is real: every key has the first key's low 20 bits under the old hash. */
	uint64_t low = fnv1a(keys, FLOOD_KEY_LEN) & ((1u << FLOOD_BITS) - 1);
	for (size_t i = 0; i < n; i++)
		assert_true((fnv1a(keys + i * FLOOD_KEY_LEN, FLOOD_KEY_LEN) & ((1u << FLOOD_BITS) - 1)) == low);
	assert_true(memcmp(keys, keys + (n - 1) * FLOOD_KEY_LEN, FLOOD_KEY_LEN) != 0);
	struct resp_store *s;
	assert_int_equal(resp_store_new(&s), 0);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(resp_store_set(s, keys + i * FLOOD_KEY_LEN, FLOOD_KEY_LEN, "v", 1), 0);
	assert_int_equal(resp_store_count(s), n);
	/*
	 * 16,384 keys over 16,384 or more buckets at random: the longest chain is
	 * about 7; 16 or more has odds below 1e-9. Unkeyed FNV-1a puts all 16,384 in one.
	 */
	size_t longest = resp_store_longest_chain(s);
	print_message("longest chain of %zu flooding keys: %zu\n", n, longest);
	assert_true(longest < 16);
	resp_store_free(s);
	free(keys);
}

/*
 * A value held by a send (resp_store_value_get, as a GET answered by
 * reference does) keeps its bytes through an overwrite of the same size
 * (which would otherwise reuse the memory in place) and a DEL; the store
 * answers the new value meanwhile, and the last put frees the old.
 */
static void a_value_held_by_a_send_outlives_its_overwrite_and_its_delete(void **state)
{
	struct resp_store *s;
	size_t n;
	assert_int_equal(resp_store_new(&s), 0);
	assert_int_equal(resp_store_set(s, "k", 1, "aaaa", 4), 0);
	const char *held = resp_store_get(s, "k", 1, &n);
	resp_store_value_get(held);
	assert_int_equal(resp_store_set(s, "k", 1, "bbbb", 4), 0);
	const char *now = resp_store_get(s, "k", 1, &n);
	assert_ptr_not_equal(now, held);
	assert_memory_equal(now, "bbbb", 4);
	assert_memory_equal(held, "aaaa", 4);
	assert_int_equal(resp_store_del(s, "k", 1), 1);
	assert_memory_equal(held, "aaaa", 4); /* ASan: still the send's */
	resp_store_value_put(held);           /* the last reference: freed (ASan: no leak) */
	/* Unshared, an overwrite that fits reuses the memory. */
	assert_int_equal(resp_store_set(s, "j", 1, "cccc", 4), 0);
	const char *first = resp_store_get(s, "j", 1, &n);
	assert_int_equal(resp_store_set(s, "j", 1, "dd", 2), 0);
	assert_ptr_equal(resp_store_get(s, "j", 1, &n), first);
	resp_store_value_put(NULL);
	resp_store_free(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(siphash_matches_the_reference_vectors, reset_wrap),
		cmocka_unit_test_setup(store_new_reports_a_failed_getrandom, reset_wrap),
		cmocka_unit_test_setup(store_new_retries_an_interrupted_getrandom, reset_wrap),
		cmocka_unit_test_setup(store_hashes_under_the_key_getrandom_gave, reset_wrap),
		cmocka_unit_test_setup(fnv1a_colliding_keys_spread_over_the_store, reset_wrap),
		cmocka_unit_test_setup(a_value_held_by_a_send_outlives_its_overwrite_and_its_delete, reset_wrap),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
