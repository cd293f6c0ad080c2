/* When the controller judges a worker silent (act_controller_silent_at): the declared bound after
 * the worker was last heard, to the time the check computes, not a tick of the controller's loop
 * later; a worker process of this host not heard from yet is judged from when it was started; and
 * what nothing watches this way (worker threads, a remote worker before its hello, a device already
 * dead or that said bye) never is. */
#include <criterion/criterion.h>
#include <math.h>

#include "act_controller.h"

static act_runtime s_rt = {.silent_s = 3.0};

Test(liveness, the_bound_is_the_time_of_the_check)
{
    /* a worker on another host, heard last at 100 s: silent at 103 s exactly */
    act_device remote = {.remote = true, .hello = true, .heard_at = 100.0, .state = ACT_DEV_READY};
    cr_expect_eq(act_controller_silent_at(&s_rt, &remote), 103.0);
    remote.heard_at = 100.25;
    cr_expect_eq(act_controller_silent_at(&s_rt, &remote), 103.25, "each word it says moves the bound");
    remote.hello = false;
    cr_expect(isinf(act_controller_silent_at(&s_rt, &remote)), "before its hello, a remote worker may take long");

    /* a worker process of this host: from when it was started until it is heard (its heartbeat starts
     * before its hello), from its last word after */
    act_device local = {.pid = 4242, .started_at = 50.0, .state = ACT_DEV_STARTING};
    cr_expect_eq(act_controller_silent_at(&s_rt, &local), 53.0);
    local.heard_at = 51.5;
    cr_expect_eq(act_controller_silent_at(&s_rt, &local), 54.5, "heard before its hello");
    local.hello = true;
    local.state = ACT_DEV_READY;
    local.heard_at = 60.0;
    cr_expect_eq(act_controller_silent_at(&s_rt, &local), 63.0);

    act_runtime quick = {.silent_s = 0.5};
    cr_expect_eq(act_controller_silent_at(&quick, &local), 60.5, "DTORCH_SILENT_TIMEOUT sets the bound");
}

Test(liveness, what_is_not_watched_for_silence)
{
    act_device thread = {.has_thread = true, .hello = true, .heard_at = 10.0, .state = ACT_DEV_READY};
    cr_expect(isinf(act_controller_silent_at(&s_rt, &thread)), "a thread's progress is judged otherwise");
    act_device dead = {.pid = 7, .hello = true, .heard_at = 10.0, .state = ACT_DEV_DEAD};
    cr_expect(isinf(act_controller_silent_at(&s_rt, &dead)));
    act_device bye = {.pid = 7, .hello = true, .heard_at = 10.0, .state = ACT_DEV_READY, .bye = true};
    cr_expect(isinf(act_controller_silent_at(&s_rt, &bye)), "it said bye: its leaving is no silence");
}
