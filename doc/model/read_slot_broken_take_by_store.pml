/*
 * Mutant of read_slot.pml: a completion that finds a listener takes it back with
 * a plain store of DELIVERING instead of a CAS, so two completions (bytes and
 * close) that both loaded the listener both deliver: on_recv_ready runs twice.
 * check.sh requires spin to find an error in this model.
 */
#define MUT_TAKE_BY_STORE
#include "read_slot.pml"
