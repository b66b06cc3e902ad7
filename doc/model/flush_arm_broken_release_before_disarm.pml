/*
 * Mutant of flush_arm.pml: the completion releases flush_busy before it disarms.
 * A flush that takes the guard in that gap stores its cookie (and its listener)
 * and arms while the old park is still armed: the old completion then signals
 * the old park with the new flush's cookie, or disarms the new flush and
 * signals it in the old one's place, and the old flush is never signalled.
 * check.sh requires spin to find an error in this model.
 */
#define MUT_RELEASE_BEFORE_DISARM
#include "flush_arm.pml"
