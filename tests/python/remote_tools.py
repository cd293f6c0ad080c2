"""What the tests of workers on other hosts share: starting dtorch-worker processes, and a raw
ZeroMQ client (libzmq through ctypes) that speaks the wire by hand, to play a stranger."""
import ctypes
import ctypes.util
import os
import signal
import socket
import struct
import subprocess
import time

import dtorch

WORKER = os.environ.get("DTORCH_WORKER_PATH") or "dtorch-worker"


def start_worker(endpoint, devices, key=None, server_key=None, *, insecure=False, prefix=(), extra=()):
    """A dtorch-worker process serving ``devices`` ("cpu:0-1") for the controller at endpoint;
    ``prefix`` runs it inside something (``ip netns exec NAME``)."""
    argv = [*prefix, WORKER, "--connect", endpoint, "--devices", devices, *extra]
    if insecure:
        argv.append("--insecure")
    else:
        argv += ["--key", key, "--server-key", server_key]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop_all(procs):
    for p in procs:
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            p.kill()
        p.communicate()


def wait_exit(proc, timeout):
    """(exit status, seconds it took, stderr) of a process expected to leave by itself."""
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, timeout, ""
    return proc.returncode, time.monotonic() - t0, err


# ---- msgpack, the little the probes need (written from the msgpack spec) ----------------------

def pack(v):
    if v is None:
        return b"\xc0"
    if isinstance(v, bool):
        return b"\xc3" if v else b"\xc2"
    if isinstance(v, int):
        if 0 <= v < 128:
            return bytes([v])
        if v >= 0:
            return b"\xcf" + struct.pack(">Q", v)
        if v >= -32:
            return struct.pack("b", v)
        return b"\xd3" + struct.pack(">q", v)
    if isinstance(v, str):
        b = v.encode()
        return (bytes([0xa0 | len(b)]) if len(b) < 32 else b"\xd9" + bytes([len(b)])) + b
    if isinstance(v, (list, tuple)):
        assert len(v) < 16
        return bytes([0x90 | len(v)]) + b"".join(pack(x) for x in v)
    raise TypeError(v)


VERSION = 2                 # MB_VERSION (mailbox/mb_codec.h)
HELLO, PEER = 1, 5          # message kinds (mailbox/mb_codec.h)
CONTROLLER = 0xffffffff


def header(kind, seq, sender, count):
    return pack([VERSION, kind, seq, sender, count])


# ---- ZMTP 3.0 by hand: a peer that says what libzmq would never send ---------------------------

class RawZmtp:
    """A plaintext ZMTP 3.0 DEALER over a plain TCP socket (written from the ZMTP spec, rfc 23), so
    that it can announce a frame of any size without having its bytes."""

    def __init__(self, endpoint, rid):
        host, port = endpoint[len("tcp://"):].rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        # the greeting in the steps libzmq takes: the signature, then the rest once the other side's
        # signature came; then READY once its greeting is whole, and messages once its READY came
        self.sock.sendall(b"\xff" + bytes(8) + b"\x7f")
        self._read(10)
        self.sock.sendall(b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\x00" + bytes(31))
        self._read(54)
        props = b"".join(bytes([len(k)]) + k + struct.pack(">I", len(v)) + v
                         for k, v in ((b"Socket-Type", b"DEALER"), (b"Identity", rid.encode())))
        ready = b"\x05READY" + props
        self.sock.sendall(b"\x04" + bytes([len(ready)]) + ready)
        flags, size = self._read(2)
        assert flags == 4, "a READY command"
        self._read(size)

    def _read(self, n):
        got = b""
        while len(got) < n:
            chunk = self.sock.recv(n - len(got))
            assert chunk, "the other side closed the connection during the handshake"
            got += chunk
        return got

    def send(self, *frames):
        for i, f in enumerate(frames):
            more = 1 if i + 1 < len(frames) else 0
            self.sock.sendall(bytes([more | 2]) + struct.pack(">Q", len(f)) + f)

    def announce(self, size):
        """The header of a message's one frame of size bytes, and none of them."""
        self.sock.sendall(b"\x02" + struct.pack(">Q", size))

    def closed_by_peer(self, timeout):
        """Whether the other side closes the connection within timeout seconds (what it sends, its
        greeting and READY, is read and dropped)."""
        self.sock.settimeout(timeout)
        try:
            while self.sock.recv(65536):
                pass
        except socket.timeout:
            return False
        except ConnectionResetError:
            pass
        return True

    def close(self):
        self.sock.close()


# ---- a raw ZeroMQ DEALER --------------------------------------------------------------------

_zmq = ctypes.CDLL(ctypes.util.find_library("zmq") or "libzmq.so.5")
_zmq.zmq_ctx_new.restype = ctypes.c_void_p
_zmq.zmq_socket.restype = ctypes.c_void_p
_zmq.zmq_socket.argtypes = [ctypes.c_void_p, ctypes.c_int]
_zmq.zmq_setsockopt.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
_zmq.zmq_connect.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_zmq.zmq_send.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_zmq.zmq_close.argtypes = [ctypes.c_void_p]
_zmq.zmq_ctx_term.argtypes = [ctypes.c_void_p]
_zmq.zmq_curve_keypair.argtypes = [ctypes.c_char_p, ctypes.c_char_p]

_DEALER, _ROUTING_ID, _LINGER, _SNDTIMEO = 5, 5, 17, 28
_CURVE_PUBLICKEY, _CURVE_SECRETKEY, _CURVE_SERVERKEY = 48, 49, 50
_SNDMORE = 2


def curve_keypair():
    pub, sec = ctypes.create_string_buffer(41), ctypes.create_string_buffer(41)
    assert _zmq.zmq_curve_keypair(pub, sec) == 0
    return pub.value.decode(), sec.value.decode()


class Stranger:
    """A DEALER connected to endpoint as routing id ``rid``: plaintext, or CURVE with a key pair
    of its own (``keys``) against ``server_key``. It sends; whether anything arrives is for the
    other side to show."""

    def __init__(self, endpoint, rid, keys=None, server_key=None):
        self.ctx = _zmq.zmq_ctx_new()
        self.sock = _zmq.zmq_socket(self.ctx, _DEALER)
        self._opt(_ROUTING_ID, rid.encode())
        self._opt(_LINGER, struct.pack("i", 0))
        self._opt(_SNDTIMEO, struct.pack("i", 1000))
        if keys:
            self._opt(_CURVE_PUBLICKEY, keys[0].encode() + b"\0")
            self._opt(_CURVE_SECRETKEY, keys[1].encode() + b"\0")
            self._opt(_CURVE_SERVERKEY, server_key.encode() + b"\0")
        assert _zmq.zmq_connect(self.sock, endpoint.encode()) == 0

    def _opt(self, opt, value):
        buf = ctypes.create_string_buffer(value, len(value))
        assert _zmq.zmq_setsockopt(self.sock, opt, buf, len(value)) == 0

    def send(self, *frames):
        """True if libzmq took the message (it may still never reach anyone)."""
        ok = True
        for i, f in enumerate(frames):
            buf = ctypes.create_string_buffer(f, len(f))
            ok &= _zmq.zmq_send(self.sock, buf, len(f), _SNDMORE if i + 1 < len(frames) else 0) == len(f)
        return ok

    def close(self):
        _zmq.zmq_close(self.sock)
        _zmq.zmq_ctx_term(self.ctx)


def forged_hello(device, peer="tcp://127.0.0.1:1"):
    """A hello for device from a stranger (registry 0: a controller that reads it refuses it, which
    shows that it was read)."""
    body = pack([device, os.getpid(), 6, 0, "cpu", "stranger", peer])
    return header(HELLO, 0, device, 1), body


def forged_region(sender, transfer=987654321):
    """A failed region for a transfer nobody waits for: counted by a worker that reads it."""
    body = pack([transfer, -7, 0, [], "forged", 0, 0, [], -1, 0, 0, 0])
    return header(PEER, 0, sender, 1), body


def peer_messages_received(mesh):
    return [s["peer_messages_received"] for s in dtorch.device_stats(mesh)]
