/*
 * Mutant of flush_arm.pml: no re-check of closed after the arm (step 4b).
 * A close that ran between step 3 and the arm found nothing armed; the send
 * then reaches a closed connection, the loop drops it, and the flush is never
 * signalled.
 * check.sh requires spin to find an error in this model.
 */
#define MUT_SKIP_RECHECK
#include "flush_arm.pml"
