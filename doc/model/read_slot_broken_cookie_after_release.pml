/*
 * Mutant of read_slot.pml: a completion that finds a listener CASes it straight
 * to EMPTY (no DELIVERING) and loads read_cookie only after that.  Once the slot
 * is EMPTY the reader can poll, claim and park again, storing the new park's
 * cookie; the completion then delivers the old park with the new park's cookie.
 * check.sh requires spin to find an error in this model.
 */
#define MUT_COOKIE_AFTER_RELEASE
#include "read_slot.pml"
