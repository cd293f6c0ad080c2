/* dtn_capture — what the other dtensor modules tell the capture being recorded (dt_capture.c). */
#ifndef DTN_CAPTURE_H
#define DTN_CAPTURE_H

#include "dtorch.h"

/* An op of the capture being recorded writes t in place: when t is one of the capture's inputs,
 * every replay writes its own input there, which must then be treated as written too. */
void dtn_capture_wrote(const dt_tensor *t);

#endif
