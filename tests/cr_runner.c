/* cr_runner — linked into every Criterion suite: LeakSanitizer checks each test's process, not
 * Criterion's own runner. The runner's event thread sometimes still holds a message buffer when
 * the runner exits (48 bytes from inside libcriterion), and LeakSanitizer's exit-time report then
 * ends the runner before it flushes its TAP output, which loses the last tests' results. The
 * tests run in processes forked from the runner after PRE_ALL, so they see another pid and keep
 * their leak checks. Without a sanitizer the hook is never called. */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <unistd.h>

static pid_t s_runner;

ReportHook(PRE_ALL)(struct criterion_test_set *tests)
{
    (void)tests;
    s_runner = getpid();
}

/* LeakSanitizer's hook: nonzero turns the exit-time leak check off for this process. */
int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void) { return s_runner != 0 && getpid() == s_runner; }
