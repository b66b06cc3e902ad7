/*
 * read_slot.pml with DESIGN.md's form of the completion: when its CAS on a
 * published listener fails, it loads the slot again instead of returning
 * (lib/conn.c returns).  A correct model: check.sh requires 0 errors, and
 * (@all-reached) that the retry branch runs in some interleaving.
 */
#define LISTENER_RETRY
#include "read_slot.pml"
