/*
 * Mutant of flush_arm.pml: complete_flush loads flush_cookie after it releases
 * the guard.  The writer's next flush takes the free guard and stores its own
 * cookie first; the old park's on_flush_done then carries the new park's
 * cookie (an adapter would complete the new flush's value task).
 * check.sh requires spin to find an error in this model.
 */
#define MUT_COOKIE_AFTER_GUARD
#include "flush_arm.pml"
