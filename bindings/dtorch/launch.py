"""Starts one dtorch-worker per host over ssh, for a controller that listens (docs/LAUNCH.md).

    python -m dtorch.launch --hosts node1,node2 --devices-per-host 4 --connect tcp://10.0.0.1:5555 \\
        --key /home/me/.dtorch/worker.key --server-key KEY --worker /opt/venv/.../dtorch/dtorch-worker

Host k (counting from 0 in --hosts) serves the device ids k*n .. k*n+n-1. The launcher copies
nothing: the workers' key pair must already be on every host at the --key path, and
dtorch-worker at the --worker path. It prints each line the workers write prefixed with
``[host]``, exits when every ssh has, with status 1 when any failed, and on Ctrl-C or SIGTERM
terminates every ssh it started.
"""
import argparse
import os
import selectors
import shlex
import signal
import subprocess
import sys
import time

_GRACE_S = 5.0  # after SIGTERM, how long the ssh processes get before SIGKILL


def worker_commands(hosts, devices_per_host, connect, key, server_key, device_type="cpu", worker="dtorch-worker",
                    ssh="ssh", worker_args=()):
    """The argv of each host's ssh, in the order of ``hosts``: ``[*ssh, host, COMMAND]``, COMMAND
    being one string (every word of it quoted with shlex.quote) that runs ``worker --connect
    CONNECT --devices TYPE:a-b --key KEY --server-key SERVER_KEY [worker_args...]`` with a = k *
    devices_per_host and b = a + devices_per_host - 1 for host k. ``ssh``: a command line (split
    with shlex.split) or a list of words."""
    hosts = list(hosts)
    if not hosts:
        raise ValueError("worker_commands: no hosts")
    for host in hosts:
        if not isinstance(host, str) or not host or host.startswith("-") or any(c.isspace() for c in host):
            raise ValueError(f"worker_commands: {host!r} is not a host name")
    n = devices_per_host
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"worker_commands: devices_per_host must be an int >= 1, got {n!r}")
    if not isinstance(connect, str) or not connect.startswith("tcp://"):
        raise ValueError(f"worker_commands: connect must be tcp://HOST:PORT, got {connect!r}")
    ssh_words = shlex.split(ssh) if isinstance(ssh, str) else list(ssh)
    if not ssh_words:
        raise ValueError("worker_commands: empty ssh command")
    commands = []
    for k, host in enumerate(hosts):
        a = k * n
        words = [os.fspath(worker), "--connect", connect, "--devices", f"{device_type}:{a}-{a + n - 1}",
                 "--key", os.fspath(key), "--server-key", os.fspath(server_key), *worker_args]
        commands.append([*ssh_words, host, " ".join(shlex.quote(w) for w in words)])
    return commands


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m dtorch.launch",
        usage="%(prog)s --hosts H1,H2,... --devices-per-host N --connect tcp://HOST:PORT --key FILE "
              "--server-key KEY [--device-type TYPE] [--worker PATH] [--ssh COMMAND] [--dry-run] "
              "[-- WORKER_ARG...]",
        description="Starts dtorch-worker on every host over ssh, in parallel, for a controller started with "
                    "dtorch.init(listen=...). Host k of --hosts serves the device ids k*n .. k*n+n-1 "
                    "(n = --devices-per-host). Nothing is copied: the workers' key pair (FILE_secret, readable by "
                    "its owner only) must already be on each host at the --key path, and dtorch-worker at the "
                    "--worker path. "
                    "ssh must log in without asking anything (keys or an agent; -o BatchMode=yes). Every line "
                    "the workers write is printed prefixed with [host]; the launcher exits when every ssh has, "
                    "with status 1 when any failed. Ctrl-C or SIGTERM terminates every ssh; a worker whose ssh "
                    "ends keeps serving until the controller ends (within 3 s of it), unless --ssh has -tt.",
        epilog="Words after -- are passed to every dtorch-worker as they are (e.g. -- --silent-timeout 5).")
    p.add_argument("--hosts", required=True, help="comma-separated ssh destinations (host or user@host), in "
                   "device order")
    p.add_argument("--devices-per-host", required=True, type=int, metavar="N", help="device ids each host serves")
    p.add_argument("--connect", required=True, metavar="tcp://HOST:PORT",
                   help="where the controller listens, as the hosts reach it")
    p.add_argument("--key", required=True, metavar="FILE",
                   help="path ON EACH HOST of the workers' key pair (FILE_secret must be there; it is not copied)")
    p.add_argument("--server-key", required=True, metavar="KEY",
                   help="the controller's public key: its 40 characters (dtorch.controller_public_key()), or the "
                        "path on each host of its public key file")
    p.add_argument("--device-type", default="cpu", help="the device type the workers serve (default: cpu)")
    p.add_argument("--worker", default="dtorch-worker", metavar="PATH",
                   help="dtorch-worker on the hosts (default: dtorch-worker, found on the remote PATH); an absolute "
                        "path, since ~ and $VARS are quoted and not expanded")
    p.add_argument("--ssh", default="ssh", metavar="COMMAND",
                   help='the ssh command and its options (default: ssh), e.g. "ssh -o BatchMode=yes"')
    p.add_argument("--dry-run", action="store_true", help="print each host's command, one a line, and run nothing")
    return p


class _Stream:
    """One pipe of one ssh: its bytes, cut into lines, go to ``out`` prefixed with ``[host] ``."""

    def __init__(self, host, out):
        self.prefix, self.out, self.rest = f"[{host}] ".encode(), out, b""

    def feed(self, data):
        lines = (self.rest + data).split(b"\n")
        self.rest = lines.pop()
        for line in lines:
            self._write(line)

    def close(self):
        if self.rest:
            self._write(self.rest)
            self.rest = b""

    def _write(self, line):
        if line.endswith(b"\r"):
            line = line[:-1]  # ssh -tt writes CRLF
        self.out.write(self.prefix + line + b"\n")
        self.out.flush()


def _kill(procs, sig):
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)  # ssh and whatever it started here (its own session)
            except (ProcessLookupError, PermissionError):
                pass


def run(commands, hosts):
    """Runs ``commands`` (argvs, one per host) at once and relays their output; the exit status."""
    procs, sel = [], selectors.DefaultSelector()
    stopping = []  # the signals received

    def on_signal(signum, frame):
        stopping.append(signum)
        _kill(procs, signal.SIGTERM if len(stopping) == 1 else signal.SIGKILL)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for host, argv in zip(hosts, commands):
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, start_new_session=True)
            except OSError as e:
                sys.stderr.write(f"dtorch.launch: [{host}] cannot run {argv[0]}: {e}\n")
                _kill(procs, signal.SIGTERM)
                stopping.append(0)
                break
            procs.append(proc)
            sel.register(proc.stdout, selectors.EVENT_READ, _Stream(host, sys.stdout.buffer))
            sel.register(proc.stderr, selectors.EVENT_READ, _Stream(host, sys.stderr.buffer))
        deadline = None
        while sel.get_map():
            if stopping and deadline is None:
                deadline = time.monotonic() + _GRACE_S
            if deadline is not None and time.monotonic() > deadline:
                _kill(procs, signal.SIGKILL)
                if time.monotonic() > deadline + 1.0:
                    break  # a pipe still held open by something that left the group
            for key, _ in sel.select(timeout=0.2):
                data = os.read(key.fd, 65536)
                if data:
                    key.data.feed(data)
                else:
                    key.data.close()
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
        for key in list(sel.get_map().values()):
            key.data.close()
            sel.unregister(key.fileobj)
            key.fileobj.close()
        for proc in procs:
            try:
                proc.wait(timeout=_GRACE_S)
            except subprocess.TimeoutExpired:
                _kill([proc], signal.SIGKILL)
                proc.wait()
    finally:
        sel.close()
        for s, handler in old.items():
            signal.signal(s, handler)
    failed = 0
    for host, proc in zip(hosts, procs):
        code = proc.returncode
        if code != 0:
            failed += 1
            why = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
            sys.stderr.write(f"dtorch.launch: [{host}] {why}\n")
    sys.stderr.flush()
    if stopping and stopping[0]:
        return 128 + stopping[0]
    return 1 if failed or stopping or len(procs) < len(hosts) else 0


def main(argv=None):
    args = sys.argv[1:] if argv is None else list(argv)
    extra = []
    if "--" in args:
        at = args.index("--")
        args, extra = args[:at], args[at + 1:]
    parser = _parser()
    opts = parser.parse_args(args)
    hosts = [h.strip() for h in opts.hosts.split(",") if h.strip()]
    try:
        commands = worker_commands(hosts, opts.devices_per_host, opts.connect, opts.key, opts.server_key,
                                   device_type=opts.device_type, worker=opts.worker, ssh=opts.ssh,
                                   worker_args=extra)
    except ValueError as e:
        parser.error(str(e).replace("worker_commands: ", ""))
    if opts.dry_run:
        for argv in commands:
            print(shlex.join(argv))
        return 0
    return run(commands, hosts)


if __name__ == "__main__":
    sys.exit(main())
