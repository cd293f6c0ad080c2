"""Hosts with network stacks of their own on this machine: Linux network namespaces on a bridge.

The controller stays in this process's namespace at .1 of a /24 of its own; host k lives in a
namespace with one end of a veth pair (the other on the bridge) at .(k+1). Everything is named
after this process, made by the caller and removed by it (and by the next run, should this one die
before removing it). It needs root and iproute2.
"""
import os
import re
import shutil
import subprocess

IP = shutil.which("ip") or "/usr/sbin/ip"   # /usr/sbin may not be on a minimal PATH


def _ip(*args, check=True):
    return subprocess.run([IP, *args], capture_output=True, text=True, check=check)


class Hosts:
    def __init__(self, n):
        tag = os.getpid() % 100000
        self.subnet = f"10.231.{os.getpid() % 250}"
        self.bridge = f"dtbr{tag}"
        self.names = [f"dtorch-{tag}-h{k}" for k in range(n)]
        self.links = [f"dtv{tag}h{k}" for k in range(n)]
        self.controller = f"{self.subnet}.1"
        self.addresses = [f"{self.subnet}.{k + 2}" for k in range(n)]
        _cleanup_stale()
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.controller}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for name, link, addr in zip(self.names, self.links, self.addresses):
                _ip("netns", "add", name)
                _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", name)
                _ip("link", "set", link, "master", self.bridge, "up")
                self.run_in(name, IP, "addr", "add", f"{addr}/24", "dev", "eth0")
                self.run_in(name, IP, "link", "set", "eth0", "up")
                self.run_in(name, IP, "link", "set", "lo", "up")
        except BaseException:
            self.remove()
            raise

    def prefix(self, k):
        """What runs a command on host k."""
        return [IP, "netns", "exec", self.names[k]]

    def run_in(self, name, *argv):
        subprocess.run([IP, "netns", "exec", name, *argv], capture_output=True, text=True, check=True)

    def cut(self, k):
        """Takes host k off the network (its link to the bridge goes down)."""
        _ip("link", "set", self.links[k], "down")

    def mend(self, k):
        _ip("link", "set", self.links[k], "up")

    def remove(self):
        for name in self.names:
            _ip("netns", "del", name, check=False)
        for link in self.links:
            _ip("link", "del", link, check=False)
        _ip("link", "del", self.bridge, check=False)


def _cleanup_stale():
    """Namespaces and bridges of runs whose process is gone."""
    listed = _ip("netns", "list", check=False).stdout
    for m in re.finditer(r"^(dtorch-(\d+)-h\d+)", listed, re.M):
        if not _alive(int(m.group(2))):
            _ip("netns", "del", m.group(1), check=False)
    for m in re.finditer(r"^\d+: (dtbr(\d+))[:@]", _ip("link", "show", check=False).stdout, re.M):
        if not _alive(int(m.group(2))):
            _ip("link", "del", m.group(1), check=False)


def _alive(tag):
    """Whether a running process has this tag (its pid mod 100000): its namespaces are kept."""
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) % 100000 == tag:
            return True
    return False
