/*
 * Mutant of read_slot_tso.pml: a completion publishes its state with a plain
 * (release) store, then loads the slot.  On x86 the load can pass the store:
 * the completion sees EMPTY, the read's re-check does not yet see the state,
 * and the read parks with the wake spent (lost wake).
 * check.sh requires spin to find an error in this model.
 */
#define MUT_PUBLISH_BY_STORE
#include "read_slot_tso.pml"
