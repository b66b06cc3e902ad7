/*
 * Mutant of read_slot.pml: on_parking() runs before the claim.  A read refused
 * with -EBUSY has then readied its listener (two reads through one adapter
 * would reset the value task the parked read's caller is waiting on).
 * check.sh requires spin to find an error in this model.
 */
#define MUT_READY_BEFORE_CLAIM
#include "read_slot.pml"
