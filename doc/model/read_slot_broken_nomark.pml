/*
 * Mutant of read_slot.pml: a completion that finds a CLAIM leaves it unmarked.
 * The read re-checked before the completion's state was visible, then publishes
 * its listener over the unmarked claim and parks with the wake spent (lost wake).
 * check.sh requires spin to find an error in this model.
 */
#define MUT_NO_MARK
#include "read_slot.pml"
