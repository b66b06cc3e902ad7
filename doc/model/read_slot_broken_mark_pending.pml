/*
 * Mutant of read_slot.pml: when the publish CAS (step 4) fails on a mark, the
 * read returns PENDING as if parked.  The completion that marked has already
 * returned, so nothing ever delivers, and CLAIM_MARKED stays in the slot.
 * check.sh requires spin to find an error in this model.
 */
#define MUT_MARK_RETURNS_PENDING
#include "read_slot.pml"
