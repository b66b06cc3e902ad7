/* examples/resp/siphash.h: SipHash-2-4, a keyed 64-bit hash (a PRF) for tables whose keys an attacker chooses. */
#ifndef PERCH_EXAMPLES_SIPHASH_H
#define PERCH_EXAMPLES_SIPHASH_H

#include <stddef.h>
#include <stdint.h>

/* The 128-bit secret; without it an attacker cannot choose keys that collide. */
struct siphash_key {
	uint8_t b[16];
};

/*
 * SipHash-2-4 of msg[0..len) under key, as Aumasson and Bernstein specify it
 * ("SipHash: a fast short-input PRF", 2012): the key and message read as
 * little-endian 64-bit words, 2 compression rounds a word, 4 finalization
 * rounds. The result is the 64-bit value (the paper's output bytes are its
 * little-endian encoding). Never reads past len; msg may be NULL when len is 0.
 */
uint64_t siphash24(const struct siphash_key *key, const void *msg, size_t len);

#endif /* PERCH_EXAMPLES_SIPHASH_H */
