/* perch.h: umbrella header for perch, lock-free async I/O primitives for Linux. */
#ifndef PERCH_H
#define PERCH_H

#include <perch/common.h>
#include <perch/vtask.h>
#include <perch/conn.h>
#include <perch/loop.h>
#include <perch/sock.h>
#include <perch/pipe.h>
#include <perch/segs.h>
#include <perch/timer.h>
#include <perch/server.h>
#include <perch/tls.h>

#endif /* PERCH_H */
