/*
 * Mutant of flush_arm_tso.pml: step 4 arms with a store-release instead of an
 * exchange.  On x86 4b's load of closed can pass the buffered arm: the flush
 * sees closed == 0, the close's exchange sees flush_armed == 0, and when the
 * loop drops the send to the closed connection the flush is never signalled.
 * check.sh requires spin to find an error in this model.
 */
#define MUT_ARM_BY_STORE
#include "flush_arm_tso.pml"
