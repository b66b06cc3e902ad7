/*
 * Mutant of read_slot.pml, and perch's first version: a read that loses its
 * publish to a mark serves at once without clearing the mark and looking
 * again. A completion that loaded an earlier claim (served, given back) can
 * mark a later one, which is then served with nothing new.
 * check.sh requires spin to find an error in this model.
 */
#define MUT_STALE_MARK_SERVED
#include "read_slot.pml"
