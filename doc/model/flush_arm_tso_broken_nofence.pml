/*
 * Mutant of flush_arm_tso.pml: step 4 publishes the arm with a store-release
 * and step 4b loads closed with no store->load fence between.  On x86 the load
 * can pass the store: the flush sees closed == 0, the close's exchange sees
 * flush_armed == 0, and when the loop drops the send to the closed connection
 * the flush is never signalled.  check.sh requires spin to find this.
 */
#define MUT_NO_FENCE
#include "flush_arm_tso.pml"
