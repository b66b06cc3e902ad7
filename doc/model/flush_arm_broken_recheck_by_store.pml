/*
 * Mutant of flush_arm.pml: the re-check (step 4b) takes its arm back with a plain
 * store instead of an exchange, so it cannot tell whether the close already
 * disarmed it: the flush returns -EPIPE and is also signalled by the close.
 * check.sh requires spin to find an error in this model.
 */
#define MUT_RECHECK_BY_STORE
#include "flush_arm.pml"
