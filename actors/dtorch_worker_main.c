/* dtorch-worker — a device actor in its own process:
 *     dtorch-worker --connect ENDPOINT --device ID [--device-type TYPE] [--parent PID]
 * It connects to the controller at ENDPOINT (ipc:// or tcp://), serves device ID with the device
 * backend of TYPE (default cpu; one this build lacks is refused) until told bye, and leaves on
 * its own when the parent process PID is gone. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "act_runtime.h"
#include "act_worker.h"
#include "dt_error.h"

static pid_t s_parent;

static bool s_orphaned(void *arg) { return s_parent > 0 && getppid() != s_parent; }

static int s_usage(const char *why)
{
    fprintf(stderr,
            "dtorch-worker: %s\nusage: dtorch-worker --connect ENDPOINT --device ID [--device-type TYPE] [--parent PID]\n",
            why);
    return 2;
}

int main(int argc, char **argv)
{
    const char *endpoint = NULL, *device_type = "cpu";
    long long device = -1;
    for (int i = 1; i < argc; i++) {
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!value)
            return s_usage("missing value after an option");
        char *end;
        if (strcmp(argv[i], "--connect") == 0)
            endpoint = value;
        else if (strcmp(argv[i], "--device") == 0)
            device = strtoll(value, &end, 10);
        else if (strcmp(argv[i], "--device-type") == 0)
            device_type = value;
        else if (strcmp(argv[i], "--parent") == 0)
            s_parent = (pid_t)strtol(value, &end, 10);
        else
            return s_usage("unknown option");
        i++;
    }
    if (!endpoint || device < 0 || device > DT_MAX_DEVICE_ID)
        return s_usage("--connect and a valid --device are required");
    /* Ctrl-C in the user's terminal is for the controller to act on, not for its workers */
    signal(SIGINT, SIG_IGN);
    if (s_parent > 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != s_parent)
            return 1;
    }
    int rc = act_worker_run(endpoint, device, device_type, s_orphaned, NULL);
    if (rc != 0)
        fprintf(stderr, "dtorch-worker %lld: %s\n", device, dt_last_error());
    return rc == 0 ? 0 : 1;
}
