/*
 * Mutant of read_slot.pml: the re-check (step 2) serves the read synchronously
 * without taking the slot back.  The claim stays in the slot: the next read is
 * refused with -EBUSY although nobody reads, and the slot never returns to EMPTY.
 * check.sh requires spin to find an error in this model.
 */
#define MUT_RECHECK_KEEPS_SLOT
#include "read_slot.pml"
