/*
 * Mutant of read_slot_tso.pml: the completion makes its state visible with a
 * plain store and then loads the slot, with no store->load fence between.
 * On x86 the load can pass the store: the completion sees EMPTY, the read's
 * re-check does not yet see the data, and the read parks with the wake spent.
 * check.sh requires spin to find this lost wake.
 */
#define MUT_NO_FENCE
#include "read_slot_tso.pml"
