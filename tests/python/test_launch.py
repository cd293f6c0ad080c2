"""python -m dtorch.launch: the ssh commands it builds, --dry-run, and real runs through a fake ssh
that runs the remote command string here (no network, no ssh)."""
import os
import shlex
import signal
import subprocess
import sys

import pytest

from conftest import PATIENCE_S
from dtorch.launch import worker_commands

# a controller key as dtorch prints them: Z85 holds characters a shell would act on
SERVER_KEY = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
CONNECT = "tcp://10.0.0.1:5555"


def _remote(worker, devices, key, server_key=SERVER_KEY, connect=CONNECT):
    return shlex.join([worker, "--connect", connect, "--devices", devices, "--key", key,
                       "--server-key", server_key])


def test_two_hosts():
    got = worker_commands(["node1", "node2"], 4, CONNECT, "/etc/dtorch/worker.key", SERVER_KEY)
    assert got == [
        ["ssh", "node1", "dtorch-worker --connect tcp://10.0.0.1:5555 --devices cpu:0-3 --key /etc/dtorch/worker.key "
                         "--server-key 'rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7'"],
        ["ssh", "node2", "dtorch-worker --connect tcp://10.0.0.1:5555 --devices cpu:4-7 --key /etc/dtorch/worker.key "
                         "--server-key 'rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7'"],
    ]


def test_three_hosts_options_and_a_key_path_with_a_space():
    key = "/home/me/my keys/worker.key"
    got = worker_commands(["a", "me@b", "c"], 2, CONNECT, key, "/etc/dtorch/ctl.key", device_type="cpu",
                          worker="/opt/dtorch/bin/dtorch-worker", ssh="ssh -o BatchMode=yes")
    remote = ("/opt/dtorch/bin/dtorch-worker --connect tcp://10.0.0.1:5555 --devices cpu:{} "
              "--key '/home/me/my keys/worker.key' --server-key /etc/dtorch/ctl.key")
    assert got == [
        ["ssh", "-o", "BatchMode=yes", "a", remote.format("0-1")],
        ["ssh", "-o", "BatchMode=yes", "me@b", remote.format("2-3")],
        ["ssh", "-o", "BatchMode=yes", "c", remote.format("4-5")],
    ]
    # the remote shell splits each command back into the words given
    assert shlex.split(got[1][-1]) == ["/opt/dtorch/bin/dtorch-worker", "--connect", CONNECT, "--devices", "cpu:2-3",
                                       "--key", key, "--server-key", "/etc/dtorch/ctl.key"]


def test_one_device_per_host_and_worker_args():
    got = worker_commands(["x", "y"], 1, CONNECT, "k", SERVER_KEY, worker_args=["--silent-timeout", "5"])
    assert [shlex.split(c[-1])[4] for c in got] == ["cpu:0-0", "cpu:1-1"]
    assert shlex.split(got[0][-1])[-2:] == ["--silent-timeout", "5"]


@pytest.mark.parametrize("bad", [dict(hosts=[]), dict(hosts=["-oProxyCommand=x"]), dict(devices_per_host=0),
                                 dict(connect="10.0.0.1:5555"), dict(ssh="")])
def test_rejects(bad):
    args = dict(hosts=["a"], devices_per_host=2, connect=CONNECT, key="k", server_key=SERVER_KEY)
    args.update(bad)
    with pytest.raises(ValueError):
        worker_commands(**args)


def _launch(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "dtorch.launch", *args], capture_output=True, text=True,
                          timeout=60, **kwargs)


def test_dry_run_prints_the_commands():
    key = "/home/me/my keys/worker.key"
    done = _launch("--hosts", "node1,node2", "--devices-per-host", "4", "--connect", CONNECT, "--key", key,
                   "--server-key", SERVER_KEY, "--ssh", "ssh -o BatchMode=yes", "--dry-run")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == [shlex.join(["ssh", "-o", "BatchMode=yes", host, _remote("dtorch-worker", devices, key)])
                     for host, devices in (("node1", "cpu:0-3"), ("node2", "cpu:4-7"))]


def test_bad_arguments_exit_2():
    done = _launch("--hosts", "a", "--devices-per-host", "0", "--connect", CONNECT, "--key", "k",
                   "--server-key", SERVER_KEY, "--dry-run")
    assert done.returncode == 2 and "devices_per_host" in done.stderr


def _script(path, text):
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def fake(tmp_path):
    """A fake ssh (it drops the host and runs the command string with sh -c here) and a fake worker
    that prints its arguments, one a line, and exits 3 when it serves cpu:2-3."""
    ssh = _script(tmp_path / "fake-ssh", 'shift\nexec sh -c "$1"\n')
    worker = _script(tmp_path / "fake worker", 'for a in "$@"; do echo "arg:$a"; done\n'
                     'echo "to stderr" >&2\n'
                     'case "$*" in *cpu:2-3*) exit 3;; esac\n')
    return ssh, worker


def test_runs_every_host(fake, tmp_path):
    ssh, worker = fake
    key = str(tmp_path / "my keys" / "worker.key")
    done = _launch("--hosts", "h0,h1", "--devices-per-host", "3", "--connect", CONNECT, "--key", key,
                   "--server-key", SERVER_KEY, "--ssh", ssh, "--worker", worker)
    assert done.returncode == 0, done.stdout + done.stderr
    for host, devices in (("h0", "cpu:0-2"), ("h1", "cpu:3-5")):
        lines = [l[len(host) + 3:] for l in done.stdout.splitlines() if l.startswith(f"[{host}] ")]
        assert lines == [f"arg:{a}" for a in ("--connect", CONNECT, "--devices", devices, "--key", key,
                                              "--server-key", SERVER_KEY)]
        assert f"[{host}] to stderr" in done.stderr.splitlines()
    assert all(l.startswith(("[h0] ", "[h1] ")) for l in done.stdout.splitlines())


def test_a_failing_host_fails_the_launch(fake):
    ssh, worker = fake
    done = _launch("--hosts", "h0,h1,h2", "--devices-per-host", "2", "--connect", CONNECT, "--key", "k",
                   "--server-key", SERVER_KEY, "--ssh", ssh, "--worker", worker)
    assert done.returncode != 0
    out = done.stdout.splitlines()
    assert "[h1] arg:cpu:2-3" in out and "[h0] arg:cpu:0-1" in out and "[h2] arg:cpu:4-5" in out
    assert all(l.startswith(("[h0] ", "[h1] ", "[h2] ")) for l in out)
    assert "dtorch.launch: [h1] exited with status 3" in done.stderr.splitlines()
    assert "[h0] exited" not in done.stderr and "[h2] exited" not in done.stderr


def test_sigterm_ends_every_ssh(tmp_path):
    ssh = _script(tmp_path / "fake-ssh", 'shift\nexec sh -c "$1"\n')
    worker = _script(tmp_path / "worker", 'echo ready\nexec sleep 600\n')
    proc = subprocess.Popen([sys.executable, "-m", "dtorch.launch", "--hosts", "h0,h1", "--devices-per-host", "1",
                             "--connect", CONNECT, "--key", "k", "--server-key", SERVER_KEY, "--ssh", ssh,
                             "--worker", worker], stdout=subprocess.PIPE, text=True)
    try:
        ready = set()
        while len(ready) < 2:
            line = proc.stdout.readline()
            assert line, "the launcher ended before its workers said ready"
            ready.add(line.split()[0])
        assert ready == {"[h0]", "[h1]"}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=PATIENCE_S) == 128 + signal.SIGTERM   # its workers would sleep 600 s: not waited for
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
