/*
 * Mutant of flush_arm.pml: step 4 publishes flush_armed before it stores
 * flush_listener.  A completion between the two disarms and takes a NULL (or
 * stale) listener: the signal goes to nobody and the flush is lost.
 * check.sh requires spin to find an error in this model.
 */
#define MUT_LISTENER_AFTER_ARM
#include "flush_arm.pml"
