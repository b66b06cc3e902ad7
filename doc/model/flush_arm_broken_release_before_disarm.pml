/*
 * Mutant of flush_arm.pml: the completion releases flush_busy before it disarms.
 * A flush that takes the guard in that gap publishes its arm, and the old
 * completion disarms and signals the new flush's listener in the old one's place;
 * the old flush is never signalled.
 * check.sh requires spin to find an error in this model.
 */
#define MUT_RELEASE_BEFORE_DISARM
#include "flush_arm.pml"
